"""Step 2 of a what-if: the engine's step time fitted to the window.

``base + per_seq × sequences + per_prefill × prefill tokens`` fitted to the window's ITL (the mean
gap between tokens is the mean step time while decoding) against the running count and the prefill
tokens per step; the KV block budget from ``cache_config_info``. A CPU-served test model and an
H100 both start from what they showed, not from a preset. The fit's error on the window's own
intervals is reported.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from diagnostics.core.metrics.catalog import CacheConfig, Histogram
from diagnostics.core.metrics.derive import Scrape, counter_step, histogram_delta, restarted
from diagnostics.core.whatif.workload import LengthDist


class StepCost:
    """Seconds per engine step: ``base + per_seq × sequences + per_prefill_token × prefill tokens``,
    times a factor drawn from the window's own spread of step times around that fit (a busy host or
    a noisy neighbour makes some seconds slower; the percentiles come from that spread)."""

    def __init__(self, base: float, per_seq: float, per_prefill_token: float,
                 spread: Sequence[float] = (1.0,), seed: int = 0) -> None:
        self.base, self.per_seq, self.per_prefill_token = base, per_seq, per_prefill_token
        self.spread = tuple(spread) or (1.0,)
        self.seed = seed
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
    num_gpu_blocks_override: int | None = None  # the KV cache pinned by --num-gpu-blocks-override
    # The window showed no cost per sequence (the batch never varied, or the fit found none): the
    # replay takes a step as flat in the batch, and a change that runs more sequences than the
    # window did is replayed with a step proportional to the batch too (:meth:`assuming`), its
    # interval spanning both.
    seq_cost_unknown: bool = False
    mean_batch: float = 1.0  # sequences decoded per step, over the window's busy intervals

    def assuming(self, share: float) -> Calibration:
        """The same step cost at ``mean_batch``, with ``share`` of it per-sequence work."""
        at = self.cost.base + self.cost.per_seq * self.mean_batch
        cost = StepCost(at * (1 - share), at * share / self.mean_batch, self.cost.per_prefill_token,
                        self.cost.spread, self.cost.seed)
        return replace(self, cost=cost)

    def to_json(self) -> dict[str, Any]:
        return {"step_seconds": {"base": self.cost.base, "per_sequence": self.cost.per_seq,
                                 "per_prefill_token": self.cost.per_prefill_token},
                "step_time_spread": {"p10": _q(self.cost.spread, 0.1), "p50": _q(self.cost.spread, 0.5),
                                     "p90": _q(self.cost.spread, 0.9)},
                "per_sequence_cost_identified": self.batch_identified,
                "num_gpu_blocks": self.num_gpu_blocks, "block_size": self.block_size,
                "step_time_fit_error": None if self.fit_error is None else round(self.fit_error, 3),
                "per_sequence_cost_unknown": self.seq_cost_unknown, "mean_batch": round(self.mean_batch, 2),
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
    steps_kept = sum(rows[i][0] for i in keep)
    mean_batch = max(1.0, sum(rows[i][1] for i in keep) / steps_kept) if steps_kept > 0 else 1.0
    cost = StepCost(base, per_seq, per_prefill, _spread(decode_itl, seed), seed)
    return Calibration(cost, config.num_gpu_blocks, config.block_size, bool(config.enable_prefix_caching),
                       config.kv_cache_memory_bytes, config.gpu_memory_utilization, config.cache_dtype, error,
                       len(keep), batch_identified, max(running_seen, default=0.0), _ttft_offset(ok),
                       config.num_gpu_blocks_override, per_seq <= 0, mean_batch)


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
