"""Workloads and scenarios for the simulated engine: each shows one symptom on demand."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from diagnostics.core.metrics.gpu import ClockEvent
from diagnostics.core.simulator.config import EngineConfig
from diagnostics.core.simulator.hardware import GPU_SPECS
from diagnostics.core.simulator.scheduler import SimEngine


@dataclass(frozen=True, slots=True)
class Workload:
    """An arrival process with prompt and output length distributions (uniform ± spread)."""

    arrival: str = "poisson"  # poisson | steady | bursts
    rate_per_s: float = 4.0
    burst_size: int = 0
    burst_every_s: float = 10.0
    prompt_tokens: int = 500
    output_tokens: int = 200
    spread: float = 0.3
    n: int = 1
    shared_prefix_tokens: int = 0  # a system prompt every request starts with
    long_prompt_every_s: float = 0.0  # head-of-line: one long prompt every so often
    long_prompt_tokens: int = 0
    lora_adapters: int = 0  # each request names one of this many LoRA adapters (0: the base model)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    symptom: str
    knob: str  # the finding id the Diagnose page should show
    config: EngineConfig
    workload: Workload
    stall: bool = False
    itl_budget_ms: float | None = None
    data_parallel_size: int = 1  # engines side by side, as --data-parallel-size starts them
    hung_rank: int | None = None  # the engine that stops (its process stopped: its metrics freeze)
    sleep_level: int = 0  # put to sleep at this level (POST /sleep) after a while
    slow_rank: int | None = None  # this engine's device is degraded: its steps take 4× longer
    pinned_share: float = 0.0  # a router pins this share of requests to engine 0 (X-data-parallel-rank)
    gpu_throttle: str = ""  # a GPU_THROTTLES kind: every engine's GPU holds its SM clock down


@dataclass(frozen=True, slots=True)
class GpuThrottle:
    """A GPU held below its maximum clock: the SM clock's share of its maximum, and the NVML
    clocks-event reasons the device reports meanwhile. Each step takes ``1 / sm_clock_ratio`` times
    longer (a compute-bound step scales with the clock; decode, memory-bound, less: an upper bound)."""

    kind: str
    sm_clock_ratio: float
    events: ClockEvent


GPU_THROTTLES = {
    "thermal": GpuThrottle("thermal", 0.64, ClockEvent.SW_THERMAL_SLOWDOWN | ClockEvent.HW_THERMAL_SLOWDOWN),
    "power": GpuThrottle("power", 0.76, ClockEvent.SW_POWER_CAP),
}


BASE = EngineConfig()
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "Healthy", "steady traffic well inside capacity", "",
             BASE, Workload(rate_per_s=4.0, shared_prefix_tokens=256)),
    Scenario("queue_at_cap", "Queue at the concurrency cap", "running pinned at --max-num-seqs 8, KV mostly empty",
             "queue_at_cap", replace(BASE, max_num_seqs=8), Workload(rate_per_s=12.0, output_tokens=150)),
    Scenario("kv_pressure", "KV pressure with preemption", "KV cache full, requests preempted and recomputed",
             "kv_pressure", replace(BASE, num_gpu_blocks=700),
             Workload(rate_per_s=6.0, prompt_tokens=1200, output_tokens=600)),
    Scenario("head_of_line", "Head-of-line blocking", "8k-token prompts stall every decoding sequence",
             "head_of_line_blocking", replace(BASE, max_num_batched_tokens=16384, gpu=GPU_SPECS["L4-24GB"],
                                              num_gpu_blocks=6000),
             Workload(rate_per_s=3.0, prompt_tokens=100, output_tokens=400, long_prompt_every_s=3.0,
                      long_prompt_tokens=8000)),
    Scenario("parallel_no_prefix", "Parallel sampling without prefix caching", "n=8 samples, 8 copies of each prompt",
             "sharing_disabled", replace(BASE, enable_prefix_caching=False),
             Workload(rate_per_s=1.0, prompt_tokens=300, output_tokens=200, n=8)),
    Scenario("parallel_sampling", "Parallel sampling with prefix caching", "n=8 samples sharing prompt blocks",
             "", BASE, Workload(rate_per_s=1.0, prompt_tokens=300, output_tokens=200, n=8)),
    # Reading the 8B model's 16 GB of bf16 weights at 300 GB/s takes ~53.5 ms a step: no batch size meets 50 ms,
    # so the right first suggestion is --quantization (tests/unit/test_rules.py checks both).
    Scenario("slow_decode", "Slow decode: the model is too slow per step for the ITL budget (weights-bound on an L4)",
             "an 8B model in bf16 on an L4 reads its weights in ~53.5 ms a step, over the 50 ms ITL budget even at one "
             "sequence",
             "slow_decode", replace(BASE, gpu=GPU_SPECS["L4-24GB"], max_num_seqs=512, num_gpu_blocks=30000),
             Workload(rate_per_s=8.0, prompt_tokens=32, output_tokens=250), itl_budget_ms=50.0),
    Scenario("stall", "Silent stall", "the engine stops producing tokens while /metrics still answers",
             "silent_stall", BASE, Workload(rate_per_s=4.0), stall=True),
    Scenario("asleep", "Engine put to sleep", "POST /sleep?level=1 after 20 s: weights offloaded, nothing served, "
             "requests wait", "engine_asleep", BASE, Workload(rate_per_s=4.0), sleep_level=1),
    Scenario("lora_deferred", "Requests waiting for a LoRA slot", "4 adapters, --max-loras 1: requests wait "
             "'deferred' while the KV cache and the batch have room", "waiting_deferred",
             replace(BASE, max_loras=1), Workload(rate_per_s=6.0, output_tokens=150, lora_adapters=4)),
    Scenario("admission_limit", "Admission rejections", "--max-num-seqs 8 and --max-num-queued-reqs 16: a burst "
             "beyond them is turned away with HTTP 503", "admission_rejected",
             replace(BASE, max_num_seqs=8, max_num_queued_reqs=16),
             Workload(rate_per_s=0.0, burst_size=40, burst_every_s=15.0, output_tokens=150)),
    Scenario("spec_decode_good", "Speculative decoding that pays", "4 draft tokens, 80 % of each accepted: "
             "about 3 tokens per verify step", "", replace(BASE, num_speculative_tokens=4, spec_acceptance=0.8),
             Workload(rate_per_s=4.0, output_tokens=300)),
    Scenario("spec_decode_low", "Speculative decoding mostly rejected", "4 draft tokens, 15 % accepted: the verify "
             "work is wasted", "spec_low_acceptance", replace(BASE, num_speculative_tokens=4, spec_acceptance=0.15),
             Workload(rate_per_s=4.0, output_tokens=300)),
    Scenario("data_parallel", "Two engines side by side", "--data-parallel-size 2, load balanced across both",
             "", BASE, Workload(rate_per_s=8.0, shared_prefix_tokens=256), data_parallel_size=2),
    Scenario("slow_rank", "Engines out of balance (a slow rank)", "engine 1 of 2 on a degraded device: its steps "
             "take 4× longer, so it holds more requests and KV than its peer", "engine_imbalance",
             replace(BASE, num_gpu_blocks=3000), Workload(rate_per_s=10.0, prompt_tokens=300, output_tokens=300),
             data_parallel_size=2, slow_rank=1),
    Scenario("pinned_rank", "Requests not spread (a sticky router)", "a router pins 90 % of requests to engine 0 "
             "of 2: it queues at --max-num-seqs 8 while engine 1 has room", "engine_imbalance",
             replace(BASE, max_num_seqs=8), Workload(rate_per_s=10.0, output_tokens=150),
             data_parallel_size=2, pinned_share=0.9),
    Scenario("hung_rank", "Hung data-parallel rank", "engine 1 of 2 stops; engine 0 serves alone, the totals halve",
             "hung_rank", BASE, Workload(rate_per_s=8.0), data_parallel_size=2, hung_rank=1),
    Scenario("gpu_thermal_throttle", "GPU thermally throttled", "the GPU runs past its slowdown temperature: the "
             "SM clock is held at 64 % of its maximum (NVML's thermal slowdown reasons set) and every step is slower; "
             "no vLLM flag changes that", "gpu_throttled", BASE, Workload(rate_per_s=4.0, shared_prefix_tokens=256),
             gpu_throttle="thermal"),
)}


class WorkloadGenerator:
    """Arrival times and prompts for a workload (deterministic for a seed)."""

    def __init__(self, workload: Workload, start: float = 0.0, seed: int = 0) -> None:
        self.workload = workload
        self._rng = random.Random(seed)
        self._next = start
        self._next_long = start + workload.long_prompt_every_s if workload.long_prompt_every_s else None
        self._next_burst = start
        self._prefix = [self._rng.randrange(10, 30000) for _ in range(workload.shared_prefix_tokens)]

    def _length(self, mean: int) -> int:
        spread = self.workload.spread
        return max(1, int(mean * self._rng.uniform(1 - spread, 1 + spread)))

    def _prompt(self, tokens: int) -> list[int]:
        # A distinct body per request (its content only matters to prefix hashing).
        base = self._rng.randrange(1 << 40)
        return self._prefix + list(range(base, base + max(1, tokens - len(self._prefix))))

    def _lora(self) -> str | None:
        count = self.workload.lora_adapters
        return f"adapter-{self._rng.randrange(count)}" if count else None

    def due(self, now: float) -> list[tuple[list[int], int, int, str | None]]:
        """``(prompt, max_tokens, n, LoRA adapter)`` of every request that arrived by ``now``."""
        w = self.workload
        out = []
        if w.rate_per_s > 0:
            while self._next <= now:
                out.append((self._prompt(self._length(w.prompt_tokens)), self._length(w.output_tokens), w.n,
                            self._lora()))
                gap = 1 / w.rate_per_s if w.arrival == "steady" else self._rng.expovariate(w.rate_per_s)
                self._next += gap
        if w.burst_size and self._next_burst <= now:
            for _ in range(w.burst_size):
                out.append((self._prompt(self._length(w.prompt_tokens)), self._length(w.output_tokens), w.n,
                            self._lora()))
            self._next_burst += w.burst_every_s
        if self._next_long is not None and self._next_long <= now:
            out.append((self._prompt(w.long_prompt_tokens), 4, 1, None))
            self._next_long += w.long_prompt_every_s
        return out

    def next_arrival(self) -> float:
        times = [self._next if self.workload.rate_per_s > 0 else float("inf")]
        if self.workload.burst_size:
            times.append(self._next_burst)
        if self._next_long is not None:
            times.append(self._next_long)
        return min(times)


def make_engines(scenario: Scenario, seed: int = 0, now: float = 0.0) -> tuple[list[SimEngine], WorkloadGenerator]:
    """Fresh engines for the scenario (one per data-parallel rank) whose clocks (and workload)
    start at ``now``."""
    engines = []
    for rank in range(scenario.data_parallel_size):
        engine = SimEngine(scenario.config)
        engine.now = now
        if rank == scenario.slow_rank:
            engine.slowdown = 4.0
        if scenario.gpu_throttle:
            engine.slowdown = 1 / GPU_THROTTLES[scenario.gpu_throttle].sm_clock_ratio
        engines.append(engine)
    return engines, WorkloadGenerator(scenario.workload, now, seed)


def pick_engine(engines: list[SimEngine], pinned_share: float = 0.0, count: int = 0) -> int:
    """The engine a new request goes to: the fewest requests in flight, the lowest index on ties
    (vLLM's DP load balancer, ``get_core_engine_for_request`` in ``vllm/v1/engine/core_client.py``),
    unless a router pins it: ``pinned_share`` of requests (spread evenly over ``count``, the request's
    number) carry ``X-data-parallel-rank: 0``."""
    if pinned_share and math.floor((count + 1) * pinned_share + 1e-9) > math.floor(count * pinned_share + 1e-9):
        return 0
    return min(range(len(engines)), key=lambda i: (len(engines[i].running) + len(engines[i].waiting), i))
