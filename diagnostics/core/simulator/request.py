"""What the engine holds per request and what it reports per step (vLLM's ``Request``, and its
``SchedulerStats`` + ``IterationStats``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from diagnostics.core.simulator.allocator import Request


@dataclass(slots=True, eq=False)
class SimRequest:
    request: Request
    max_tokens: int
    arrival: float
    n: int = 1
    parent: str | None = None
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_output: int = 0
    num_preemptions: int = 0
    prefix_looked_up: bool = False
    finished_reason: str | None = None
    on_token: Callable[[SimRequest], None] | None = None
    lora: str | None = None  # the LoRA adapter the request names
    lag_from: int | None = None  # kept lazily by fast_forward since this tick (None: its fields are current)
    admitted: int = 0  # when it joined the running list (its place in it), as a count of admissions


@dataclass(slots=True)
class StepStats:
    """What one engine step did, for the metrics exporter (vLLM's SchedulerStats + IterationStats)."""

    now: float
    num_running: int
    num_waiting: int
    kv_cache_usage_perc: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    iteration_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    itl_weighted: list[tuple[float, int]] = field(default_factory=list)  # (value, how many observations)
    # A fast-forward's steps: (tokens in a step, how many steps had that many), in step order; a
    # regular step's one is ``iteration_tokens``.
    iteration_weighted: list[tuple[int, int]] = field(default_factory=list)
    steps: int = 1  # engine steps these stats stand for
    num_waiting_deferred: int = 0  # waiting for a LoRA slot, not for capacity
    sleep_level: int = 0  # 0 awake; 1 weights offloaded; 2 weights and KV discarded
    spec_drafts: int = 0  # speculative decoding: one draft per decoding sequence per step
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    estimated_flops: float = 0.0  # per GPU, as vLLM's --enable-mfu-metrics estimates them
    estimated_read_bytes: float = 0.0
    estimated_write_bytes: float = 0.0
    running_loras: tuple[str, ...] = ()
    waiting_loras: tuple[str, ...] = ()
    finished: list[SimRequest] = field(default_factory=list)
