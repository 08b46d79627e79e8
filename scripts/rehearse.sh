#!/usr/bin/env bash
# CI rehearsal: N fresh clones of main, each running `.ci/run` as CI does, while a second process
# keeps one core busy (a flake that needs a busy machine shows up here, not in CI).
#   scripts/rehearse.sh            # one run, one core kept busy
#   scripts/rehearse.sh 3          # three runs
#   scripts/rehearse.sh --idle 3   # three runs on an otherwise idle machine
# Each clone is `git clone` of main's committed HEAD (uncommitted work is not rehearsed) into a
# temporary directory with `../shared` beside it (a link to $SHARED, default the shared/ folder
# beside this checkout's main repository), as CI lays it out. vLLM's venv (~/.cache/vllm-triage) is
# reused; each clone builds its own .venv from requirements*.txt (pip's cache makes that a minute
# or so). Logs and test artifacts stay in $REHEARSE_DIR (default a new folder under /tmp).
set -euo pipefail

idle=0
runs=1
for arg in "$@"; do
  case "$arg" in
    --idle) idle=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *[!0-9]*|'') echo "usage: $0 [--idle] [N]" >&2; exit 2 ;;
    *) runs=$arg ;;
  esac
done
[ "$runs" -ge 1 ] || { echo "N must be at least 1" >&2; exit 2; }

here=$(cd "$(dirname "$0")/.." && pwd)
repo=$(git -C "$here" rev-parse --path-format=absolute --git-common-dir)
shared=${SHARED:-$(dirname "$(dirname "$repo")")/shared}
[ -d "$shared" ] || { echo "no shared folder at $shared (set SHARED)" >&2; exit 2; }
out=${REHEARSE_DIR:-$(mktemp -d /tmp/rehearse.XXXXXX)}
mkdir -p "$out"
commit=$(git -C "$repo" rev-parse --short main)
echo "rehearsing main at $commit, $runs run(s), $([ $idle = 1 ] && echo "idle machine" || echo "one core kept busy"); logs in $out"

busy_pid=
stop_busy() {
  if [ -n "$busy_pid" ]; then
    kill "$busy_pid" 2>/dev/null || true
    wait "$busy_pid" 2>/dev/null || true
    busy_pid=
  fi
}
trap stop_busy EXIT
if [ "$idle" = 0 ]; then
  # One core busy for as long as the runs take, and never longer than 2 h should this script die.
  timeout 7200 bash -c 'while :; do :; done' &
  busy_pid=$!
fi

num_passed=0
num_failed=0
durations=()
for i in $(seq 1 "$runs"); do
  work=$(mktemp -d /tmp/rehearse-clone.XXXXXX)
  ln -s "$shared" "$work/shared"
  git clone --quiet --branch main "$repo" "$work/repo"
  log="$out/run-$i.log"
  started=$SECONDS
  set +e
  (cd "$work/repo" && CI=true ARTIFACTS_DIR="$out/run-$i-artifacts" bash .ci/run) >"$log" 2>&1
  code=$?
  set -e
  took=$((SECONDS - started))
  durations+=("$took")
  # pytest's last line, e.g. "==== 2 failed, 714 passed in 840.12s (0:14:00) ====".
  summary=$(grep -E '^=+ .*(passed|failed|error|no tests ran).* in [0-9.]+s' "$log" | tail -1 | sed -E 's/^=+ | =+$//g' || true)
  if [ "$code" = 0 ]; then
    num_passed=$((num_passed + 1))
    echo "run $i: passed in ${took} s (${summary:-no pytest summary})"
  else
    num_failed=$((num_failed + 1))
    echo "run $i: FAILED (exit $code) in ${took} s (${summary:-pytest did not finish: see $log})"
    # -ra puts one "FAILED id - reason" / "ERROR id - reason" line per problem in the summary.
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/  /' || tail -20 "$log" | sed 's/^/  | /'
  fi
  rm -rf "$work"
done
stop_busy

list=$(IFS=' '; echo "${durations[*]}")
echo "rehearsal: $runs run(s) of main at $commit, $num_passed passed, $num_failed failed; durations (s): $list"
[ "$num_failed" = 0 ]
