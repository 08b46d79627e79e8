"""Whether the baseline replay reproduces the window, before any after-value is shown.

The replay under the unchanged flags is compared with what the window recorded on the metrics the
finding is about (:data:`AIMED`: ITL p99 for head-of-line blocking, TTFT p95 for a queue at the
cap, preemptions for KV pressure, ITL p95 for slow decode). When it misses one beyond the stated
error (:data:`REPRODUCTION`), the prediction is typed as "does not reproduce", with both numbers,
and no after-value is shown anywhere: a replay that cannot show the incident cannot say what a
change does to it.

A recorded percentile is known only to its histogram bucket: the interpolated point inside it is a
guess. When the bucket bounds are given, the error is measured to the nearer edge of the recorded
bucket (0 inside it). A real head-of-line window whose decoders saw 4.5-5.0 s gaps (every one a
long prefill step) records ITL p99 "2.82 s", the bottom of its (2.5, 5] bucket, while a replay
with 5.05 s steps reads 5.19 s in the next bucket: 84 % apart as points, 4 % as what each knows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Reproduction:
    """The error a baseline replay may have on an aimed metric and still be trusted: within
    ``max_relative_error`` of the recorded value, or within the absolute floor of its kind (the
    histograms' resolution near zero: ITL and TTFT buckets are 10–25 ms wide at the low end; a
    couple of preemptions a minute or of waiting requests is one scrape's noise)."""

    max_relative_error: float = 0.5
    latency_floor_seconds: float = 0.010
    count_floor: float = 2.0  # preemptions per minute, requests waiting
    rate_floor: float = 0.0  # output tokens per second

    def floor(self, metric: str) -> float:
        if metric.endswith("_seconds"):
            return self.latency_floor_seconds
        if metric in ("preemptions_per_minute", "max_num_requests_waiting"):
            return self.count_floor
        return self.rate_floor


REPRODUCTION = Reproduction()

# The metric each finding is about (the one its suggestion is meant to move): the replay must
# reproduce it before a prediction is shown.
AIMED: dict[str, tuple[str, ...]] = {
    "head_of_line_blocking": ("itl_p99_seconds",),
    "queue_at_cap": ("ttft_p95_seconds",),
    # A larger token budget trades ITL (longer prefill steps) for TTFT: the replay must reproduce both.
    "queue_token_budget": ("ttft_p95_seconds", "itl_p95_seconds"),
    "kv_pressure": ("preemptions_per_minute",),
    "slow_decode": ("itl_p95_seconds",),
    # TTFT findings and clients giving up (they wait): a cap, a token budget, more KV or prefix caching
    # suggested for them is judged on the TTFT the window recorded, not on its throughput.
    "ttft_queue_dominated": ("ttft_p95_seconds",),
    "ttft_prefill_dominated": ("ttft_p95_seconds",),
    "clients_gave_up": ("ttft_p95_seconds",),
}
# Any other finding, and a what-if asked without one: the window's throughput.
DEFAULT_AIM: tuple[str, ...] = ("output_tokens_per_second",)


def aimed_for(finding_ids: Sequence[str]) -> tuple[str, ...]:
    """The aimed metrics of the first finding that has them (findings come most severe first)."""
    for fid in finding_ids:
        if fid in AIMED:
            return AIMED[fid]
    return DEFAULT_AIM


@dataclass(frozen=True, slots=True)
class Check:
    """One aimed metric: the baseline replay against the recording."""

    metric: str
    replayed: float | None
    recorded: float | None
    reproduces: bool
    recorded_bucket: tuple[float, float] | None = None  # the histogram bucket the recorded value lies in

    @property
    def error(self) -> float | None:
        """Signed relative error of the replay (−0.77: the replay shows 23 % of the recorded value)."""
        if self.replayed is None or self.recorded is None or self.recorded == 0:
            return None
        return (self.replayed - self.recorded) / self.recorded

    def to_json(self) -> dict[str, Any]:
        err = self.error
        return {"metric": self.metric, "replayed": self.replayed, "recorded": self.recorded,
                "recorded_bucket": None if self.recorded_bucket is None else list(self.recorded_bucket),
                "error": None if err is None else round(err, 3), "reproduces": self.reproduces}


def bucket_of(value: float, bounds: Sequence[float]) -> tuple[float, float] | None:
    """The histogram bucket ``(lower, upper]`` a percentile read from it falls in; None past the
    last finite bound (the +Inf bucket says nothing of where inside it)."""
    lower = 0.0
    for upper in bounds:
        if value <= upper:
            return (lower, upper) if math.isfinite(upper) else None
        lower = upper
    return None


def nearest_in_bucket(value: float, recorded: float, bounds: Sequence[float] | None) -> float:
    """The point of the bucket ``recorded`` was read from (``bounds``: its histogram's) nearest to
    ``value``: ``value`` itself inside it, an edge outside; ``recorded`` when no bucket is known."""
    bucket = bucket_of(recorded, bounds) if bounds else None
    return recorded if bucket is None else min(max(value, bucket[0]), bucket[1])


def check(replayed: Mapping[str, float | None], recorded: Mapping[str, float | None], aimed: Sequence[str],
          tolerance: Reproduction = REPRODUCTION,
          bounds: Mapping[str, Sequence[float]] | None = None) -> tuple[Check, ...]:
    """Each aimed metric of the baseline replay against the recording; ``bounds``: the bucket bounds
    of the histogram each recorded metric was read from (the module's note). A metric the window
    does not record cannot be checked, so it does not pass."""
    out = []
    for metric in aimed:
        sim, real = replayed.get(metric), recorded.get(metric)
        if sim is None or real is None:
            out.append(Check(metric, sim, real, False))
            continue
        metric_bounds = bounds.get(metric) if bounds else None
        nearest = nearest_in_bucket(sim, real, metric_bounds)
        close = abs(sim - nearest) <= max(tolerance.max_relative_error * abs(nearest), tolerance.floor(metric))
        out.append(Check(metric, sim, real, close, bucket_of(real, metric_bounds) if metric_bounds else None))
    return tuple(out)
