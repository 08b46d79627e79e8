"""Step 3 of a what-if: the window's workload replayed on the simulated engine
(:class:`~diagnostics.core.simulator.scheduler.SimEngine`, vLLM's scheduler over the real block
allocator) under a set of flags, and the same metrics measured from the recording. Both sides are
computed the way the dashboard computes them from a server (the same histogram buckets, the same
interpolation), so a replay is comparable with the recording."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import Scrape, counter_step, histogram_delta, histogram_quantile, restarted
from diagnostics.core.simulator.config import EngineConfig
from diagnostics.core.simulator.request import StepStats
from diagnostics.core.simulator.scheduler import SimEngine
from diagnostics.core.whatif.calibrate import Calibration
from diagnostics.core.whatif.flags import Flags
from diagnostics.core.whatif.workload import InferredWorkload

# itl_p999: the longest gaps a user sees (a head-of-line stall), which smaller prefill chunks cut even
# where they raise p99 (more steps carry a piece of the prompt).
METRICS = ("itl_p50_seconds", "itl_p95_seconds", "itl_p99_seconds", "itl_p999_seconds", "ttft_p50_seconds",
           "ttft_p95_seconds", "output_tokens_per_second", "preemptions_per_minute", "max_num_requests_waiting")
# The dashboard's buckets when the recording has none (vLLM 0.32's own bounds).
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
              80.0, math.inf)
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0, 160.0, 640.0, 2560.0, math.inf)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The metrics of one replay (or of the recording), on the dashboard's own histogram buckets."""

    metrics: dict[str, float | None]
    requests_rejected: int = 0  # longer than --max-model-len
    max_running: int = 0  # the most sequences a replayed step ran (0 for a recording)
    # Each replayed first token: (seconds from arrival to it in the engine, sequences running in its
    # step). The API server's share is added on top (:func:`streams_scaled`); empty for a recording.
    first_tokens: tuple[tuple[float, int], ...] = ()

    def mean_streams(self) -> float | None:
        """Sequences running in a step that gave a first token, averaged over the first tokens."""
        return sum(r for _, r in self.first_tokens) / len(self.first_tokens) if self.first_tokens else None


def _hist(bounds: Sequence[float], values: Sequence[tuple[float, int]]) -> Histogram:
    counts = [0.0] * len(bounds)
    total = 0.0
    n = 0
    for value, count in values:
        for i, bound in enumerate(bounds):
            if value <= bound:
                counts[i] += count
                break
        total += value * count
        n += count
    cum, acc = [], 0.0
    for c in counts:
        acc += c
        cum.append(acc)
    return Histogram(tuple(bounds), tuple(cum), total, float(n))


def recorded(scrapes: Sequence[Scrape]) -> Outcome:
    """The same metrics measured from the recording itself."""
    ok = [s for s in scrapes if s.snapshot is not None]
    seconds = ok[-1].ts - ok[0].ts if len(ok) > 1 else 0.0
    itl = histogram_delta(ok, "inter_token_latency_seconds")
    ttft = histogram_delta(ok, "time_to_first_token_seconds")

    def inc(concept: str) -> float | None:
        vals = [(s.snapshot.value(concept), s.snapshot) for s in ok if s.snapshot is not None]
        if len(vals) < 2 or any(v is None for v, _ in vals):
            return None
        return sum(counter_step(a or 0.0, b or 0.0, restarted(sa, sb)) for (a, sa), (b, sb) in zip(vals, vals[1:]))

    gen, pre = inc("generation_tokens"), inc("num_preemptions")
    waiting = [w for s in ok if s.snapshot is not None and (w := s.snapshot.value("num_requests_waiting")) is not None]
    return Outcome({
        "itl_p50_seconds": histogram_quantile(0.5, itl), "itl_p95_seconds": histogram_quantile(0.95, itl),
        "itl_p99_seconds": histogram_quantile(0.99, itl), "itl_p999_seconds": histogram_quantile(0.999, itl),
        "ttft_p50_seconds": histogram_quantile(0.5, ttft),
        "ttft_p95_seconds": histogram_quantile(0.95, ttft),
        "output_tokens_per_second": gen / seconds if gen is not None and seconds > 0 else None,
        "preemptions_per_minute": pre / seconds * 60 if pre is not None and seconds > 0 else None,
        "max_num_requests_waiting": max(waiting) if waiting else None,
    })


def bucket_bounds(scrapes: Sequence[Scrape], concept: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """The bucket bounds the window's histogram of ``concept`` has (``default`` when it has none)."""
    for s in scrapes:
        if s.snapshot is not None and (h := s.snapshot.histogram(concept)) is not None:
            return h.bounds
    return default


@dataclass(slots=True)
class _Replay:
    engine: SimEngine
    prefix_hit_fraction: float
    n: int
    max_model_len: int
    rng: random.Random
    prefix: list[int]
    rejected: int = 0

    submitted: int = 0
    body: int = 0

    def submit(self, prompt_len: int, output_len: int) -> None:
        """One request of the trace. vLLM counts each of a request's n samples as a request of its
        own (request_success, the length histograms and the held gauges all do), so the trace holds
        the samples: each is replayed as one sequence, and each run of n consecutive ones shares
        its prompt (siblings share prompt blocks through the prefix cache, as n > 1 does)."""
        if prompt_len + output_len > self.max_model_len:
            self.rejected += 1  # vLLM answers 400: longer than --max-model-len
            return
        if self.submitted % self.n == 0:
            self.body = self.rng.randrange(1 << 40)
        self.submitted += 1
        shared = min(prompt_len - 1, round(self.prefix_hit_fraction * prompt_len), len(self.prefix))
        prompt = self.prefix[:shared] + list(range(self.body, self.body + prompt_len - shared))
        self.engine.add_request(prompt, output_len, 1)


def _lengths(workload: InferredWorkload, rng: random.Random, served_len: int) -> list[tuple[int, int]]:
    """The requests' (prompt, output) lengths in arrival order: the reconstructed trace, or (without
    one) pairs drawn from the two histograms that the server as it ran would have served."""
    if workload.requests:
        return [(r.prompt, r.output) for r in workload.requests]
    count = max(len(workload.arrivals), 1) * 4
    pairs = list(zip(workload.prompt.sample(rng, count * 2), workload.output.sample(rng, count * 2)))
    return [(p, o) for p, o in pairs if p + o <= served_len][:count] or [(1, 1)]


def replay(workload: InferredWorkload, calibration: Calibration, flags: Flags, *, seed: int = 0,
           itl_bounds: Sequence[float] = ITL_BOUNDS, ttft_bounds: Sequence[float] = TTFT_BOUNDS,
           served_len: int | None = None, until: float | None = None) -> Outcome:
    """The window's workload on the simulated engine under ``flags``, for the window's length;
    ``served_len`` is the --max-model-len the window was served under (requests beyond it never came).
    Open arrivals replay the reconstructed trace; a closed loop replays its clients, each sending its
    next request (the trace's lengths in turn) when the last one answered."""
    served_len = served_len or flags.max_model_len
    config = EngineConfig(block_size=flags.block_size, num_gpu_blocks=flags.num_gpu_blocks,
                          max_num_seqs=flags.max_num_seqs, max_num_batched_tokens=flags.max_num_batched_tokens,
                          max_model_len=max(flags.max_model_len, served_len),
                          enable_prefix_caching=flags.enable_prefix_caching, step_cost=calibration.cost.reseeded(seed))
    engine = SimEngine(config)
    rng = random.Random(seed)
    lengths = _lengths(workload, rng, served_len)
    longest = max(p for p, _ in lengths)
    run = _Replay(engine, workload.prefix_hit_fraction, max(1, round(workload.n)), flags.max_model_len, rng,
                  [rng.randrange(10, 30000) for _ in range(longest)])
    itl: list[tuple[float, int]] = []
    first: list[tuple[float, int]] = []
    generated = preemptions = 0
    max_waiting = max_running = 0
    clients = workload.closed_loop_clients
    if clients is None:
        times = [r.arrival for r in workload.requests] if workload.requests else list(workload.arrivals)
        pending = list(zip(times, lengths if workload.requests else
                           [lengths[i % len(lengths)] for i in range(len(times))]))
    else:
        pending = []
        for i in range(clients):
            run.submit(*lengths[i % len(lengths)])
    turn = clients or 0
    horizon = workload.seconds if until is None else min(workload.seconds, until)
    i = 0

    def account(stats: StepStats) -> None:
        nonlocal generated, preemptions, max_waiting, max_running
        if stats.now > horizon + 1e-9:
            return
        generated += stats.generation_tokens
        preemptions += stats.num_preemptions
        max_waiting = max(max_waiting, stats.num_waiting)
        max_running = max(max_running, stats.num_running)
        itl.extend((v, 1) for v in stats.itl)
        itl.extend(stats.itl_weighted)
        first.extend((v, stats.num_running) for v in stats.ttft)

    def arrive() -> float:
        """The next request of the trace arrives (while the engine fast-forwards past it)."""
        nonlocal i
        run.submit(*pending[i][1])
        i += 1
        return pending[i][0] if i < len(pending) else math.inf

    while engine.now < horizon:
        while i < len(pending) and pending[i][0] <= engine.now:
            arrive()
        if engine.idle():
            if i >= len(pending):
                break
            engine.advance_idle(pending[i][0])
            continue
        nxt = pending[i][0] if i < len(pending) else math.inf
        stats = engine.fast_forward(horizon, next_arrival=nxt, arrive=arrive,
                                    stop_at_finish=clients is not None) or engine.step()
        account(stats)
        if clients is not None and engine.now <= (workload.closed_loop_until or horizon):
            for _ in stats.finished:
                run.submit(*lengths[turn % len(lengths)])
                turn += 1
    itl_h = _hist(itl_bounds, itl)
    seconds = horizon
    return Outcome({
        "itl_p50_seconds": histogram_quantile(0.5, itl_h), "itl_p95_seconds": histogram_quantile(0.95, itl_h),
        "itl_p99_seconds": histogram_quantile(0.99, itl_h), "itl_p999_seconds": histogram_quantile(0.999, itl_h),
        **_ttft_metrics(first, lambda _: calibration.ttft_offset, ttft_bounds),
        "output_tokens_per_second": generated / seconds if seconds > 0 else None,
        "preemptions_per_minute": preemptions / seconds * 60 if seconds > 0 else None,
        "max_num_requests_waiting": float(max_waiting),
    }, run.rejected, max_running, tuple(first))


def streams_scaled(outcome: Outcome, offset: float, per_stream_at: float,
                   ttft_bounds: Sequence[float] = TTFT_BOUNDS) -> Outcome:
    """``outcome`` with the API server's share of each TTFT grown with the streams in flight:
    ``offset`` (the share the window showed) × the sequences running at that first token over
    ``per_stream_at`` (how many ran, on average, at the window's own first tokens), never below
    ``offset``. The API server takes in, detokenizes and streams every request on one event loop,
    so its share grows with what runs at once; a window that ran few at a time cannot say how fast.
    Only the TTFT metrics change."""
    if not outcome.first_tokens or per_stream_at <= 0:
        return outcome
    grown = _ttft_metrics(outcome.first_tokens, lambda running: offset * max(1.0, running / per_stream_at),
                          ttft_bounds)
    return Outcome({**outcome.metrics, **grown}, outcome.requests_rejected, outcome.max_running,
                   outcome.first_tokens)


def _ttft_metrics(first: Sequence[tuple[float, int]], share: Callable[[int], float],
                  bounds: Sequence[float]) -> dict[str, float | None]:
    """TTFT p50 and p95 of the replayed first tokens, each with the API server's ``share`` (given
    the sequences running at it) added to its time in the engine."""
    h = _hist(bounds, [(v + share(running), 1) for v, running in first])
    return {"ttft_p50_seconds": histogram_quantile(0.5, h), "ttft_p95_seconds": histogram_quantile(0.95, h)}
