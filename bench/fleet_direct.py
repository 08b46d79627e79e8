"""Direct-fleet benchmark: where the line between "each server scraped by its own collector" and
"use Prometheus" lies on this machine, as numbers.

Two costs grow with the number of directly scraped servers N:

1. **Collecting.** N collector threads at 1 s in this process, as the dashboard runs them, each
   scraping a server that answers a real vLLM 0.32 ``/metrics`` payload (the recorded
   ``tests/fixtures/metrics-0.32.0-burst.txt``, 53 KB, one engine; and a recording's two-engine
   ``--data-parallel-size 2`` payload, 85 KB). The servers run in a child process, so this
   process's CPU time is the collectors' alone: CPU per scrape (HTTP + parse + the raw-text
   compression + the periodic ``/health`` and ``/v1/models``), the share of one core they take,
   and the scrapes that did not happen on time (a collector that falls behind skips a tick).
2. **A Fleet-page refresh.** The table over the range (each server's columns and its whole
   diagnosis) for N servers, on histories of 1 s scrapes the simulated engine produced for 5 min,
   15 min and 1 h (KV pressure, the busiest scenario to diagnose).

    .venv/bin/python bench/fleet_direct.py [--sizes 1 5 10 20 40] [--seconds 10]

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostics.collector import Collector  # noqa: E402
from diagnostics.core.fleet import direct  # noqa: E402
from diagnostics.core.metrics.catalog import parse_snapshot  # noqa: E402
from diagnostics.core.metrics.derive import Scrape  # noqa: E402
from diagnostics.core.metrics.info import TargetStatus  # noqa: E402
from diagnostics.sim.driver import Simulation  # noqa: E402
from diagnostics.sources.vllm_http import VllmClient  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"


def payloads() -> dict[str, bytes]:
    from diagnostics.recording import read_recording

    dp2 = [r.metrics for r in read_recording(FIXTURES / "incidents" / "healthy_data_parallel.jsonl.gz").records
           if r.metrics][-1]
    return {"1 engine (53 KB)": (FIXTURES / "metrics-0.32.0-burst.txt").read_bytes(),
            "2 engines (85 KB)": dp2.encode()}


def serve(n: int, payload_file: str) -> None:
    """Child process: ``n`` loopback servers answering the payload; prints their ports, then waits."""
    body = Path(payload_file).read_bytes()
    models = (FIXTURES / "models-0.32.0.json").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            out = {"/metrics": body, "/v1/models": models, "/version": b'{"version": "0.32.0"}'}.get(self.path, b"")
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    ports = []
    for _ in range(n):
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        ports.append(httpd.server_address[1])
    print(json.dumps(ports), flush=True)
    sys.stdin.read()  # until the parent closes our stdin


def collect_cost(n: int, payload: bytes, seconds: float, tmp: Path) -> dict[str, float]:
    path = tmp / "payload.txt"
    path.write_bytes(payload)
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(n), str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())
        collectors = [Collector(VllmClient(f"http://127.0.0.1:{p}"), interval_seconds=1.0) for p in ports]
        cpu0, wall0 = time.process_time(), time.monotonic()
        for c in collectors:
            c.start()
        time.sleep(seconds)
        for c in collectors:
            c.stop()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        scrapes = sum(c.status().num_scrapes for c in collectors)
        failed = sum(c.status().num_failures for c in collectors)
        expected = n * int(seconds)  # one scrape at start, then one a second until stopped
        for c in collectors:
            c.client.close()
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(10)
    return {"cpu_ms_per_scrape": 1000 * cpu / max(scrapes, 1), "core_share": cpu / wall,
            "late_share": max(0.0, 1 - scrapes / expected), "failed": failed}


def parse_cost(payload: bytes, repeat: int = 50) -> float:
    text = payload.decode()
    t0 = time.process_time()
    for _ in range(repeat):
        parse_snapshot(text)
    return 1000 * (time.process_time() - t0) / repeat


def history(seconds: int, scenario: str) -> tuple[Scrape, ...]:
    sim = Simulation(scenario)
    return tuple(Scrape(1_000_000.0 + t, parse_snapshot(text)) for t, text in sim.run_for(seconds, 1.0))


def refresh_cost(n: int, hist: tuple[Scrape, ...], range_s: int) -> float:
    status = TargetStatus(target="http://sim:8000", state="up", since=None, error=None, last_ok_ts=hist[-1].ts,
                          last_attempt_ts=hist[-1].ts, info=None, num_scrapes=len(hist), num_failures=0)
    targets = [direct.DirectTarget(f"t{i}", TargetStatus(**{**{f: getattr(status, f) for f in status.__slots__},
                                                            "target": f"http://sim-{i}:8000"}), hist)
               for i in range(n)]
    t0 = time.process_time()
    direct.report(targets, range_s=range_s, interval_s=1.0, draw=True)
    return time.process_time() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 10, 20, 40])
    parser.add_argument("--seconds", type=float, default=10.0, help="collection time per size")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return 0
    import tempfile

    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    collect_share: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, payload in payloads().items():
            print(f"\n/metrics payload: {label}; parse alone {parse_cost(payload):.1f} ms CPU")
            print(f"{'servers':>7} {'CPU/scrape':>11} {'of one core':>12} {'late scrapes':>13} {'failed':>7}")
            for n in args.sizes:
                r = collect_cost(n, payload, args.seconds, Path(tmp))
                collect_share[n] = max(collect_share.get(n, 0.0), r["core_share"])
                print(f"{n:7d} {r['cpu_ms_per_scrape']:9.1f} ms {100 * r['core_share']:10.1f} % "
                      f"{100 * r['late_share']:11.1f} % {r['failed']:7.0f}")
    print("\nFleet-page refresh (columns + each server's diagnosis + charts), CPU seconds, simulated KV pressure:")
    ranges = {"5 min": 300, "15 min": 900, "1 h": 3600}
    hists = {label: history(s, "kv_pressure") for label, s in ranges.items()}
    print(f"{'servers':>7} " + " ".join(f"{label:>8}" for label in ranges))
    page_share: dict[int, float] = {}
    for n in args.sizes:
        cells = [refresh_cost(n, hists[label], s) for label, s in ranges.items()]
        # The page refreshes every max(10 s, range / 60): 10 s at 5 min, 15 s at 15 min, 60 s at 1 h.
        page_share[n] = max(c / max(10, s // 60) for c, s in zip(cells, ranges.values()))
        print(f"{n:7d} " + " ".join(f"{c:7.2f}s" for c in cells))
    print("\nAll together (the 2-engine payload; the page's costliest range at its refresh):")
    print(f"{'servers':>7} {'collect':>8} {'+ Fleet page':>13}")
    for n in args.sizes:
        print(f"{n:7d} {100 * collect_share[n]:7.1f}% {100 * (collect_share[n] + page_share[n]):12.1f}%  of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
