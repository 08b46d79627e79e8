"""Runs a scenario: the engines, their workload and their metrics, on a simulated clock.

``run_for`` steps as fast as the CPU allows (tests, benchmarks, "what happens in 10 minutes");
``start`` follows the wall clock in a background thread, for the HTTP surface. A scenario with
``data_parallel_size`` > 1 runs that many engines, each on its own clock, new requests going to the
least loaded one (:func:`~diagnostics.core.simulator.scenarios.pick_engine`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from diagnostics.core.simulator.request import SimRequest
from diagnostics.core.simulator.scenarios import SCENARIOS, Scenario, make_engines, pick_engine
from diagnostics.core.simulator.scheduler import SimEngine
from diagnostics.sim.dcgm import HOSTNAME, SimDcgm
from diagnostics.sim.metrics import SimMetrics

STALL_AFTER_SECONDS = 20.0


class Simulation:
    def __init__(self, scenario: str = "healthy", seed: int = 0) -> None:
        self.lock = threading.RLock()
        self._seed = seed
        self._gpu_host = (HOSTNAME, HOSTNAME)  # the DCGM Hostname label, and what the GPUs' UUIDs derive from
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.set_scenario(scenario)

    # -- state ---------------------------------------------------------------------------------

    @property
    def engine(self) -> SimEngine:
        """The first engine (the only one without data parallelism)."""
        return self.engines[0]

    @property
    def now(self) -> float:
        return min(e.now for e in self.engines)

    def set_scenario(self, name: str) -> None:
        """Switch scenario at runtime: fresh engines, counters continue from zero (a "restart")."""
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}; one of: {', '.join(SCENARIOS)}")
        with self.lock:
            previous: list[SimEngine] = getattr(self, "engines", [])
            now = 0.0
            for engine in previous:
                engine.abort_all()  # HTTP requests waiting on the old engines get an answer
                now = max(now, engine.now)
            self.scenario: Scenario = SCENARIOS[name]
            self.engines, self.generator = make_engines(self.scenario, self._seed, now)
            self.metrics = SimMetrics(self.scenario.config, self.engine.num_gpu_blocks, len(self.engines))
            self.dcgm = SimDcgm(self.scenario.config, len(self.engines), self.scenario.gpu_throttle, *self._gpu_host)
            self.busy_seconds = [0.0] * len(self.engines)  # simulated time each engine spent in steps
            self.started_at = now

    def name_gpu_host(self, hostname: str, serial: str) -> None:
        """The node the simulated GPUs are on (dcgm-exporter's ``Hostname``) and a serial their UUIDs
        derive from: each server its own, so the Fleet page's join by host tells two servers apart."""
        with self.lock:
            self._gpu_host = (hostname, serial)
            self.dcgm = SimDcgm(self.scenario.config, len(self.engines), self.scenario.gpu_throttle, hostname, serial)

    def metrics_text(self) -> str:
        with self.lock:
            return self.metrics.text()

    def dcgm_text(self) -> str:
        """The engines' GPUs as dcgm-exporter's ``/metrics`` shows them (:class:`SimDcgm`)."""
        with self.lock:
            return self.dcgm.text(self.now, self.busy_seconds, [len(e.running) for e in self.engines])

    def add_request(self, prompt: list[int], max_tokens: int, n: int = 1,
                    on_token: Callable[[SimRequest], None] | None = None,
                    lora: str | None = None) -> list[SimRequest] | None:
        """The request's sequences, or None when the frontend turns it away (``--max-num-queued-reqs``:
        vLLM answers HTTP 503 and counts it in ``admission_rejections_total``)."""
        with self.lock:
            self._routed = getattr(self, "_routed", 0) + 1
            engine = self.engines[pick_engine(self.engines, self.scenario.pinned_share, self._routed)]
            if not engine.admits():
                self.metrics.reject("max_num_queued_reqs")
                return None
            return engine.add_request(prompt, max_tokens, n, on_token, lora)

    # -- stepping ------------------------------------------------------------------------------

    def _stalled(self, index: int, engine: SimEngine) -> bool:
        if engine.now - self.started_at < STALL_AFTER_SECONDS:
            return False
        return self.scenario.stall or self.scenario.hung_rank == index

    def run_until(self, target: float) -> None:
        """Advance every engine's clock to ``target``: arrivals, steps, metrics. The engine furthest
        behind moves first, so arrivals are routed on the state they would meet."""
        with self.lock:
            while True:
                index = min(range(len(self.engines)), key=lambda i: self.engines[i].now)
                engine = self.engines[index]
                if engine.now >= target:
                    return
                for prompt, max_tokens, n, lora in self.generator.due(engine.now):
                    self.add_request(prompt, max_tokens, n, lora=lora)
                engine.stalled = self._stalled(index, engine)
                if self.scenario.sleep_level and not engine.sleep_level \
                        and engine.now - self.started_at >= STALL_AFTER_SECONDS:
                    engine.sleep(self.scenario.sleep_level)
                if engine.idle() or engine.stalled or engine.sleep_level:
                    nxt = min(self.generator.next_arrival(), target)
                    stats = engine.step()
                    engine.advance_idle(max(nxt, engine.now + 1e-3))
                    stats.now = engine.now
                    if not (engine.stalled and self.scenario.hung_rank == index):
                        # A stopped rank publishes nothing: its gauges keep their last values.
                        self.metrics.update(stats, index)
                    continue
                horizon = min(target, self.generator.next_arrival())
                before = engine.now
                stats = engine.fast_forward(horizon) or engine.step()
                self.busy_seconds[index] += engine.now - before
                self.metrics.update(stats, index)

    def run_for(self, seconds: float, scrape_every: float = 1.0) -> list[tuple[float, str]]:
        """Run ``seconds`` of simulated time as fast as possible; the /metrics text every interval."""
        return [(t, text) for t, text, _ in self.run_for_with_gpus(seconds, scrape_every)]

    def run_for_with_gpus(self, seconds: float, scrape_every: float = 1.0) -> list[tuple[float, str, str]]:
        """:meth:`run_for`, with the GPUs' dcgm-exporter text read beside each /metrics (as the
        collector reads a GPU metrics URL)."""
        out = []
        start = self.now
        t = start
        while t < start + seconds:
            t += scrape_every
            self.run_until(t)
            out.append((t, self.metrics_text(), self.dcgm_text()))
        return out

    def start(self, speed: float = 1.0) -> Simulation:
        """Follow the wall clock (× ``speed``) in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        origin_wall, origin_sim = time.monotonic(), self.now

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
