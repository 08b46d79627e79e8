"""Fleet benchmark: what one Fleet-page refresh costs against a real Prometheus (1 s scrapes) as
the fleet grows — queries sent, time to answer, bytes of the raw-series answer — side by side for
1, 2, 4 and 8 simulated vLLM servers; and, for comparison, the queries a per-instance design (one
query per column per instance) would send.

    .venv/bin/python bench/fleet.py [--sizes 1 2 4 8] [--range 300]

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostics.core.fleet.promql import CHART_CONCEPTS, FLEET_COLUMNS, Scope  # noqa: E402
from diagnostics.prometheus_fleet import Window, fleet_report, histories  # noqa: E402
from diagnostics.sim.server import SimServer  # noqa: E402
from diagnostics.sources.prometheus import PrometheusClient  # noqa: E402
from tests.integration.prometheus_server import PrometheusServer  # noqa: E402

SCENARIOS = ("healthy", "kv_pressure", "queue_at_cap", "healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--range", type=float, default=300.0, help="seconds of history each refresh reads")
    parser.add_argument("--warm", type=float, default=30.0, help="seconds of scraping before measuring")
    args = parser.parse_args()
    print(f"{'servers':>7} {'queries':>7} {'per-instance design':>19} {'refresh s (median of 5)':>24} "
          f"{'raw answer s':>12} {'scrapes read':>12}")
    for n in args.sizes:
        sims = [SimServer(SCENARIOS[i % len(SCENARIOS)], speed=1.0).start() for i in range(n)]
        prom = PrometheusServer([s.url.split("//")[1] for s in sims]).start()
        try:
            prom.wait_for_scrapes(int(args.warm))
            client = PrometheusClient(prom.url, timeout_seconds=60)
            times, queries = [], 0
            for _ in range(5):
                t = time.perf_counter()
                report = fleet_report(client, Scope('job="vllm"'), range_s=args.range, charts=True)
                times.append(time.perf_counter() - t)
                queries = report.num_queries
            t = time.perf_counter()
            got = histories(client, Scope('job="vllm"'), Window(time.time() - args.range, time.time(), 1.0))
            raw_s = time.perf_counter() - t
            naive = 2 + n * (len(FLEET_COLUMNS) + len(CHART_CONCEPTS) + 1)
            print(f"{n:>7} {queries:>7} {naive:>19} {statistics.median(times):>24.3f} {raw_s:>12.3f} "
                  f"{sum(len(h) for h in got.values()):>12}")
        finally:
            prom.close()
            for s in sims:
                s.stop()


if __name__ == "__main__":
    main()
