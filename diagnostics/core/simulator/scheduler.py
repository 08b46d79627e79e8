"""The simulated vLLM engine core: continuous batching over the real block allocator.

``SimEngine.step`` mirrors one iteration of vLLM v1's ``Scheduler.schedule`` + model step
(``vllm/v1/core/sched/scheduler.py``): running requests first (one decode token each, or their
next prefill chunk), preempting the most recently admitted running request by recompute when
``allocate_slots`` returns None; then waiting requests in arrival order while ``max_num_seqs``
and the ``max_num_batched_tokens`` budget allow (chunked prefill), each looked up in the prefix
cache first. n > 1 requests fan out into n child requests that share the prompt's full blocks.
A step's time is the config's fitted cost or the roofline (:mod:`.cost`); runs of pure decode
steps are taken together by :mod:`.fast_forward`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from diagnostics.core.simulator.allocator import KVCacheManager, Request
from diagnostics.core.simulator.config import EngineConfig
from diagnostics.core.simulator.cost import Roofline, StepTime
from diagnostics.core.simulator.fast_forward import FastForward
from diagnostics.core.simulator.request import SimRequest, StepStats


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
        self.admissions = 0  # requests that joined the running list so far (their order in it)
        self.next_token_id = 100_000  # output tokens get unique ids
        self.roofline = Roofline.of(config)
        self._step_time: StepTime = config.step_cost if config.step_cost is not None else self.roofline
        self._forward = FastForward(self)

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

    def queue_stats(self, stats: StepStats) -> None:
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

    # -- step time -----------------------------------------------------------------------------

    def step_seconds(self, prefill_tokens: int, num_seqs: int, context_tokens: int, ahead: int = 0) -> float:
        """One step: ``num_seqs`` scheduled sequences holding ``context_tokens`` of KV between them,
        ``prefill_tokens`` of which are new prompt tokens; ``ahead`` steps after the next one (a
        fitted cost's noise is drawn per step number, so a step costs the same however it is reached)."""
        return self._step_time.seconds(prefill_tokens, num_seqs, context_tokens,
                                       self.steps_taken + ahead) * self.slowdown

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
            self.admissions += 1
            sim.admitted = self.admissions
            if sim.lora:
                active.add(sim.lora)
            if sim.scheduled_at is None:
                sim.scheduled_at = self.now
            scheduled.append((sim, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))
        if not scheduled:
            self.queue_stats(stats)
            return stats
        prefill = sum(n for sim, n in scheduled if sim.request.num_computed_tokens < sim.request.num_prompt_tokens)
        context = sum(sim.request.num_computed_tokens for sim, _ in scheduled)
        k = cfg.num_speculative_tokens
        decoding = len(scheduled) - sum(1 for sim, _ in scheduled
                                        if sim.request.num_computed_tokens < sim.request.num_prompt_tokens)
        # Speculation verifies k draft tokens per decoding sequence in the same forward pass.
        self.now += self.step_seconds(prefill + k * decoding, len(scheduled), context)
        self.steps_taken += 1
        stats.estimated_flops, stats.estimated_read_bytes, stats.estimated_write_bytes = self.roofline.work(
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
        self.queue_stats(stats)
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
            req.token_ids.append(self.next_token_id)
            self.next_token_id += 1

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
            sim.request.token_ids.append(self.next_token_id)
            self.next_token_id += 1

    # -- fast-forward (simulator/fast_forward.py) ----------------------------------------------

    def sync(self) -> None:
        """Every running request's fields as they are now (after a fast-forward kept them lazily)."""
        self._forward.sync()

    def fast_forward(self, horizon: float, max_steps: int = 512, next_arrival: float = float("inf"),
                     arrive: Callable[[], float] | None = None, stop_at_finish: bool = True) -> StepStats | None:
        """Several decode steps at once when nothing can change the batch in between, or None when a
        regular :meth:`step` is needed (see :meth:`FastForward.run`)."""
        return self._forward.run(horizon, max_steps, next_arrival, arrive, stop_at_finish)

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
