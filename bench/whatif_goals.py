"""Goal seeking's speed and answers: on a 15-minute simulated incident of each class (scraped every
5 s, as the app keeps it) and on the real corpus recordings of the four classes, the goal set to half
of the recorded value of the finding's aimed metric (``--keep throughput`` too), then
``whatif.goals.seek``. Prints the time each search took, how many changes it replayed and its answer;
asserts nothing (the issue's goal: at most 10 s for a 15-minute window).

    .venv/bin/python bench/whatif_goals.py [--minutes 15] [--no-corpus] [--no-simulated]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.whatif_baseline import cases  # noqa: E402
from diagnostics.core import whatif  # noqa: E402
from diagnostics.core.diagnosis import Budgets, KnownFlags, diagnose, prepare  # noqa: E402
from diagnostics.core.metrics.catalog import parse_snapshot  # noqa: E402
from diagnostics.core.metrics.derive import Scrape  # noqa: E402
from diagnostics.core.whatif.goals import Goal, GoalAnswer, seek  # noqa: E402
from diagnostics.recording import read_recording  # noqa: E402

SIMULATED = {"head_of_line": "itl_p99_seconds", "queue_at_cap": "ttft_p95_seconds", "kv_pressure": "preemptions_per_minute"}


def line(name: str, answer: GoalAnswer) -> str:
    goal = ", ".join(g.text() for g in answer.goals)
    if not answer.reproduces:
        said = whatif.not_reproduced(answer.checks)
    elif answer.already_met:
        said = "already met"
    elif answer.found:
        t = answer.found[0]
        said = "meets: " + " ".join(f"{k} {v}" for k, v in t.changes.items())
    else:
        t = answer.closest  # type: ignore[assignment]
        said = "none meets; closest " + (" ".join(f"{k} {v}" for k, v in t.changes.items()) if t else "—")
    return f"| {name} | {goal} | {answer.trials} | {answer.seconds:.2f} s | {said} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--no-corpus", action="store_true")
    parser.add_argument("--no-simulated", action="store_true")
    args = parser.parse_args()
    print("| window | goal | changes replayed | seconds | answer |")
    print("|---|---|---|---|---|")
    if not args.no_simulated:
        from diagnostics.sim.driver import Simulation

        for name, metric in SIMULATED.items():
            sim = Simulation(name)
            window = [Scrape(ts, parse_snapshot(text)) for ts, text in sim.run_for(args.minutes * 60, scrape_every=5.0)]
            value = whatif.recorded(window).metrics[metric] or 0.0
            start = time.perf_counter()
            answer = seek(window, KnownFlags(), [Goal(metric, value / 2)], ["throughput"])
            took = time.perf_counter() - start
            print(line(f"simulated {name}, {args.minutes:.0f} min", answer).replace(f"{answer.seconds:.2f} s", f"{took:.2f} s"),
                  flush=True)
    if not args.no_corpus:
        for name, path, budgets in cases():
            scrapes = read_recording(path).scrapes()
            ctx = prepare(scrapes, budgets=Budgets(itl_ms=budgets.get("itl_ms"), ttft_ms=budgets.get("ttft_ms")))
            aimed = whatif.aimed_for([f.id for f in diagnose(ctx) if f.severity != "info"])
            value = whatif.recorded(scrapes).metrics[aimed[0]] or 0.0
            print(line(name, seek(scrapes, ctx.flags, [Goal(aimed[0], value / 2)], ["throughput"])), flush=True)


if __name__ == "__main__":
    main()
