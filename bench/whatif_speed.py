"""What-if speed: a 15-minute window of a simulated incident (scraped every 5 s, as the app keeps
it), then the baseline replay once and each candidate change (the issue's goal: at most 3 s a
candidate). Prints numbers; asserts nothing.

    .venv/bin/python bench/whatif_speed.py [--minutes 15] [--scenario kv_pressure] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.core import whatif  # noqa: E402
from diagnostics.core.diagnosis import KnownFlags  # noqa: E402
from diagnostics.core.metrics.catalog import parse_snapshot  # noqa: E402
from diagnostics.core.metrics.derive import Scrape  # noqa: E402
from diagnostics.sim.driver import Simulation  # noqa: E402

CANDIDATES = {
    "kv_pressure": [{"--num-gpu-blocks-override": "1200"}, {"--max-num-seqs": "64"}],
    "queue_at_cap": [{"--max-num-seqs": "64"}, {"--max-num-batched-tokens": "1024"}],
    "head_of_line": [{"--max-num-batched-tokens": "512"}, {"--max-num-seqs": "16"}],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--scenario", action="append", choices=sorted(CANDIDATES))
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs of each candidate")
    args = parser.parse_args()
    for name in args.scenario or sorted(CANDIDATES):
        sim = Simulation(name)
        start = time.perf_counter()
        window = [Scrape(ts, parse_snapshot(text)) for ts, text in sim.run_for(args.minutes * 60, scrape_every=5.0)]
        made = time.perf_counter() - start
        start = time.perf_counter()
        base = whatif.baseline(window, KnownFlags())
        baseline_s = time.perf_counter() - start
        per = []
        for change in CANDIDATES[name]:
            best = float("inf")
            for _ in range(args.repeat):  # this VM's timings swing: the best of a few
                start = time.perf_counter()
                base.predict(change)
                best = min(best, time.perf_counter() - start)
            per.append(best)
        print(f"{name}: {args.minutes:.0f}-minute window simulated in {made:.1f} s; baseline replay ({base.ranges.seeds} seeds) "
              f"{baseline_s:.2f} s; "
              f"per candidate (best of {args.repeat}) {', '.join(f'{s:.2f} s' for s in per)} ({len(base.workload.requests):,} requests)")


if __name__ == "__main__":
    main()
