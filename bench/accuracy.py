"""Diagnosis accuracy, judged aspect by aspect, in separate tables for the real recordings the rules
were tuned on, the held-out recordings (``tests/fixtures/incidents/heldout``, when present) and the
simulator's scenarios; false alarms on the healthy cases; time to the right knob from attach.

    .venv/bin/python bench/accuracy.py [--markdown]

Every case is judged on its top finding (the first above info; "quiet" when none), that finding's
severity, its first suggestion's flag and direction, its named cause and the alternatives it rules out
(for labels that name them: issue 41's held-out alternatives), and the findings and advice its label forbids
(``tests/fixtures/incidents/corpus.py`` says how labels are written). Each column counts the cases
right out of those whose label judges that aspect; "right" needs every judged aspect.
Time to the right knob: the diagnosis is re-run on the window from attach (the first scrape) to every
later scrape; the figure is the first time it is right, "wrong first" counts the windows that showed
a different warning before that, "wrong again" the windows after it that were not right (a
flickering diagnosis). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.incidents.corpus import (  # noqa: E402
    HELDOUT,
    STARTUP,
    Case,
    Verdict,
    cases,
    judge,
    run,
    sim_cases,
    startup_cases,
    top,
)

ASPECTS = ("top", "severity", "knob", "forbidden", "cause", "alternatives")
HEADER = ("true class", "cases", "top finding", "severity", "first flag + direction", "nothing forbidden",
          "cause right", "alternatives ruled out", "right")


def time_to_right(case: Case) -> tuple[float | None, int, int]:
    """Seconds from the first scrape until the diagnosis of the window so far is right; how many
    earlier windows showed a different warning; how many later windows were wrong again."""
    wrong = lost = 0
    first_right: float | None = None
    t0 = case.scrapes[0].ts
    for i in range(2, len(case.scrapes) + 1):
        findings = run(case, case.scrapes[:i])
        ok = judge(findings, case.expect, i).ok
        if ok and first_right is None:
            first_right = case.scrapes[i - 1].ts - t0
        elif not ok and first_right is not None:
            lost += 1
        elif not ok and top(findings) is not None:
            wrong += 1
    return first_right, wrong, lost


def _cell(verdicts: Sequence[Verdict], aspect: str) -> str:
    judged = [getattr(v, aspect) for v in verdicts if getattr(v, aspect) is not None]
    return f"{sum(judged)}/{len(judged)}" if judged else "·"


def _row(name: str, verdicts: Sequence[Verdict]) -> tuple[str, ...]:
    return (name, str(len(verdicts)), *(_cell(verdicts, a) for a in ASPECTS),
            f"{sum(v.ok for v in verdicts)}/{len(verdicts)}")


def _print_rows(rows: list[tuple[str, ...]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|---" * len(HEADER) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    for row in [HEADER, *rows]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))


def report(title: str, group: Sequence[Case], markdown: bool) -> None:
    """One set's table, its false alarms, what was wrong and the time to the right knob."""
    verdicts: dict[str, list[Verdict]] = defaultdict(list)
    wrong = []
    alarms = healthy = 0
    for case in group:
        findings = run(case)
        verdict = judge(findings, case.expect, len(case.scrapes))
        verdicts[case.incident].append(verdict)
        if not verdict.ok:
            wrong.append(f"{case.name}: {verdict.why}")
        if case.expect.get("quiet"):
            healthy += 1
            alarms += top(findings) is not None
    every = [v for vs in verdicts.values() for v in vs]
    print(f"\n{title}: {len(group)} cases")
    _print_rows([_row(c, verdicts[c]) for c in sorted(verdicts)] + [_row("all", every)], markdown)
    print(f"\nright: {sum(v.ok for v in every)}/{len(every)}; false alarms on healthy cases: {alarms}/{healthy}")
    if wrong:
        print("wrong:")
        for line in wrong:
            print("  " + line)
    ttr: dict[str, list[float]] = defaultdict(list)
    wrong_first: dict[str, int] = defaultdict(int)
    never: dict[str, int] = defaultdict(int)
    lost: dict[str, int] = defaultdict(int)
    for case in group:
        if "/" in case.name or case.expect.get("quiet") or not case.scrapes:
            continue  # a sub-window, a healthy case, or a log alone (nothing to attach to)
        seconds, early, relapsed = time_to_right(case)
        lost[case.incident] += relapsed
        wrong_first[case.incident] += early
        if seconds is None:
            never[case.incident] += 1
        else:
            ttr[case.incident].append(seconds)
    if not any(case.scrapes for case in group):
        return  # logs alone: no attach, no time to the knob
    print("time to the right knob from attach (median s; windows that showed another warning first; windows "
          "wrong again after it was right; never right):")
    for cls in sorted(set(ttr) | set(never)):
        med = f"{statistics.median(ttr[cls]):.1f} s" if ttr[cls] else "-"
        print(f"  {cls:>14}: {med:>8}  wrong first {wrong_first[cls]:>3}  wrong again {lost[cls]:>3}  "
              f"never {never[cls]}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = parser.parse_args()
    report("Real recordings (the corpus the rules were tuned on)", list(cases()), args.markdown)
    if (HELDOUT / "labels.json").exists():
        report("Held-out real recordings (made after the rules)", list(cases(HELDOUT)), args.markdown)
    report("Simulator scenarios", list(sim_cases()), args.markdown)
    if (STARTUP / "labels.json").exists():
        report("Real failed starts (a startup log each)", list(startup_cases()), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
