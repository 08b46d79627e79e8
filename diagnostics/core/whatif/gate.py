"""Whether the baseline replay reproduces the window, before any after-value is shown.

The replay under the unchanged flags is compared with what the window recorded on the metrics the
finding is about (:data:`AIMED`: ITL p99 for head-of-line blocking, TTFT p95 for a queue at the
cap, preemptions for KV pressure, ITL p95 for slow decode). When it misses one beyond the stated
error (:data:`REPRODUCTION`), the prediction is typed as "does not reproduce", with both numbers,
and no after-value is shown anywhere: a replay that cannot show the incident cannot say what a
change does to it.
"""

from __future__ import annotations

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
    "kv_pressure": ("preemptions_per_minute",),
    "slow_decode": ("itl_p95_seconds",),
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

    @property
    def error(self) -> float | None:
        """Signed relative error of the replay (−0.77: the replay shows 23 % of the recorded value)."""
        if self.replayed is None or self.recorded is None or self.recorded == 0:
            return None
        return (self.replayed - self.recorded) / self.recorded

    def to_json(self) -> dict[str, Any]:
        err = self.error
        return {"metric": self.metric, "replayed": self.replayed, "recorded": self.recorded,
                "error": None if err is None else round(err, 3), "reproduces": self.reproduces}


def check(replayed: Mapping[str, float | None], recorded: Mapping[str, float | None], aimed: Sequence[str],
          tolerance: Reproduction = REPRODUCTION) -> tuple[Check, ...]:
    """Each aimed metric of the baseline replay against the recording. A metric the window does not
    record cannot be checked, so it does not pass."""
    out = []
    for metric in aimed:
        sim, real = replayed.get(metric), recorded.get(metric)
        if sim is None or real is None:
            out.append(Check(metric, sim, real, False))
            continue
        close = abs(sim - real) <= max(tolerance.max_relative_error * abs(real), tolerance.floor(metric))
        out.append(Check(metric, sim, real, close))
    return tuple(out)
