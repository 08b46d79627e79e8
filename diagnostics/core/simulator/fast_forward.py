"""Fast-forward: runs of pure decode steps taken together, with the batch's progress kept lazily.

Between regular steps the running requests are decoders that all advance one token a step. A
fast-forward advances them together: ``tick`` counts those steps, and a request's own fields
(computed tokens, outputs, token ids, last token time) are brought up to date only when something
happens to it — a block fills, it finishes, or a regular step, a sleep or an abort needs every
request as it is (:meth:`FastForward.sync`). Two heaps say when: the step at which a request needs
a slot allocated (its last block fills or it needs a new one) and the step at which it finishes.
A fast-forward costs its events, not its batch size.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

from diagnostics.core.simulator.request import SimRequest, StepStats

if TYPE_CHECKING:  # the engine owns its fast-forward; only its type is needed here
    from diagnostics.core.simulator.scheduler import SimEngine


def _in_running_order(sims: list[SimRequest]) -> list[SimRequest]:
    """Running order is admission order (requests are only appended to it, and removed)."""
    return sims if len(sims) < 2 else sorted(sims, key=lambda sim: sim.admitted)


class FastForward:
    """One engine's lazily advanced batch and the forward over it."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.kv = engine.kv  # the engine's block manager, for the slot and finish events
        self.block_size = engine.config.block_size
        # The decode steps taken together, the time of the last, and sums over the lazy requests for
        # their KV tokens at any tick (their computed tokens, their count, the ticks they lag from).
        self.tick = 0
        self.tick_time = 0.0
        self.n = self.computed = self.from_sum = 0
        self.finish_at: list[tuple[int, int, SimRequest]] = []
        self.slot_at: list[tuple[int, int, SimRequest]] = []
        self.seq = 0

    def add(self, sim: SimRequest) -> None:
        req = sim.request
        sim.lag_from = self.tick
        self.n += 1
        self.computed += req.num_computed_tokens
        self.from_sum += self.tick
        heapq.heappush(self.finish_at, (self.tick + sim.max_tokens - sim.num_output, self.seq, sim))
        self.seq += 1
        self.push_slot(sim)

    def push_slot(self, sim: SimRequest) -> None:
        """The step (tick) before which the request needs a new block: when its computed tokens plus
        the one being decoded pass its slots. (A block that fills is given its hash then, or when
        the request finishes or is synced: nobody else can look up a running request's output.)"""
        heapq.heappush(self.slot_at, (self.slot_key(sim), self.seq, sim))
        self.seq += 1

    def catch_up(self, sim: SimRequest) -> None:
        """Bring one lazily advanced request's own fields up to ``self.tick``."""
        lag_from = sim.lag_from
        assert lag_from is not None
        d = self.tick - lag_from
        if d:
            req = sim.request
            req.num_computed_tokens += d
            sim.num_output += d
            engine = self.engine
            req.token_ids.extend(range(engine.next_token_id, engine.next_token_id + d))
            engine.next_token_id += d
            sim.last_token_at = self.tick_time
            sim.lag_from = self.tick
            self.computed += d
            self.from_sum += d

    def sync(self) -> None:
        """Every running request's fields as they are now (after a fast-forward kept them lazily)."""
        if not self.n:
            return
        for sim in self.engine.running:
            self.catch_up(sim)
            self.kv.cache_computed(sim.request)
            sim.lag_from = None
        self.n = self.computed = self.from_sum = 0
        self.finish_at.clear()
        self.slot_at.clear()

    def context(self, tick: int) -> int:
        """The KV tokens the lazily advanced requests hold at ``tick``."""
        return self.computed + self.n * tick - self.from_sum

    def due(self, heap: list[tuple[int, int, SimRequest]], tick: int, key: Callable[[SimRequest], int]
             ) -> list[SimRequest]:
        """The running requests whose event in ``heap`` falls at or before ``tick`` (stale entries —
        a request no longer running, or re-keyed since — are dropped)."""
        out: list[SimRequest] = []
        while heap and heap[0][0] <= tick:
            at, _, sim = heapq.heappop(heap)
            if sim.lag_from is not None and sim.finished_reason is None and key(sim) == at and sim not in out:
                out.append(sim)
        return out

    def slot_key(self, sim: SimRequest) -> int:
        assert sim.lag_from is not None
        req = sim.request
        return sim.lag_from + len(self.kv.req_to_blocks[req.request_id]) * self.block_size \
            - req.num_computed_tokens + 1

    def finish_key(self, sim: SimRequest) -> int:
        assert sim.lag_from is not None
        return sim.lag_from + sim.max_tokens - sim.num_output

    def run(self, horizon: float, max_steps: int = 512, next_arrival: float = float("inf"),
            arrive: Callable[[], float] | None = None, stop_at_finish: bool = True) -> StepStats | None:
        """Several steps at once, when nothing can change the batch in between: every running
        request is decoding; the first step may admit waiting requests whose whole prompts fit its
        token budget and the free blocks (a closed loop's replacement for a finished request), after
        which nobody else could be admitted (none waiting, running at max_num_seqs, or the queue's
        head waiting for blocks). The steps stop before one whose blocks are not free (the regular
        step preempts), before ``horizon``, after ``max_steps``, and with the first request to finish
        — unless ``stop_at_finish`` is False and nobody waits: then the batch just gets smaller
        (a caller that adds requests only through ``arrive``, not when one finishes).
        Returns None when a regular :meth:`SimEngine.step` is needed.

        Open arrivals: the next request arrives at ``next_arrival``. When nobody could be admitted
        before the next finish anyway (the batch at max_num_seqs, or the queue's head waiting for
        blocks), the steps go on past it and ``arrive()`` is called at the end of the step it
        arrived in (with ``engine.now`` that step's end, as a caller adding it between steps would
        have it); it adds the request and returns the next arrival time. Otherwise the steps stop
        with the one it arrives in, for the caller to add it.

        Equivalent to that many calls of :meth:`SimEngine.step` (same tokens, blocks, times and observations)."""
        engine = self.engine
        cfg = engine.config
        running = engine.running
        if engine.stalled or engine.sleep_level or cfg.num_speculative_tokens or not running:
            return None
        batch = len(running)
        if batch > cfg.max_num_batched_tokens:
            return None
        bs = cfg.block_size
        tick0 = self.tick
        gaps: dict[float, int] | None = None  # step 1's token gaps, when not every request emitted at engine.now
        # The head of the waiting queue when no step before the next finish can admit it (nor, behind
        # it, anyone): its blocks are not free now, and decode only takes more. Each step still looks
        # it up in the prefix cache, as vLLM's scheduler does (counted below as the steps would).
        blocked: tuple[int, bool] | None = None  # (tokens looked up each step, counted in the step's stats)
        if engine.waiting and batch < cfg.max_num_seqs:
            head = engine.waiting[0]
            hreq = head.request
            tokens = len(hreq.token_ids)
            budget = cfg.max_num_batched_tokens - batch
            if head.lora and cfg.max_loras or head.prefix_looked_up:
                return None
            if budget <= 0:
                blocked = (0, False)  # no token budget left for anyone waiting: nothing is looked up
            elif -(-tokens // bs) > engine.kv.block_pool.get_num_free_blocks() or tokens > budget:
                hit_blocks, hit = engine.kv.find_computed_blocks(hreq)
                if engine.kv.can_allocate(hreq, min(tokens - hit, budget), hit_blocks):
                    return None  # the next request is admitted (in part, for a prompt the budget splits)
                # Blocks it hits that sit in the free queue count against the free ones (so losing them
                # to the decoders' new blocks never unblocks it) unless losing hits makes the budget
                # split its prompt: then the regular step decides.
                if tokens > budget and any(block.ref_cnt == 0 for block in hit_blocks):
                    return None
                blocked = (tokens, head.num_preemptions == 0)
        if self.n != batch:
            # After a regular step: check every request decodes, then keep them lazily.
            self.sync()
            for sim in running:
                req = sim.request
                if sim.first_token_at is None or len(req.token_ids) - req.num_computed_tokens != 1 \
                        or sim.on_token is not None:
                    return None
            gaps = {}
            for sim in running:
                self.add(sim)
                if sim.last_token_at is not None:
                    gaps[sim.last_token_at] = gaps.get(sim.last_token_at, 0) + 1
        cross = self.due(self.slot_at, tick0 + 1, self.slot_key)  # need a slot in step 1
        free = engine.kv.block_pool.get_num_free_blocks() - len(cross)
        admit: list[SimRequest] = []
        bail = False
        if engine.waiting and batch < cfg.max_num_seqs and blocked is None:
            budget = cfg.max_num_batched_tokens - batch
            for sim in engine.waiting:
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
            if len(admit) < len(engine.waiting) and batch + len(admit) < cfg.max_num_seqs:
                bail = True  # the next step would admit more
        size = batch + len(admit)
        if bail or free < 0:
            for sim in cross:  # not handled here: keep their events for the regular step's sync
                heapq.heappush(self.slot_at, (self.slot_key(sim), self.seq, sim))
                self.seq += 1
            return None
        stats = StepStats(engine.now, batch, len(engine.waiting), engine.kv.usage)
        # Step 1, as step() schedules it: the decoders' slots in running order, then the admissions.
        for sim in _in_running_order(cross):
            self.catch_up(sim)
            engine.kv.allocate_slots(sim.request, 1)
            self.push_slot(sim)
        context = self.context(tick0)
        prefill = 0
        first_tokens = batch
        for sim in admit:
            req = sim.request
            computed_blocks, hit = engine.kv.get_computed_blocks(req)
            if sim.num_preemptions == 0:
                stats.prefix_queries += req.num_tokens
                stats.prefix_hits += hit
            num_new = len(req.token_ids) - hit
            allocated = engine.kv.allocate_slots(req, num_new, computed_blocks)
            assert allocated is not None, "fast_forward admitted a request the blocks cannot hold"
            req.num_computed_tokens = hit
            sim.prefix_looked_up = True
            engine.waiting.popleft()
            running.append(sim)
            engine.admissions += 1
            sim.admitted = engine.admissions
            if sim.scheduled_at is None:
                sim.scheduled_at = engine.now
            context += hit
            first_tokens += num_new
            if hit < req.num_prompt_tokens:
                prefill += num_new
                stats.prompt_tokens += min(num_new, req.num_prompt_tokens)
        t = engine.now + engine.step_seconds(prefill, size, context)
        work = list(engine.roofline.work(prefill, size, context))
        # Step 1's tokens: every decoder's next one (one tick), every admitted prompt's first.
        if gaps is None:
            stats.itl_weighted = [(t - engine.now, batch)]
        else:
            stats.itl_weighted = [(t - last, n) for last, n in gaps.items()]
        self.tick = tick0 + 1
        self.tick_time = t
        for sim in admit:
            req = sim.request
            req.num_computed_tokens = len(req.token_ids)
            sim.num_output = 1
            sim.first_token_at = sim.last_token_at = t
            stats.ttft.append(t - sim.arrival)
            req.token_ids.append(engine.next_token_id)
            engine.next_token_id += 1
            self.add(sim)
        # Steps 2..k: pure decode of the batch, tick by tick: the decoders whose block fills take a new
        # one (in running order, as the scheduler allocates), then those that finish leave (freeing
        # theirs). Arrivals join the queue's tail when nobody could be admitted before the next finish.
        late = arrive is not None and (blocked is not None or size >= cfg.max_num_seqs)
        # Past a finish only when nobody waits and nothing arrives but through ``arrive``: the batch
        # then just gets smaller.
        through = not stop_at_finish and not late and not engine.waiting
        kvb = engine.roofline.kv_bytes_per_token
        head_chain: list = []  # a blocked head's prefix hit, and where the decoders' new blocks cut it
        head_at: dict[int, int] = {}
        hits = cut = 0
        if blocked is not None and blocked[0]:
            head_chain, hits = engine.kv.find_computed_blocks(engine.waiting[0].request)  # step 1's lookup
            cut = len(head_chain)
            head_at = {id(block): i for i, block in enumerate(head_chain) if block.ref_cnt == 0}
        first_size = size
        stats.iteration_weighted.append((first_tokens, 1))
        steps = 1
        sum_size = sum_context = 0
        finish_at, slot_at = self.finish_at, self.slot_at
        while True:
            tick = self.tick
            if finish_at and finish_at[0][0] <= tick:
                done = _in_running_order(self.due(finish_at, tick, self.finish_key))
                for sim in done:
                    self.catch_up(sim)
                    req = sim.request
                    engine.kv.cache_computed(req)
                    sim.finished_reason = "length"
                    req.token_ids.pop()  # the last token is never fed back
                    engine.kv.free(req)
                    running.remove(sim)
                    sim.lag_from = None
                    self.n -= 1
                    self.computed -= req.num_computed_tokens
                    self.from_sum -= tick
                    stats.finished.append(sim)
                if done and not through:
                    break
            size = self.n
            if not size or steps >= max_steps or not late and t >= next_arrival:
                break  # (a request that arrived in the last step may be admitted in the next)
            context = self.context(tick)
            step = engine.step_seconds(0, size, context, ahead=steps)
            if t + step > horizon:
                break
            due = self.due(slot_at, tick + 1, self.slot_key) if slot_at and slot_at[0][0] <= tick + 1 else []
            if len(due) > engine.kv.block_pool.get_num_free_blocks():
                for sim in due:  # a decoder's block is not there: the regular step preempts
                    heapq.heappush(slot_at, (self.slot_key(sim), self.seq, sim))
                    self.seq += 1
                break
            # The next step is taken: what arrived in the last one joins the queue's tail now (when
            # the forward ends instead, the caller adds it, and the gauges do not count it early).
            while late and next_arrival <= t:
                engine.now = t
                next_arrival = arrive()  # type: ignore[misc]
            for sim in _in_running_order(due):
                self.catch_up(sim)
                new = engine.kv.allocate_slots(sim.request, 1)
                self.push_slot(sim)
                if head_chain and new:
                    for block in new:
                        cut = min(cut, head_at.get(id(block), cut))
            t += step
            steps += 1
            self.tick = tick + 1
            self.tick_time = t
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
        engine.steps_taken += steps
        if blocked is not None and blocked[0]:
            looked, counted = blocked
            if engine.kv.enable_caching:
                engine.kv.prefix_cache_stats.queries += looked * steps
                engine.kv.prefix_cache_stats.hits += hits
            if counted:
                stats.prefix_queries += looked * steps
                stats.prefix_hits += hits
        if sum_size:  # the work of steps 2..k: each reads the weights and its context, writes its tokens
            roofline = engine.roofline
            work[0] += roofline.flops_per_token * sum_size
            work[1] += roofline.weight_bytes * (steps - 1) + sum_context * kvb
            work[2] += sum_size * kvb
        engine.now = t
        stats.generation_tokens = first_size + sum_size
        stats.steps = steps
        stats.estimated_flops, stats.estimated_read_bytes, stats.estimated_write_bytes = work
        stats.now = engine.now
        engine.queue_stats(stats)
        return stats
