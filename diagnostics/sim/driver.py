"""Runs a scenario: the engine, its workload and its metrics, on a simulated clock.

``run_for`` steps as fast as the CPU allows (tests, benchmarks, "what happens in 10 minutes");
``start`` follows the wall clock in a background thread, for the HTTP surface.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from diagnostics.core.sim_engine import SimEngine, SimRequest
from diagnostics.core.sim_scenarios import SCENARIOS, Scenario, make_engine
from diagnostics.sim.metrics import SimMetrics

STALL_AFTER_SECONDS = 20.0


class Simulation:
    def __init__(self, scenario: str = "healthy", seed: int = 0) -> None:
        self.lock = threading.RLock()
        self._seed = seed
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.set_scenario(scenario)

    # -- state ---------------------------------------------------------------------------------

    def set_scenario(self, name: str) -> None:
        """Switch scenario at runtime: a fresh engine, counters continue from zero (a "restart")."""
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}; one of: {', '.join(SCENARIOS)}")
        with self.lock:
            previous: SimEngine | None = getattr(self, "engine", None)
            now = 0.0
            if previous is not None:
                previous.abort_all()  # HTTP requests waiting on the old engine get an answer
                now = previous.now
            self.scenario: Scenario = SCENARIOS[name]
            self.engine, self.generator = make_engine(self.scenario, self._seed, now)
            self.metrics = SimMetrics(self.scenario.config, self.engine.num_gpu_blocks)
            self.started_at = now

    def metrics_text(self) -> str:
        with self.lock:
            return self.metrics.text()

    def add_request(self, prompt: list[int], max_tokens: int, n: int = 1,
                    on_token: Callable[[SimRequest], None] | None = None) -> list[SimRequest]:
        with self.lock:
            return self.engine.add_request(prompt, max_tokens, n, on_token)

    # -- stepping ------------------------------------------------------------------------------

    def run_until(self, target: float) -> None:
        """Advance the simulated clock to ``target``: arrivals, steps, metrics."""
        with self.lock:
            engine = self.engine
            while engine.now < target:
                for prompt, max_tokens, n in self.generator.due(engine.now):
                    engine.add_request(prompt, max_tokens, n)
                if self.scenario.stall and engine.now - self.started_at >= STALL_AFTER_SECONDS:
                    engine.stalled = True
                if engine.idle() or engine.stalled:
                    nxt = min(self.generator.next_arrival(), target)
                    stats = engine.step()
                    engine.advance_idle(max(nxt, engine.now + 1e-3) if not engine.stalled else target)
                    stats.now = engine.now
                    self.metrics.update(stats)
                    continue
                horizon = min(target, self.generator.next_arrival())
                stats = engine.fast_forward(horizon) or engine.step()
                self.metrics.update(stats)

    def run_for(self, seconds: float, scrape_every: float = 1.0) -> list[tuple[float, str]]:
        """Run ``seconds`` of simulated time as fast as possible; the /metrics text every interval."""
        out = []
        start = self.engine.now
        t = start
        while t < start + seconds:
            t += scrape_every
            self.run_until(t)
            out.append((t, self.metrics_text()))
        return out

    def start(self, speed: float = 1.0) -> Simulation:
        """Follow the wall clock (× ``speed``) in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        origin_wall, origin_sim = time.monotonic(), self.engine.now

        def loop() -> None:
            while not self._stop.is_set():
                self.run_until(origin_sim + (time.monotonic() - origin_wall) * speed)
                self._stop.wait(0.01)

        self._thread = threading.Thread(target=loop, name="simulated vLLM engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
