"""Load generator benchmark: does the test load generator (tests/integration/load.py) keep its
closed-loop clients' requests in the server, with one TLS context shared by every client it makes,
against an httpx client that builds its own per request (what it did before)?

One real `vllm serve` (the tiny model, ``--max-num-seqs 6``), 20 closed-loop streaming clients
(40-word prompts, 128 tokens), alternating the two for ``--rounds`` rounds of ``--seconds`` each.
For each round: requests answered, and the requests in the server on average by Little's law (the
server's own e2e latency sum over the round's wall time): 20 would be every client waiting on the
server all the time. Also the CPU one client costs to make, each way. Prints; asserts nothing.

    flock /tmp/heavy.lock .venv/bin/python bench/loadgen.py [--rounds 2] [--seconds 20]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostics.core.metrics.catalog import parse_snapshot  # noqa: E402
from tests.fixtures.incidents.record import words  # noqa: E402
from tests.integration import load  # noqa: E402
from tests.integration.vllm_server import VllmServer, build_tiny_model  # noqa: E402

CLIENTS = 20


def client_cost_ms(verify: object, count: int = 100) -> float:
    """CPU milliseconds to make and close one httpx client."""
    started = time.process_time()
    for _ in range(count):
        httpx.Client(base_url="http://127.0.0.1:1", timeout=5, verify=verify).close()  # type: ignore[arg-type]
    return (time.process_time() - started) / count * 1000


def e2e(url: str) -> tuple[float, float]:
    """The server's e2e latency histogram: (sum, count)."""
    snap = parse_snapshot(httpx.get(url + "/metrics", timeout=10).text)
    hist = snap.histogram("e2e_request_latency_seconds")
    if hist is None:
        raise SystemExit("the server exported no vllm:e2e_request_latency_seconds")
    return hist.sum, hist.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    shared = load._tls()
    print(f"one client: {client_cost_ms(True):.1f} ms of CPU with its own TLS context, "
          f"{client_cost_ms(shared):.2f} ms with the shared one")
    work = Path(tempfile.mkdtemp(prefix="loadgen-"))
    server = VllmServer(build_tiny_model(work / "model", "tiny"), work / "server", ("--max-num-seqs", "6"))
    server.start().wait_ready()
    rng = random.Random(1)
    kept: dict[str, list[float]] = {"own": [], "shared": []}
    try:
        for _ in range(args.rounds):
            for mode in ("own", "shared"):
                load._tls = (lambda: True) if mode == "own" else (lambda: shared)  # type: ignore[assignment]
                sum0, count0 = e2e(server.url)
                started = time.monotonic()
                load.closed_loop(server.url, load.Clients(), CLIENTS, args.seconds,
                                 lambda: {"prompt": words(rng, 40), "max_tokens": 128, "stream": True}).join(300)
                wall = time.monotonic() - started
                sum1, count1 = e2e(server.url)
                in_server = (sum1 - sum0) / wall
                kept[mode].append(in_server)
                print(f"{mode:6} TLS context per client: {count1 - count0:.0f} requests in {wall:.1f} s, "
                      f"{in_server:.1f} of {CLIENTS} clients' requests in the server on average", flush=True)
    finally:
        server.stop()
    own, shared_mean = sum(kept["own"]) / len(kept["own"]), sum(kept["shared"]) / len(kept["shared"])
    print(f"requests in the server, shared / own: {shared_mean / own:.2f}x ({shared_mean:.1f} vs {own:.1f} of {CLIENTS})")


if __name__ == "__main__":
    main()
