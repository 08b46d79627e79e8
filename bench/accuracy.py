"""Diagnosis accuracy: the confusion matrix over the labelled real-incident corpus and every
simulator scenario, false alarms on the healthy cases, and time-to-right-knob from attach.

    .venv/bin/python bench/accuracy.py [--markdown]

Rows are the true class (from how the incident was made), columns the top finding (the first one
above info; "quiet" when there is none). A case is *right* when the top finding, its severity and
its first suggestion's flag and direction are what the label says (``tests/fixtures/incidents``).
Time-to-right-knob: the diagnosis is re-run on the window from attach (the first scrape) to every
later scrape; the figure is the first time it is right, and "wrong first" counts the windows that
showed a different warning before that, "wrong again" the windows after it that were not right (a
flickering diagnosis). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.core.diagnosis import Budgets  # noqa: E402
from diagnostics.core.metrics.catalog import parse_snapshot  # noqa: E402
from diagnostics.core.metrics.derive import Scrape  # noqa: E402
from diagnostics.core.simulator.scenarios import SCENARIOS  # noqa: E402
from diagnostics.sim.driver import Simulation  # noqa: E402
from tests.fixtures.incidents.corpus import QUIET, Case, cases, judge, run, top  # noqa: E402

SIM_SECONDS = 60.0
SIM_CLASS = {"healthy": "healthy", "parallel_sampling": "healthy", "queue_at_cap": "queue_at_cap",
             "kv_pressure": "kv_pressure", "head_of_line": "head_of_line", "parallel_no_prefix": "sharing_off",
             "slow_decode": "slow_decode", "stall": "stall", "data_parallel": "healthy", "hung_rank": "hung_rank",
             "lora_deferred": "deferred", "admission_limit": "admission", "asleep": "asleep",
             "spec_decode_good": "healthy", "spec_decode_low": "spec_decode", "slow_rank": "slow_rank",
             "pinned_rank": "dp_skew"}


def sim_cases() -> list[Case]:
    out = []
    for name, scenario in SCENARIOS.items():
        scrapes = tuple(Scrape(ts, parse_snapshot(text)) for ts, text in Simulation(name).run_for(SIM_SECONDS))
        expect = {"top": scenario.knob} if scenario.knob else {"quiet": True}
        out.append(Case(f"sim:{name}", SIM_CLASS[name], expect, Budgets(itl_ms=scenario.itl_budget_ms), scrapes,
                        None))
    return out


def time_to_right(case: Case) -> tuple[float | None, int, int]:
    """Seconds from the first scrape until the diagnosis of the window so far is right; how many
    earlier windows showed a different warning; how many later windows were wrong again."""
    wrong = lost = 0
    first_right: float | None = None
    t0 = case.scrapes[0].ts
    for i in range(2, len(case.scrapes) + 1):
        findings = run(case, case.scrapes[:i])
        ok, _ = judge(findings, case.expect)
        if ok and first_right is None:
            first_right = case.scrapes[i - 1].ts - t0
        elif not ok and first_right is not None:
            lost += 1
        elif not ok and top(findings) is not None:
            wrong += 1
    return first_right, wrong, lost


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--markdown", action="store_true", help="print the matrix as a Markdown table")
    args = parser.parse_args()
    everything = list(cases()) + sim_cases()
    matrix: dict[str, Counter[str]] = defaultdict(Counter)
    right: dict[str, list[bool]] = defaultdict(list)
    failures = []
    ttr: dict[str, list[float]] = defaultdict(list)
    wrong_first: dict[str, int] = defaultdict(int)
    never: dict[str, int] = defaultdict(int)
    lost: dict[str, int] = defaultdict(int)
    for case in everything:
        findings = run(case)
        first = top(findings)
        ok, why = judge(findings, case.expect, len(case.scrapes))
        matrix[case.incident][first.id if first else QUIET] += 1
        right[case.incident].append(ok)
        if not ok:
            failures.append(f"{case.name}: {why}")
        if "/" not in case.name and not case.expect.get("quiet"):
            seconds, wrong, relapsed = time_to_right(case)
            lost[case.incident] += relapsed
            if seconds is None:
                never[case.incident] += 1
            else:
                ttr[case.incident].append(seconds)
            wrong_first[case.incident] += wrong
    classes = sorted(matrix)
    columns = sorted({c for row in matrix.values() for c in row}, key=lambda c: (c == QUIET, c))
    real = sum(1 for c in everything if not c.name.startswith("sim:"))
    print(f"{len(everything)} cases: {real} real recordings and windows, {len(everything) - real} simulator scenarios")
    if args.markdown:
        print("| true class \\ top finding | " + " | ".join(columns) + " | right |")
        print("|---" * (len(columns) + 2) + "|")
        for cls in classes:
            cells = [str(matrix[cls][c]) if matrix[cls][c] else "·" for c in columns]
            print(f"| {cls} | " + " | ".join(cells) + f" | {sum(right[cls])}/{len(right[cls])} |")
    else:
        width = max(len(c) for c in columns) + 1
        print(f"{'true class':>14} | " + "".join(f"{c[:width]:>{width}}" for c in columns) + " | right")
        for cls in classes:
            cells = "".join(f"{(matrix[cls][c] or '·')!s:>{width}}" for c in columns)
            print(f"{cls:>14} | {cells} | {sum(right[cls])}/{len(right[cls])}")
    healthy = [c for c in everything if c.expect.get("quiet")]
    alarms = sum(1 for c in healthy if top(run(c)) is not None)
    total_right = sum(sum(v) for v in right.values())
    print(f"\nright: {total_right}/{len(everything)}; false alarms on healthy cases: {alarms}/{len(healthy)}")
    print("\ntime to the right knob from attach (median s; windows that showed another warning first; windows "
          "wrong again after it was right; never right):")
    for cls in classes:
        if ttr[cls] or never[cls]:
            med = f"{statistics.median(ttr[cls]):.1f} s" if ttr[cls] else "-"
            print(f"  {cls:>14}: {med:>8}  wrong first {wrong_first[cls]:>3}  wrong again {lost[cls]:>3}  "
                  f"never {never[cls]}")
    if failures:
        print("\nwrong:")
        for line in failures:
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
