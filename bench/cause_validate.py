"""Causes against the real thing (issue 41): for each held-out alternative (tests/fixtures/incidents/
heldout/RECIPES.md 17-22 and 25-32), serve again twice with the same workload and seed as the recording — once
with the *usual* cause's knob changed (it must not help) and once with the *named* cause's knob
changed (it must help) — and compare the symptom's measure, fixed in the recipe before recording:
the requests answered 4xx, the mean queue time or TTFT or ITL, the preemptions, give-ups or 503s — each against a re-run with the recording's own
flags beside them (the control: the host's load moves it too). The diagnosis of the original recording
says which cause it names and which knob follows; this script only serves and measures. Prints a
table; asserts nothing. Recordings are kept (``--keep DIR``) and judged again without a server
(``--offline DIR``).

    flock /tmp/heavy.lock .venv/bin/python bench/cause_validate.py --keep bench/cause_runs/2026-12-07
    .venv/bin/python bench/cause_validate.py --offline bench/cause_runs/2026-12-07
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.core.diagnosis import diagnose, prepare  # noqa: E402
from diagnostics.core.diagnosis.outcomes import window_outcomes  # noqa: E402
from diagnostics.core.diagnosis.rules.common import mean_from  # noqa: E402
from diagnostics.core.diagnosis.types import Budgets  # noqa: E402
from diagnostics.core.metrics.derive import Scrape, histogram_delta  # noqa: E402
from diagnostics.recording import read_recording  # noqa: E402
from tests.fixtures.incidents.corpus import HELDOUT, labels  # noqa: E402
from tests.fixtures.incidents.record import HELDOUT_BY_NAME, record_case  # noqa: E402

# A change "helps" when the measure falls by at least this share; it "does not help" when it falls by less
# than NO_HELP_SHARE (the recipes: "no better"; "falls by half or more"; "4xx gone").
HELP_SHARE = 0.5
NO_HELP_SHARE = 0.3


def rejected(scrapes: list[Scrape]) -> float | None:
    """Requests answered 4xx. The recipes named their share, but the share moves with how many the served
    clients' closed loop got through (96 requests in the recording, 375 in an idle re-run): the count of
    refusals is what the change acts on."""
    return window_outcomes(scrapes, None).rejected


def _mean(concept: str) -> Callable[[list[Scrape]], float | None]:
    """The mean of one of the window's histograms (queue time, TTFT, ITL), over the whole run."""
    return lambda scrapes: mean_from(histogram_delta(scrapes, concept))


mean_queue_seconds = _mean("request_queue_time_seconds")
mean_ttft_seconds = _mean("time_to_first_token_seconds")
mean_itl_seconds = _mean("inter_token_latency_seconds")


def preemptions(scrapes: list[Scrape]) -> float | None:
    """Preemptions counted over the run (each run is a fresh server, so the counter starts at 0)."""
    seen = [v for s in scrapes if s.snapshot is not None and (v := s.snapshot.value("num_preemptions")) is not None]
    return seen[-1] - seen[0] if len(seen) >= 2 else None


def gave_up(scrapes: list[Scrape]) -> float | None:
    return window_outcomes(scrapes, None).gave_up


def shed(scrapes: list[Scrape]) -> float | None:
    return window_outcomes(scrapes, None).shed


@dataclass(frozen=True)
class Check:
    """One recipe's re-runs: the measure, the usual knob's flags and the named cause's."""

    case: str
    measure: str
    read: Callable[[list[Scrape]], float | None]
    usual: tuple[str, ...] | None  # None: the symptom's usual reading has no knob (a 5xx: read the log)
    # None: the cause has no knob (nothing to serve). alt_rejected_bad_param_wide is not here: its cause
    # has no knob and its model is already at its own 2,048-token maximum, so the usual knob cannot rise.
    cause: tuple[str, ...] | None


CHECKS = (
    Check("alt_rejected_model_name_h3", "4xx answers", rejected, ("--max-model-len", "2048"),
          ("--max-model-len", "1024", "--served-model-name", "tiny", "gpt-4o")),
    Check("alt_queue_token_budget_h8", "mean queue time (s)", mean_queue_seconds,
          ("--max-num-seqs", "16", "--max-num-batched-tokens", "32"),
          ("--max-num-seqs", "8", "--max-num-batched-tokens", "512")),
    Check("alt_queue_token_budget_wide", "mean queue time (s)", mean_queue_seconds,
          ("--max-num-seqs", "32", "--max-num-batched-tokens", "48"),
          ("--max-num-seqs", "16", "--max-num-batched-tokens", "1024")),
    # The third set (RECIPES.md 25-32).
    Check("alt_ttft_long_prompts_h3", "mean TTFT (s)", mean_ttft_seconds, ("--max-num-batched-tokens", "8192"), None),
    Check("alt_ttft_long_prompts_wide", "mean TTFT (s)", mean_ttft_seconds, ("--max-num-batched-tokens", "8192"),
          None),
    Check("alt_preempt_blocks_h8", "preemptions", preemptions,
          ("--num-gpu-blocks-override", "10", "--max-model-len", "1024", "--gpu-memory-utilization", "0.95"),
          ("--num-gpu-blocks-override", "40", "--max-model-len", "1024")),
    Check("alt_preempt_kvbytes_h3", "preemptions", preemptions,
          ("--kv-cache-memory-bytes", "1769472", "--max-model-len", "1024", "--gpu-memory-utilization", "0.95"),
          ("--kv-cache-memory-bytes", "7077888", "--max-model-len", "1024")),
    # The usual knob cannot be served here: vLLM refuses to start with "max_num_batched_tokens (16) must be
    # greater than or equal to max_num_seqs (512)" (SchedulerConfig), and with the flag unset it already ran
    # min(default, 16) = 16 seats. The refusal is the answer (heldout/RECIPES.md, amendment to 29).
    Check("alt_gave_up_token_budget_h3", "give-ups", gave_up, None, ("--max-num-batched-tokens", "2048")),
    Check("alt_slow_decode_one_wide", "mean ITL (s)", mean_itl_seconds, ("--max-num-seqs", "1"), None),
    Check("alt_failed_queued_reqs_wide", "503s shed", shed, None,
          ("--max-num-seqs", "32", "--max-num-queued-reqs", "64")),
    Check("alt_failed_queued_tokens_h3", "503s shed", shed, None,
          ("--max-num-seqs", "32", "--max-num-queued-tokens", "20000")),
)


def _scrapes(path: Path) -> list[Scrape]:
    return list(read_recording(str(path)).scrapes())


def named(case: str) -> tuple[str | None, str | None]:
    """The original recording's top finding's cause and first flag, as the diagnosis says them."""
    label = labels(HELDOUT)[case]
    rec = read_recording(str(HELDOUT / label["file"]))
    log = (HELDOUT / label["log"]).read_text() if label.get("log") else None
    budgets = Budgets(**label.get("budgets", {}))
    findings = [f for f in diagnose(prepare(list(rec.scrapes()), info=rec.info(), log_text=log, budgets=budgets))
                if f.severity != "info"]
    if not findings:
        return None, None
    first = findings[0]
    return first.evidence.get("cause"), first.suggestions[0].flag if first.suggestions else None


def serve(check: Check, keep: Path) -> None:
    case = HELDOUT_BY_NAME[check.case]
    seed = labels(HELDOUT)[check.case]["seed"]
    work = Path(tempfile.mkdtemp(prefix="causes-"))
    runs = json.loads((keep / "runs.json").read_text()) if (keep / "runs.json").exists() else {}
    # "same": the recording's own flags served again beside the changes, so a host busier or quieter than
    # when the incident was recorded moves the control too (the judgement is against it, not the recording).
    for variant, args in (("same", case.args), ("usual", check.usual), ("cause", check.cause)):
        if args is None:
            continue
        out = keep / f"{check.case}.{variant}.jsonl.gz"
        print(f"[{check.case}] {variant}: {' '.join(args)}", flush=True)
        facts = record_case(case, work, seed, out=out, args=args)
        runs[out.name] = {"case": check.case, "variant": variant, "args": list(args), "seed": seed,
                          "clients": {k: v for k, v in facts["clients"].items() if k != "durations_s"}}
        (keep / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")


def schedule(scrapes: list[Scrape]) -> str:
    """What the engine did, whatever the host's speed: its steps observed at one token or none of all observed
    (vLLM 0.32 observes only steps that emit a token: one request decoding, alone or beside prompt chunks),
    and the most requests running and waiting at a scrape."""
    steps = histogram_delta(scrapes, "iteration_tokens")
    snaps = [s.snapshot for s in scrapes if s.snapshot is not None]
    running = max((s.value("num_requests_running") or 0.0) for s in snaps) if snaps else 0.0
    waiting = max((s.value("num_requests_waiting") or 0.0) for s in snaps) if snaps else 0.0
    chunks = f"{steps.cumulative[0]:.0f}/{steps.count:.0f} steps" if steps is not None and steps.count else "no steps"
    return f"{chunks}, ≤ {running:.0f} running, ≤ {waiting:.0f} waiting"


def _fell(before: float | None, x: float | None) -> float | None:
    """The share the measure fell by from the unchanged re-run (negative: it rose)."""
    return None if x is None or before is None or before <= 0 else 1 - x / before


def _fmt(x: float | None) -> str:
    return "·" if x is None else f"{x:.3f}"


def report(keep: Path) -> None:
    print(f"{'case':30} {'measure':20} {'recorded':>9} {'same flags':>11} {'usual knob':>11} {'cause knob':>11}  "
          "named cause / flag                        usual no help   cause helps")
    recorded_cases = labels(HELDOUT)
    for check in CHECKS:
        label = recorded_cases.get(check.case)
        if label is None:
            print(f"{check.case:30} not recorded")
            continue
        recorded = check.read(_scrapes(HELDOUT / label["file"]))
        after = {v: check.read(_scrapes(p)) if (p := keep / f"{check.case}.{v}.jsonl.gz").exists() else None
                 for v in ("same", "usual", "cause")}
        cause, flag = named(check.case)
        base = after["same"]
        usual, helped = _fell(base, after["usual"]), _fell(base, after["cause"])
        no_help = "·" if usual is None else ("yes" if usual < NO_HELP_SHARE else "NO") + f" ({-usual * 100:+.0f} %)"
        helps = "·" if helped is None else ("yes" if helped >= HELP_SHARE else "NO") + f" ({-helped * 100:+.0f} %)"
        print(f"{check.case:30} {check.measure:20} {_fmt(recorded):>9} {_fmt(base):>11} {_fmt(after['usual']):>11} "
              f"{_fmt(after['cause']):>11}  {str(cause):16} {str(flag):24} {no_help:>14}  {helps}")
        if check.read in (mean_queue_seconds, gave_up, mean_itl_seconds):
            for variant in ("same", "usual", "cause"):
                if (path := keep / f"{check.case}.{variant}.jsonl.gz").exists():
                    print(f"{'':30} {variant:>6}: {schedule(_scrapes(path))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="held-out alternatives to serve again (default: all)")
    parser.add_argument("--keep", type=Path, help="serve the re-runs, keeping their recordings here")
    parser.add_argument("--offline", type=Path, help="judge the re-runs kept here (no server)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for check in CHECKS:
            if not args.cases or check.case in args.cases:
                serve(check, args.keep)
        report(args.keep)
        return 0
    if args.offline:
        report(args.offline)
        return 0
    parser.error("give --keep DIR or --offline DIR")
    return 2


if __name__ == "__main__":
    sys.exit(main())
