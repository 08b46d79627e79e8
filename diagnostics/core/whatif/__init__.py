"""What-if: the predicted effect of a flag change, from the simulated engine replaying a window.

Three steps, each pure and each reporting how well it fits the window it came from:

1. :func:`infer_workload`: the arrival process and the request shapes from the scrapes alone.
   Arrivals per interval are the requests that finished plus the change in requests held
   (running + waiting); prompt and output lengths come from the ``request_prompt_tokens`` /
   ``request_generation_tokens`` histograms (bucket shares, scaled to the exact mean the ``_sum``
   gives); n from ``request_params_n``; prefix sharing from the hit/query counters. A window whose
   held requests stay level while requests keep finishing is a closed loop (clients that send the
   next request when the last one answers) and is replayed as that many clients: raising the cap
   then raises throughput, as it would on the real server, instead of only draining a queue.
2. :func:`calibrate`: the engine's step time as ``base + per_seq × sequences + per_prefill ×
   prefill tokens`` fitted to the window's ITL (the mean gap between tokens is the mean step time
   while decoding) against the running count and the prefill tokens per step; the KV block budget
   from ``cache_config_info``. A CPU-served test model and an H100 both start from what they
   showed, not from a preset. The fit's error on the window's own intervals is reported.
3. :func:`predict`: the window replayed on :class:`~diagnostics.core.simulator.engine.SimEngine` (vLLM's
   scheduler over the real block allocator) under the current flags, and under the change; the
   metrics on both sides are computed the way the dashboard computes them from a server (the same
   histogram buckets, the same interpolation), so "before" is comparable with the recording.

Flags the simulator models are in :data:`MODELLED`; any other is "not modelled", never guessed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from diagnostics.core.diagnosis.types import Finding
from diagnostics.core.metrics.catalog import CacheConfig, Histogram
from diagnostics.core.metrics.derive import (
    Scrape,
    counter_step,
    histogram_delta,
    histogram_quantile,
    labels_total,
    restarted,
)
from diagnostics.core.simulator.engine import EngineConfig, SimEngine, StepStats

# --max-num-seqs … as the suggestions and the CLI spell them → the EngineConfig field they set.
MODELLED = {
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--num-gpu-blocks-override": "num_gpu_blocks",
    "--kv-cache-memory-bytes": "num_gpu_blocks",
    "--gpu-memory-utilization": "num_gpu_blocks",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--block-size": "block_size",
    "--kv-cache-dtype": "num_gpu_blocks",
    "--max-model-len": "max_model_len",
}
# itl_p999: the longest gaps a user sees (a head-of-line stall), which smaller prefill chunks cut even
# where they raise p99 (more steps carry a piece of the prompt).
METRICS = ("itl_p50_seconds", "itl_p95_seconds", "itl_p99_seconds", "itl_p999_seconds", "ttft_p50_seconds",
           "ttft_p95_seconds", "output_tokens_per_second", "preemptions_per_minute", "max_num_requests_waiting")
# The dashboard's buckets when the recording has none (vLLM 0.32's own bounds).
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
              80.0, math.inf)
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0, 160.0, 640.0, 2560.0, math.inf)


class NotModelled(ValueError):
    """A flag the simulator does not model, or a value it cannot apply to this server."""


# -- 1. the workload ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Request lengths as the histogram shows them: the share of each bucket, the exact mean."""

    mean: float
    buckets: tuple[tuple[float, float, float], ...]  # (low, high, share), shares summing to 1

    @classmethod
    def from_histogram(cls, hist: Histogram | None) -> LengthDist | None:
        if hist is None or hist.count <= 0:
            return None
        out = []
        low, prev = 0.0, 0.0
        for bound, cum in zip(hist.bounds, hist.cumulative):
            share = (cum - prev) / hist.count
            if share > 0:
                high = bound if math.isfinite(bound) else max(low * 2, hist.sum / hist.count)
                out.append((low, high, share))
            low, prev = bound, cum
        return cls(hist.sum / hist.count, tuple(out))

    def position(self) -> float:
        """Where in its bucket every value sits (0: at the bucket's low edge, 1: at its bound) so that
        the mean is the histogram's exact one: values stay inside the buckets the server counted them
        in. A bimodal workload (short chat prompts, a few 1,900-token documents) keeps both modes."""
        fixed = sum(share * low for low, _, share in self.buckets)
        width = sum(share * (high - low) for low, high, share in self.buckets)
        return min(1.0, max(0.0, (self.mean - fixed) / width)) if width > 0 else 1.0

    def values(self) -> list[tuple[float, float]]:
        """``(value, share)`` per bucket, at :meth:`position`."""
        f = self.position()
        return [(low + f * (high - low), share) for low, high, share in self.buckets]

    def sample(self, rng: random.Random, count: int) -> list[int]:
        """``count`` lengths drawn bucket by bucket, each at :meth:`position` (± 5 % inside its bucket)."""
        if count <= 0:
            return []
        values = self.values()
        picks = rng.choices(values, weights=[share for _, share in values], k=count)
        return [max(1, round(v * rng.uniform(0.95, 1.05))) for v, _ in picks]

    def to_json(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 1),
                "buckets": [{"le": high, "share": round(share, 3)} for _, high, share in self.buckets]}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request as the window's histograms place it: when it arrived (seconds from the window's
    start) and its prompt and output lengths."""

    arrival: float
    prompt: int
    output: int
    finished: bool  # it finished inside the window (its lengths were counted); else drawn from the others


@dataclass(frozen=True, slots=True)
class InferredWorkload:
    """What arrived in the window, as the simulator replays it."""

    seconds: float
    arrivals: tuple[float, ...]  # seconds from the window's start; requests held at its start arrive at 0
    prompt: LengthDist
    output: LengthDist
    n: float  # mean parallel samples per request
    prefix_hit_fraction: float  # of prompt tokens, served from the prefix cache
    closed_loop_clients: int | None  # a closed loop of this many clients; None: open arrivals
    requests_finished: float
    closed_loop_until: float | None = None  # seconds from the start: the clients stopped sending after it
    requests: tuple[TraceRequest, ...] = ()  # the reconstructed trace, by arrival
    max_tokens_mean: float | None = None

    @property
    def rate_per_s(self) -> float:
        count = len(self.requests) or len(self.arrivals)
        return count / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "requests_arrived": len(self.requests) or len(self.arrivals),
                "arrival_rate_per_s": round(self.rate_per_s, 3), "requests_finished": self.requests_finished,
                "shape": "closed loop" if self.closed_loop_clients else "open",
                "closed_loop_clients": self.closed_loop_clients,
                "closed_loop_until_seconds": None if self.closed_loop_until is None else round(self.closed_loop_until, 3),
                "prompt_tokens": self.prompt.to_json(),
                "output_tokens": self.output.to_json(), "n": round(self.n, 3),
                "prefix_hit_fraction": round(self.prefix_hit_fraction, 3), "max_tokens_mean": self.max_tokens_mean,
                "requests_reconstructed": sum(1 for r in self.requests if r.finished),
                "requests_still_in_flight": sum(1 for r in self.requests if not r.finished)}


def _held(snap: Any) -> float | None:
    running, waiting = snap.value("num_requests_running"), snap.value("num_requests_waiting")
    if running is None or waiting is None:
        return None
    return running + waiting


def infer_workload(scrapes: Sequence[Scrape], closed_loop_cv: float = 0.2) -> InferredWorkload | None:
    """The window's workload (None when the server exports too little: no finished-request counter,
    no running/waiting gauges or no length histograms, or nothing arrived)."""
    ok = [s for s in scrapes if s.snapshot is not None]
    if len(ok) < 3:
        return None
    t0, t1 = ok[0].ts, ok[-1].ts
    prompt = LengthDist.from_histogram(histogram_delta(ok, "request_prompt_tokens"))
    output = LengthDist.from_histogram(histogram_delta(ok, "request_generation_tokens"))
    finished_total = labels_total("request_success")
    held0 = _held(ok[0].snapshot)
    if prompt is None or output is None or held0 is None:
        return None
    n_hist = histogram_delta(ok, "request_params_n")
    n = n_hist.sum / n_hist.count if n_hist is not None and n_hist.count else 1.0
    # Counted as vLLM counts them: each of a request's n samples is a request of its own (finished,
    # held, histograms), so the trace is of samples (see _Replay.submit).
    arrivals: list[float] = [0.0] * round(held0)
    finished = 0.0
    held_series: list[float | None] = []  # None: the gauges read 0 while tokens flowed (no reading)
    done_series: list[float] = []  # requests finished in each interval
    ends: list[float] = []
    blind: list[tuple[float, float]] = []
    for a, b in zip(ok, ok[1:]):
        sa, sb = a.snapshot, b.snapshot
        assert sa is not None and sb is not None
        fa, fb = finished_total(sa), finished_total(sb)
        ha, hb = _held(sa), _held(sb)
        if fa is None or fb is None or ha is None or hb is None:
            continue
        done = counter_step(fa, fb, restarted(sa, sb))
        finished += done
        generated = counter_step(sa.value("generation_tokens") or 0.0, sb.value("generation_tokens") or 0.0,
                                 restarted(sa, sb))
        if ha == 0 and hb == 0 and generated > 0 and done > 0:
            # Requests finished and tokens flowed while both gauges read 0 (vLLM 0.32 can report 0 for
            # seconds after start and on a frontend-bound host): the held count says nothing here, so
            # these requests keep the arrival their own latency gives (see _trace).
            blind.append((a.ts - t0, b.ts - t0))
            held_series.append(None)
            done_series.append(done)
            ends.append(b.ts - t0)
            continue
        came = max(0, round(done + hb - ha))
        # Spread the interval's arrivals evenly inside it (the scrapes cannot say when within).
        arrivals += [a.ts - t0 + (i + 0.5) * (b.ts - a.ts) / came for i in range(came)]
        held_series.append(hb)
        done_series.append(done)
        ends.append(b.ts - t0)
    if not arrivals and not blind:
        return None
    hits = queries = 0.0
    for a, b in zip(ok, ok[1:]):
        sa, sb = a.snapshot, b.snapshot
        assert sa is not None and sb is not None
        for concept in ("prefix_cache_hits", "prefix_cache_queries"):
            va, vb = sa.value(concept), sb.value(concept)
            if va is not None and vb is not None:
                step = counter_step(va, vb, restarted(sa, sb))
                hits, queries = (hits + step, queries) if concept == "prefix_cache_hits" else (hits, queries + step)
    max_tokens = histogram_delta(ok, "request_params_max_tokens")
    loop = _closed_loop(held_series, done_series, closed_loop_cv)
    held_end = _held(ok[-1].snapshot) or 0.0
    requests = _trace(ok, arrivals, round(held_end), prompt, output, blind)
    return InferredWorkload(
        seconds=t1 - t0, arrivals=tuple(sorted(arrivals)), prompt=prompt, output=output, n=n,
        prefix_hit_fraction=min(1.0, hits / queries) if queries > 0 else 0.0,
        closed_loop_clients=loop[0] if loop else None,
        requests_finished=finished,
        closed_loop_until=ends[loop[1]] if loop else None,
        requests=tuple(requests),
        max_tokens_mean=max_tokens.sum / max_tokens.count if max_tokens is not None and max_tokens.count else None,
    )


def _expand(hist: Histogram | None, count: int) -> list[float]:
    """``count`` values, one per observation of an interval's histogram, each inside the bucket it
    was counted in, at the position that gives the interval's exact mean."""
    dist = LengthDist.from_histogram(hist)
    if dist is None or count <= 0 or hist is None:
        return []
    out: list[float] = []
    prev = 0.0
    f = dist.position()
    low = 0.0
    for bound, cum in zip(hist.bounds, hist.cumulative):
        n = round(cum - prev)
        high = bound if math.isfinite(bound) else max(low * 2, dist.mean)
        out += [low + f * (high - low)] * n
        low, prev = bound, cum
    return (out + [dist.mean] * count)[:count]


def _trace(ok: Sequence[Scrape], arrivals: Sequence[float], held_end: int, prompt: LengthDist, output: LengthDist,
           blind: Sequence[tuple[float, float]] = (), seed: int = 0) -> list[TraceRequest]:
    """The requests of the window, rebuilt interval by interval: those that finished in an interval
    carry the prompt, output and end-to-end buckets counted in it (one request per interval is exact;
    several are paired longest output with longest latency). Arrival = finish − end-to-end latency;
    one that began before the window replays only its share of output inside it. Requests still
    held at the end get lengths drawn from the finished ones, in proportion to how long each stayed;
    arrival times then come from the per-interval counts (``arrivals``: finished + held changes)."""
    rng = random.Random(seed)
    t0 = ok[0].ts
    out: list[TraceRequest] = []
    shapes: list[tuple[int, int, float]] = []  # (prompt, output, end-to-end) of each finished request
    for a, b in zip(ok, ok[1:]):
        pair = [a, b]
        outputs = histogram_delta(pair, "request_generation_tokens")
        k = round(outputs.count) if outputs is not None else 0
        if k <= 0:
            continue
        o_vals = sorted(_expand(outputs, k))
        e_vals = sorted(_expand(histogram_delta(pair, "e2e_request_latency_seconds"), k))
        p_vals = _expand(histogram_delta(pair, "request_prompt_tokens"), k)
        rng.shuffle(p_vals)
        finish = (a.ts + b.ts) / 2 - t0
        for i in range(k):
            out_len = max(1, round(o_vals[i]))
            e2e = e_vals[i] if i < len(e_vals) else 0.0
            shapes.append((max(1, round(p_vals[i])) if i < len(p_vals) else 1, out_len, max(e2e, 1e-3)))
            arrival = finish - e2e
            if arrival < 0 and e2e > 0:  # in flight when the window began: only its rest is replayed
                out_len = max(1, round(out_len * finish / e2e))
                arrival = 0.0
            out.append(TraceRequest(max(0.0, arrival), max(1, round(p_vals[i])) if i < len(p_vals) else 1, out_len,
                                    True))
    # When requests arrived is better known in bulk than one by one: the counters say how many came
    # in each interval (``arrivals``), a latency bucket only roughly when each did. So the rebuilt
    # requests, and those still held at the end (lengths drawn from the finished ones), take those
    # arrival slots in the order their own estimates give.
    # Requests whose own estimate falls in an interval where the gauges read 0 keep it (no count
    # there to place them by).
    kept = [r for r in out if any(lo <= r.arrival <= hi for lo, hi in blind)]
    out = [r for r in out if r not in kept]
    slots = sorted(arrivals)
    # Every request of the window either finished in it (rebuilt above) or is still held at its end.
    late_count = held_end
    if shapes:
        # A request still held at the end is more likely a long-lived kind (Little's law): drawn from
        # the finished ones in proportion to how long each stayed.
        drawn = [(p, o) for p, o, _ in rng.choices(shapes, weights=[e for *_, e in shapes], k=late_count)]
    else:
        drawn = list(zip(prompt.sample(rng, late_count), output.sample(rng, late_count)))
    last = slots[-1] if slots else (out[-1].arrival if out else 0.0)
    everyone = sorted(out, key=lambda r: r.arrival) + [TraceRequest(last, p, o, False) for p, o in drawn]
    placed = [replace(r, arrival=slots[i]) if i < len(slots) else r for i, r in enumerate(everyone)]
    return sorted(placed + kept, key=lambda r: r.arrival)


def _closed_loop(held: Sequence[float | None], done: Sequence[float], max_cv: float) -> tuple[int, int] | None:
    """Clients in a closed loop, and the interval after which they stopped sending: requests held
    stay level (within ``max_cv`` of that level) over at least half of the loaded part of the window,
    and while they stayed level at least a round of requests finished (each replaced by the next,
    which a burst draining or a queue building never does); a drain at the end (the clients stopped)
    is left out. The level is the upper quartile of the held counts: on a busy 2-core host vLLM's
    gauges sometimes read low (never high) for a scrape or two."""
    busy = sorted(h for h in held if h)
    if len(busy) < 5:
        return None
    level = busy[(3 * len(busy)) // 4]
    plateau = [i for i, h in enumerate(held) if h and abs(h - level) <= max_cv * level]
    replaced = sum(done[i] for i in plateau)
    if level < 2 or len(plateau) < 0.5 * len(busy) or replaced < level:
        return None
    return round(level), plateau[-1]


# -- 2. calibration ----------------------------------------------------------------------------


class StepCost:
    """Seconds per engine step: ``base + per_seq × sequences + per_prefill_token × prefill tokens``,
    times a factor drawn from the window's own spread of step times around that fit (a busy host or
    a noisy neighbour makes some seconds slower; the percentiles come from that spread)."""

    def __init__(self, base: float, per_seq: float, per_prefill_token: float,
                 spread: Sequence[float] = (1.0,), seed: int = 0) -> None:
        self.base, self.per_seq, self.per_prefill_token = base, per_seq, per_prefill_token
        self.spread = tuple(spread) or (1.0,)
        self._rng = random.Random(seed)
        # The order in which step numbers draw from the spread: a seeded shuffle, cycled.
        self._order = list(range(len(self.spread))) * 4
        self._rng.shuffle(self._order)

    def fitted(self, prefill_tokens: float, num_seqs: float) -> float:
        return self.base + self.per_seq * num_seqs + self.per_prefill_token * prefill_tokens

    def seconds(self, prefill_tokens: int, num_seqs: int, context_tokens: int, step: int | None = None) -> float:
        """One step's seconds; ``step`` (the engine's step number) picks the noise factor, so the same
        step costs the same whether it is simulated alone or fast-forwarded with others."""
        if len(self.spread) == 1:
            return self.fitted(prefill_tokens, num_seqs) * self.spread[0]
        if step is None:
            factor = self.spread[self._rng.randrange(len(self.spread))]
        else:
            factor = self.spread[self._order[step % len(self._order)]]
        return self.fitted(prefill_tokens, num_seqs) * factor

    def reseeded(self, seed: int) -> StepCost:
        return StepCost(self.base, self.per_seq, self.per_prefill_token, self.spread, seed)


@dataclass(frozen=True, slots=True)
class Calibration:
    cost: StepCost
    num_gpu_blocks: int
    block_size: int
    enable_prefix_caching: bool
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float | None
    cache_dtype: str | None
    fit_error: float | None  # step-weighted mean |fitted − observed| / observed step time, before the spread
    points: int
    batch_identified: bool  # the running count varied enough to tell the per-sequence cost from the base
    max_running: float  # the most requests the window saw running
    # Seconds of a request's time spent outside the engine's queue and steps (the API server's
    # tokenizing, routing and streaming), added to every replayed TTFT: see _ttft_offset.
    ttft_offset: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"step_seconds": {"base": self.cost.base, "per_sequence": self.cost.per_seq,
                                 "per_prefill_token": self.cost.per_prefill_token},
                "step_time_spread": {"p10": _q(self.cost.spread, 0.1), "p50": _q(self.cost.spread, 0.5),
                                     "p90": _q(self.cost.spread, 0.9)},
                "per_sequence_cost_identified": self.batch_identified,
                "num_gpu_blocks": self.num_gpu_blocks, "block_size": self.block_size,
                "step_time_fit_error": None if self.fit_error is None else round(self.fit_error, 3),
                "intervals_fitted": self.points, "ttft_outside_engine_seconds": round(self.ttft_offset, 4)}


def _q(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares, non-negative by dropping the terms that come out negative."""
    import numpy as np

    a_all, y = np.array(rows, dtype=float), np.array(ys, dtype=float)
    cols = list(range(a_all.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a_all[:, cols], y, rcond=None)
        if (coef >= 0).all() or len(cols) == 1:
            out = [0.0] * a_all.shape[1]
            for c, v in zip(cols, coef):
                out[c] = max(0.0, float(v))
            return out
        cols = [c for c, v in zip(cols, coef) if v >= 0] or cols[:1]


def _spread(decode_itl: Histogram | None, seed: int, size: int = 400) -> tuple[float, ...]:
    """Step time over its mean, as often as the ITL histogram of the window's decode-only intervals
    shows each: the gap between two tokens of a request is one engine step, so that histogram is the
    distribution of decode step times (prefill steps are the fitted model's, not noise). Drawn within
    buckets, scaled to a mean of 1."""
    dist = LengthDist.from_histogram(decode_itl)
    if dist is None or dist.mean <= 0 or len(dist.buckets) < 2:
        return (1.0,)
    rng = random.Random(seed)
    values = dist.values()
    raw = [v for v, _ in rng.choices(values, weights=[share for _, share in values], k=size)]
    mean = sum(raw) / len(raw)
    return tuple(v / mean for v in raw) if mean > 0 else (1.0,)


def calibrate(scrapes: Sequence[Scrape], config: CacheConfig | None, seed: int = 0) -> Calibration | None:
    """The step-time model fitted to the window. Each busy interval's time is the sum of its steps'
    times: ``seconds = base × steps + per_seq × sequence-steps + per_prefill × prefill tokens``, with
    the steps from the ``iteration_tokens`` count, the sequence-steps from the generated tokens and
    the prefill tokens from the rest of the step tokens (a step still running when an interval ends
    carries its time to the next). Least squares, non-negative, then refitted without the fifth of
    intervals that fit worst when they are far off (a warming-up server, a neighbour's burst): the
    noise they carry is kept in the spread instead. None without steps while requests run, or
    without the KV block budget from ``cache_config_info``."""
    ok = [s for s in scrapes if s.snapshot is not None]
    if config is None or not config.num_gpu_blocks or not config.block_size:
        return None
    rows: list[tuple[float, float, float]] = []  # (steps, sequence-steps, prefill tokens)
    times: list[float] = []
    running_seen: list[float] = []
    decode_itl: Histogram | None = None
    carried = 0.0  # busy seconds of intervals in which no step finished (one long step spans them)
    for a, b in zip(ok, ok[1:]):
        sa, sb = a.snapshot, b.snapshot
        assert sa is not None and sb is not None
        steps = histogram_delta([a, b], "iteration_tokens")
        ra, rb = sa.value("num_requests_running"), sb.value("num_requests_running")
        if ra is not None:
            running_seen.append(ra)
        if restarted(sa, sb) or steps is None:
            carried = 0.0
            continue
        generated = counter_step(sa.value("generation_tokens") or 0.0, sb.value("generation_tokens") or 0.0, False)
        if steps.count < 1:
            carried = carried + b.ts - a.ts if ra and rb else 0.0  # one long step still running
            continue
        batch = generated / steps.count  # sequences decoded per step: the running gauge can read 0 mid-burst
        if not (ra and rb) and batch < 2:
            carried = 0.0
            continue  # possibly idle for part of the interval: its steps do not time one step each
        prefill = max(0.0, steps.sum - generated)
        rows.append((steps.count, generated, prefill))
        times.append(b.ts - a.ts + carried)
        carried = 0.0
        itl = histogram_delta([a, b], "inter_token_latency_seconds")
        if itl is not None and prefill / steps.count < max(16.0, 0.1 * batch):
            decode_itl = itl if decode_itl is None else decode_itl.plus(itl)
    if len(rows) < 2:
        return None
    batches = [g / n for n, g, _ in rows]
    per_step_prefill = [p / n for n, _, p in rows]
    batch_identified = max(batches) - min(batches) >= 2
    prefill_identified = max(per_step_prefill) - min(per_step_prefill) >= 16
    design = [(n, g if batch_identified else 0.0, p if prefill_identified else 0.0) for n, g, p in rows]

    def fit(keep: Sequence[int]) -> tuple[float, float, float]:
        b, s, p = _least_squares([design[i] for i in keep], [times[i] for i in keep])
        return b, s, p

    def misfit(coef: tuple[float, float, float], i: int) -> float:
        n, g, p = design[i]
        return abs(coef[0] * n + coef[1] * g + coef[2] * p - times[i]) / times[i]

    keep = list(range(len(rows)))
    coef = fit(keep)
    if len(rows) >= 10:
        errors = sorted((misfit(coef, i), i) for i in keep)
        typical = errors[len(errors) // 2][0]
        drop = {i for e, i in errors[-len(errors) // 5:] if e > max(0.5, 3 * typical)}
        if drop:
            keep = [i for i in keep if i not in drop]
            coef = fit(keep)
    # The trimmed fit gives the shape (what a sequence and a prefill token cost against a step); the
    # window's whole busy time sets the level, so the replay serves at the rate the window served.
    fitted_all = sum(coef[0] * n + coef[1] * g + coef[2] * p for n, g, p in design)
    level = sum(times) / fitted_all if fitted_all > 0 else 1.0
    coef = (coef[0] * level, coef[1] * level, coef[2] * level)
    base, per_seq, per_prefill = coef
    total = sum(times[i] for i in keep)
    error = sum(misfit(coef, i) * times[i] for i in keep) / total if total > 0 else None
    cost = StepCost(base, per_seq, per_prefill, _spread(decode_itl, seed), seed)
    return Calibration(cost, config.num_gpu_blocks, config.block_size, bool(config.enable_prefix_caching),
                       config.kv_cache_memory_bytes, config.gpu_memory_utilization, config.cache_dtype, error,
                       len(keep), batch_identified, max(running_seen, default=0.0), _ttft_offset(ok))


def _ttft_offset(scrapes: Sequence[Scrape]) -> float:
    """Seconds a request spends outside the engine's queue and steps (the API server tokenizing,
    routing, streaming): mean end-to-end latency minus mean queue time minus mean inference time,
    all three observed when each request finishes, so over the same requests (0 when any is missing)."""
    means = []
    for concept in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds"):
        hist = histogram_delta(scrapes, concept)
        if hist is None or not hist.count:
            return 0.0
        means.append(hist.sum / hist.count)
    return max(0.0, means[0] - means[1] - means[2])


# -- 3. replay and predict ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Flags:
    """The scheduler and cache flags a replay runs under."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_size: int
    enable_prefix_caching: bool
    max_model_len: int


def apply(flags: Flags, calibration: Calibration, changes: Mapping[str, str | float | int | bool]) -> Flags:
    """``flags`` with ``changes`` (``{"--max-num-seqs": 16}``) applied; :class:`NotModelled` for a flag
    the simulator does not model or a value it cannot turn into a block budget here."""
    out = flags
    for flag, raw in changes.items():
        if flag not in MODELLED:
            raise NotModelled(f"{flag} is not modelled by the simulated engine (it models: "
                              f"{', '.join(sorted(MODELLED))})")
        value = str(raw)
        try:
            if flag == "--max-num-seqs":
                out = replace(out, max_num_seqs=int(float(value)))
            elif flag == "--max-num-batched-tokens":
                out = replace(out, max_num_batched_tokens=int(float(value)))
            elif flag == "--max-model-len":
                out = replace(out, max_model_len=int(float(value)))
            elif flag == "--num-gpu-blocks-override":
                out = replace(out, num_gpu_blocks=int(float(value)))
            elif flag == "--block-size":
                size = int(float(value))
                out = replace(out, block_size=size, num_gpu_blocks=max(1, out.num_gpu_blocks * out.block_size // size))
            elif flag == "--kv-cache-memory-bytes":
                if not calibration.kv_cache_memory_bytes:
                    raise NotModelled("--kv-cache-memory-bytes: the server's current KV size in bytes is unknown "
                                      "(cache_config_info has no kv_cache_memory_bytes), so blocks per byte are too")
                per_block = calibration.kv_cache_memory_bytes / calibration.num_gpu_blocks
                out = replace(out, num_gpu_blocks=max(1, int(float(value) / per_block)))
            elif flag == "--gpu-memory-utilization":
                now = calibration.gpu_memory_utilization
                if not now or calibration.kv_cache_memory_bytes:
                    raise NotModelled("--gpu-memory-utilization: the KV cache is pinned by --kv-cache-memory-bytes "
                                      "(vLLM ignores the utilization for its size)" if calibration.kv_cache_memory_bytes
                                      else "--gpu-memory-utilization: the current utilization is unknown")
                # The weights' share of the device is unknown here: scaling the blocks with the whole
                # budget understates the gain (the weights do not grow), so this is a lower bound.
                out = replace(out, num_gpu_blocks=max(1, int(out.num_gpu_blocks * float(value) / now)))
            elif flag == "--kv-cache-dtype":
                if value.startswith("fp8") and (calibration.cache_dtype or "auto") in ("auto", "bfloat16", "float16"):
                    out = replace(out, num_gpu_blocks=out.num_gpu_blocks * 2)
                elif not value.startswith("fp8"):
                    raise NotModelled(f"--kv-cache-dtype {value}: only fp8 (half the bytes per token) is modelled")
            elif flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
                on = value.lower() not in ("false", "0", "no", "off") and flag == "--enable-prefix-caching"
                out = replace(out, enable_prefix_caching=on)
        except ValueError as exc:
            if isinstance(exc, NotModelled):
                raise
            raise NotModelled(f"{flag} {value}: not a number") from exc
    return out


@dataclass(slots=True)
class Outcome:
    """The metrics of one replay (or of the recording), on the dashboard's own histogram buckets."""

    metrics: dict[str, float | None]
    requests_rejected: int = 0  # longer than --max-model-len


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


def _bounds(scrapes: Sequence[Scrape], concept: str, default: tuple[float, ...]) -> tuple[float, ...]:
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
           served_len: int | None = None) -> Outcome:
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
    ttft: list[tuple[float, int]] = []
    generated = preemptions = 0
    max_waiting = 0
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
    horizon = workload.seconds
    i = 0

    def account(stats: StepStats) -> None:
        nonlocal generated, preemptions, max_waiting
        if stats.now > horizon + 1e-9:
            return
        generated += stats.generation_tokens
        preemptions += stats.num_preemptions
        max_waiting = max(max_waiting, stats.num_waiting)
        itl.extend((v, 1) for v in stats.itl)
        itl.extend(stats.itl_weighted)
        ttft.extend((v + calibration.ttft_offset, 1) for v in stats.ttft)

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
    itl_h, ttft_h = _hist(itl_bounds, itl), _hist(ttft_bounds, ttft)
    seconds = workload.seconds
    return Outcome({
        "itl_p50_seconds": histogram_quantile(0.5, itl_h), "itl_p95_seconds": histogram_quantile(0.95, itl_h),
        "itl_p99_seconds": histogram_quantile(0.99, itl_h), "itl_p999_seconds": histogram_quantile(0.999, itl_h),
        "ttft_p50_seconds": histogram_quantile(0.5, ttft_h),
        "ttft_p95_seconds": histogram_quantile(0.95, ttft_h),
        "output_tokens_per_second": generated / seconds if seconds > 0 else None,
        "preemptions_per_minute": preemptions / seconds * 60 if seconds > 0 else None,
        "max_num_requests_waiting": float(max_waiting),
    }, run.rejected)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Before (the replay under the current flags) and after (under the change), the recording's own
    numbers beside them, and how far the baseline replay is from the recording."""

    changes: dict[str, str]
    workload: InferredWorkload
    calibration: Calibration
    before: Outcome
    after: Outcome
    measured: Outcome
    baseline_error: dict[str, float | None]

    def metric(self, name: str) -> dict[str, float | None]:
        return {"before": self.before.metrics.get(name), "after": self.after.metrics.get(name),
                "recorded": self.measured.metrics.get(name)}

    def to_json(self) -> dict[str, Any]:
        return {name: {k: (None if v is None else round(v, 6)) for k, v in self.metric(name).items()}
                for name in METRICS}

    def full_json(self) -> dict[str, Any]:
        return {"changes": self.changes, "prediction": self.to_json(), "workload": self.workload.to_json(),
                "calibration": self.calibration.to_json(),
                "baseline_error": {k: None if v is None else round(v, 3) for k, v in self.baseline_error.items()},
                "requests_rejected_after": self.after.requests_rejected}


def current_flags(calibration: Calibration, known: Mapping[str, Any]) -> Flags:
    """The flags the baseline replay runs under: what the server said about itself, vLLM's defaults
    (0.32, V1) for the rest."""
    return Flags(
        max_num_seqs=int(known.get("max_num_seqs") or 256),  # unknown: vLLM's default
        max_num_batched_tokens=int(known.get("max_num_batched_tokens") or 8192),
        num_gpu_blocks=calibration.num_gpu_blocks,
        block_size=calibration.block_size,
        enable_prefix_caching=calibration.enable_prefix_caching,
        max_model_len=int(known.get("max_model_len") or 1 << 20),
    )


def _relative_error(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None:
        return None
    if real == 0:
        return 0.0 if sim == 0 else None
    return abs(sim - real) / abs(real)


@dataclass(frozen=True, slots=True)
class Baseline:
    """Everything a what-if of one window needs, computed once: the workload, the calibration, the
    current flags, the baseline replay and the recording's own numbers."""

    workload: InferredWorkload
    calibration: Calibration
    flags: Flags
    before: Outcome
    measured: Outcome
    bounds: dict[str, tuple[float, ...]]
    seed: int = 0

    @property
    def baseline_error(self) -> dict[str, float | None]:
        return {name: _relative_error(self.before.metrics[name], self.measured.metrics[name]) for name in METRICS}

    def predict(self, changes: Mapping[str, str | float | int | bool]) -> Prediction:
        """The window replayed under ``changes``; :class:`NotModelled` for a change not modelled."""
        after_flags = apply(self.flags, self.calibration, changes)
        after = replay(self.workload, self.calibration, after_flags, seed=self.seed,
                       served_len=self.flags.max_model_len, itl_bounds=self.bounds["itl_bounds"],
                       ttft_bounds=self.bounds["ttft_bounds"])
        return Prediction({k: str(v) for k, v in changes.items()}, self.workload, self.calibration, self.before,
                          after, self.measured, self.baseline_error)


def baseline(scrapes: Sequence[Scrape], known: Mapping[str, Any], *, seed: int = 0) -> Baseline:
    """Infer, calibrate and replay the window under the current flags. ``ValueError`` (saying what
    is missing) when the window cannot be replayed."""
    ok = [s for s in scrapes if s.snapshot is not None]
    if len(ok) < 3:
        raise ValueError("a what-if needs at least three good scrapes")
    workload = infer_workload(ok)
    if workload is None:
        raise ValueError("the window shows no workload to replay (no finished requests, or the server does not "
                         "export request_success, the running/waiting gauges and the length histograms)")
    last = ok[-1].snapshot
    assert last is not None
    calibration = calibrate(ok, last.cache_config, seed)
    if calibration is None:
        raise ValueError("cannot calibrate the simulated engine: it needs engine steps while requests run and "
                         "the KV block budget (vllm:cache_config_info num_gpu_blocks, block_size)")
    known = dict(known)
    longest_prompt = max(v for v, _ in workload.prompt.values())
    if not known.get("max_num_batched_tokens"):
        split_at = _largest_step(ok)
        if split_at is not None and longest_prompt > split_at:
            known["max_num_batched_tokens"] = split_at  # prompts longer than any step: split at the budget
    budget = known.get("max_num_batched_tokens") or 8192
    # Long prompts that fill whole steps make requests wait for the token budget, not for the cap.
    if not known.get("max_num_seqs") and longest_prompt < 0.5 * budget:
        # Requests waited while running sat at its highest count, scrape after scrape: that is the cap.
        queued_at = [s.snapshot.value("num_requests_running") or 0.0 for s in ok if s.snapshot is not None
                     and (s.snapshot.value("num_requests_waiting") or 0) > 0]
        at_top = sum(1 for v in queued_at if v >= calibration.max_running)
        if at_top >= 3 and at_top >= 0.6 * len(queued_at):
            known["max_num_seqs"] = int(calibration.max_running)
    flags = current_flags(calibration, known)
    bounds = {"itl_bounds": _bounds(ok, "inter_token_latency_seconds", ITL_BOUNDS),
              "ttft_bounds": _bounds(ok, "time_to_first_token_seconds", TTFT_BOUNDS)}
    before = replay(workload, calibration, flags, seed=seed, itl_bounds=bounds["itl_bounds"],
                    ttft_bounds=bounds["ttft_bounds"])
    return Baseline(workload, calibration, flags, before, recorded(ok), bounds, seed)


def _largest_step(scrapes: Sequence[Scrape]) -> int | None:
    """The upper bound of the largest tokens-per-step bucket the window saw: vLLM never schedules
    more than --max-num-batched-tokens in a step, so when prompts longer than that were served they
    were split at the budget (used only then, and only when the flag is not known)."""
    steps = histogram_delta(scrapes, "iteration_tokens")
    if steps is None or not steps.count:
        return None
    prev = 0.0
    top = None
    for bound, cum in zip(steps.bounds, steps.cumulative):
        if cum > prev and math.isfinite(bound):
            top = int(bound)
        prev = cum
    return top


def predict(scrapes: Sequence[Scrape], known: Mapping[str, Any], changes: Mapping[str, str | float | int | bool],
            *, seed: int = 0) -> Prediction:
    """The window replayed under the current flags and under ``changes`` (see :class:`Baseline`)."""
    return baseline(scrapes, known, seed=seed).predict(changes)


SWITCHES = ("--enable-prefix-caching", "--no-enable-prefix-caching")


def suggestion_changes(flag: str, value: object) -> dict[str, str]:
    """A suggestion's flag and value as a what-if change (a switch without a value turns it on);
    :class:`NotModelled` when a flag that needs a value has none (the rule could not derive it)."""
    if value is None or value is True:
        if flag in SWITCHES or flag not in MODELLED:
            return {flag: "true"}
        raise NotModelled(f"{flag}: the suggestion names no value to replay (the window did not show which)")
    return {flag: str(value)}


def with_predictions(findings: Sequence[Finding], scrapes: Sequence[Scrape], known: Mapping[str, Any],
                     *, seed: int = 0) -> tuple[tuple[Finding, ...], Baseline | None, str | None]:
    """The findings with a ``prediction`` on every suggestion of a warning or critical finding that
    the simulator models (or a ``prediction_note`` saying why there is none); the baseline used, and
    why there is none when the window cannot be replayed."""
    wanted = [f for f in findings if f.severity != "info" and f.suggestions]
    if not wanted:
        return tuple(findings), None, None
    try:
        base = baseline(scrapes, known, seed=seed)
    except ValueError as exc:
        note = f"no prediction: {exc}"
        return tuple(_noted(f, note) if f in wanted else f for f in findings), None, str(exc)
    except Exception as exc:  # noqa: BLE001 — a prediction must never cost the diagnosis
        note = f"no prediction: the replay failed ({type(exc).__name__}: {exc})"
        return tuple(_noted(f, note) if f in wanted else f for f in findings), None, note
    out = []
    for f in findings:
        if f not in wanted:
            out.append(f)
            continue
        suggestions = []
        for sug in f.suggestions:
            try:
                pred = base.predict(suggestion_changes(sug.flag, sug.value))
                suggestions.append(replace(sug, prediction=pred.to_json(), prediction_note=summary(pred)))
            except ValueError as exc:  # NotModelled, or a value that cannot be applied
                suggestions.append(replace(sug, prediction_note=f"no prediction: {exc}"))
            except Exception as exc:  # noqa: BLE001 — a prediction must never cost the diagnosis
                suggestions.append(replace(sug, prediction_note=f"no prediction: the replay failed "
                                                                f"({type(exc).__name__}: {exc})"))
        out.append(replace(f, suggestions=tuple(suggestions)))
    return tuple(out), base, None


def _noted(finding: Finding, note: str) -> Finding:
    return replace(finding, suggestions=tuple(replace(s, prediction_note=note) for s in finding.suggestions))


# -- words -------------------------------------------------------------------------------------

LABELS = {"itl_p50_seconds": "ITL p50", "itl_p95_seconds": "ITL p95", "itl_p99_seconds": "ITL p99",
          "itl_p999_seconds": "ITL p99.9",
          "ttft_p50_seconds": "TTFT p50", "ttft_p95_seconds": "TTFT p95",
          "output_tokens_per_second": "output tok/s", "preemptions_per_minute": "preemptions/min",
          "max_num_requests_waiting": "max waiting"}
HIGHER_IS_BETTER = {"output_tokens_per_second"}


def fmt_value(name: str, value: float) -> str:
    """A metric's value in the unit a person reads (ms or s for latencies)."""
    return _fmt(name, value)


def _fmt(name: str, value: float) -> str:
    if name.endswith("_seconds"):
        return f"{value * 1000:,.0f} ms" if value < 10 else f"{value:,.1f} s"
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.1f}"


def summary(prediction: Prediction, min_change: float = 0.05) -> str:
    """"ITL p99 278 → ~90 ms; TTFT p95 +10 % (the trade-off)": the metrics that move, gains first."""
    gains: list[str] = []
    costs: list[str] = []
    for name in METRICS:
        b, a = prediction.before.metrics[name], prediction.after.metrics[name]
        if b is None or a is None:
            continue
        if b == 0 and a == 0:
            continue
        change = (a - b) / b if b else math.inf
        if abs(change) < min_change:
            continue
        better = (a > b) == (name in HIGHER_IS_BETTER)
        text = f"{LABELS[name]} {_fmt(name, b)} → ~{_fmt(name, a)}"
        (gains if better else costs).append(text)
    if not gains and not costs:
        return "no metric moves by 5 % or more"
    return "; ".join(gains) + (("; trade-off: " if gains else "costs: ") + "; ".join(costs) if costs else "")
