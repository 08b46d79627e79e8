"""Simulator speed: simulated seconds per wall second with 64 requests always in flight on the
Llama-3.1-8B-on-H100 preset (goal: at least 300×, issue 14). Prints numbers; asserts nothing.

    .venv/bin/python bench/simulate.py [--seconds 120] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.core.simulator.config import EngineConfig  # noqa: E402
from diagnostics.core.simulator.scheduler import SimEngine  # noqa: E402
from diagnostics.sim.metrics import SimMetrics  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    rng = random.Random(0)
    config = EngineConfig()
    engine = SimEngine(config)
    metrics = SimMetrics(config, engine.num_gpu_blocks)

    def new_request() -> None:
        base = rng.randrange(1 << 40)  # distinct prompts: no prefix shared across requests
        engine.add_request(list(range(base, base + rng.randint(300, 700))), rng.randint(100, 300))

    for _ in range(args.concurrency):
        new_request()
    steps = tokens = 0
    start = time.perf_counter()
    while engine.now < args.seconds:
        stats = engine.fast_forward(args.seconds) or engine.step()
        metrics.update(stats)
        steps += stats.steps
        tokens += stats.generation_tokens
        for _ in stats.finished:
            new_request()
    wall = time.perf_counter() - start
    print(f"preset: {config.model.name} on {config.gpu.name}, {args.concurrency} requests in flight, "
          f"{engine.num_gpu_blocks:,} KV blocks")
    print(f"simulated {engine.now:.1f} s in {wall:.2f} s wall = {engine.now / wall:.0f}× real time (goal ≥ 300×)")
    print(f"{steps:,} engine steps ({steps / wall:,.0f}/s wall), {tokens:,} tokens generated "
          f"({tokens / engine.now:,.0f} simulated tok/s, mean step {engine.now / steps * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
