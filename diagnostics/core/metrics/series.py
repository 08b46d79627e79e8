"""Time series for the live charts, computed from the collector's history in one pass each.

Rolling-window values (hit rate, quantiles) at every point would cost O(points × window) done
naively; here counter and bucket increases are computed once per interval and summed with a
sliding window, and the output is thinned to at most ``max_points`` points for drawing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diagnostics.core.metrics import derive
from diagnostics.core.metrics.catalog import Histogram, Snapshot
from diagnostics.core.metrics.derive import Quantile, Scrape, counter_step, histogram_step, quantile_estimate, restarted

DEFAULT_MAX_POINTS = 400


@dataclass(frozen=True, slots=True)
class Series:
    """Parallel lists; ``None`` marks a gap (a failed scrape or an undefined value)."""

    ts: list[float]
    values: list[float | None]

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(frozen=True, slots=True)
class QuantileSeries(Series):
    """A quantile over time with, per point, the bucket it came from (see :class:`Quantile`)."""

    estimates: list[Quantile | None]


def _thin(n: int, max_points: int) -> range:
    step = max(1, math.ceil(n / max_points))
    # Always keep the newest point: it is the one people look at.
    start = (n - 1) % step
    return range(start, n, step)


def gauge_series(
    history: Sequence[Scrape],
    pick: Callable[[Snapshot], float | None],
    max_points: int = DEFAULT_MAX_POINTS,
) -> Series:
    """A gauge over time; failed scrapes are gaps (None), never zeros."""
    idx = _thin(len(history), max_points)
    ts = [history[i].ts for i in idx]
    values = []
    for i in idx:
        snap = history[i].snapshot
        values.append(pick(snap) if snap is not None else None)
    return Series(ts, values)


def peak_series(
    history: Sequence[Scrape],
    pick: Callable[[Snapshot], float | None],
    max_points: int = DEFAULT_MAX_POINTS,
) -> Series | None:
    """A gauge's maximum over time, for a history of aggregates (the history store's coarser tiers:
    each carries its interval's maxima as ``peak``): the highest value in each drawn point's span, so
    thinning hides no spike either. None when no scrape is an aggregate."""
    if not any(s.peak is not None for s in history):
        return None
    n = len(history)
    step = max(1, math.ceil(n / max_points))
    ts: list[float] = []
    values: list[float | None] = []
    for lo in range(0, n, step):
        best: float | None = None
        for scrape in history[lo:lo + step]:
            snap = scrape.peak if scrape.peak is not None else scrape.snapshot
            value = pick(snap) if snap is not None else None
            if value is not None and not math.isnan(value) and (best is None or value > best):
                best = value
        ts.append(history[min(lo + step, n) - 1].ts)
        values.append(best)
    return Series(ts, values)


def _increments(
    history: Sequence[Scrape], pick: Callable[[Snapshot], float | None]
) -> tuple[list[float], list[float], list[bool]]:
    """Per-scrape increase of a counter since the previous scrape that carried it (reset-aware).

    Returns ``(ts, increments, carried)`` for every scrape; scrapes without the value get 0 and
    ``carried=False``.
    """
    ts: list[float] = []
    inc: list[float] = []
    carried: list[bool] = []
    prev_value: float | None = None
    prev_snap: Snapshot | None = None
    for scrape in history:
        snap = scrape.snapshot
        value = pick(snap) if snap is not None else None
        ts.append(scrape.ts)
        if value is None or math.isnan(value) or snap is None:
            inc.append(0.0)
            carried.append(False)
            continue
        if prev_value is None or prev_snap is None:
            inc.append(0.0)
        else:
            inc.append(counter_step(prev_value, value, restarted(prev_snap, snap)))
        carried.append(True)
        prev_value, prev_snap = value, snap
    return ts, inc, carried


def _window_sums(ts: list[float], values: list[float], window_seconds: float) -> list[float]:
    """Sum of ``values[j]`` with ``ts[i] - window < ts[j] <= ts[i]``, for each i."""
    out = []
    total = 0.0
    lo = 0
    for i, t in enumerate(ts):
        total += values[i]
        while ts[lo] <= t - window_seconds:
            total -= values[lo]
            lo += 1
        out.append(total)
    return out


def rate_series(
    history: Sequence[Scrape],
    pick: Callable[[Snapshot], float | None],
    window_seconds: float = 5.0,
    max_points: int = DEFAULT_MAX_POINTS,
) -> Series:
    """A counter's per-second rate, smoothed over a trailing window (reset-aware, never negative)."""
    ts, inc, carried = _increments(history, pick)
    if not any(carried):
        return Series([], [])
    sums = _window_sums(ts, inc, window_seconds)
    idx = _thin(len(ts), max_points)
    values: list[float | None] = []
    for i in idx:
        span = min(window_seconds, ts[i] - ts[0])
        values.append(sums[i] / span if carried[i] and span > 0 else None)
    return Series([ts[i] for i in idx], values)


def increase_events(history: Sequence[Scrape], pick: Callable[[Snapshot], float | None]) -> Series:
    """The scrapes at which a counter went up, with by how much (e.g. preemptions)."""
    ts, inc, _ = _increments(history, pick)
    points = [(t, v) for t, v in zip(ts, inc) if v > 0]
    return Series([t for t, _ in points], [v for _, v in points])


def rolling_ratio(
    history: Sequence[Scrape],
    numerator: Callable[[Snapshot], float | None],
    denominator: Callable[[Snapshot], float | None],
    window_seconds: float,
    max_points: int = DEFAULT_MAX_POINTS,
) -> Series:
    """Δnumerator / Δdenominator over a trailing window at each point (e.g. the prefix hit rate);
    None where the denominator did not move."""
    ts, num, carried = _increments(history, numerator)
    _, den, _ = _increments(history, denominator)
    if not any(carried):
        return Series([], [])
    num_sums = _window_sums(ts, num, window_seconds)
    den_sums = _window_sums(ts, den, window_seconds)
    idx = _thin(len(ts), max_points)
    values: list[float | None] = []
    for i in idx:
        values.append(min(1.0, num_sums[i] / den_sums[i]) if carried[i] and den_sums[i] > 0 else None)
    return Series([ts[i] for i in idx], values)


def rolling_quantiles(
    history: Sequence[Scrape],
    concept: str,
    qs: Sequence[float] = (0.5, 0.95, 0.99),
    window_seconds: float = 60.0,
    max_points: int = DEFAULT_MAX_POINTS,
) -> dict[float, QuantileSeries] | None:
    """Quantiles of the observations in a trailing window, at each point, each with its bucket;
    None when the server does not expose the histogram."""
    hists: list[Histogram | None] = [s.snapshot.histogram(concept) if s.snapshot is not None else None for s in history]
    if not any(h is not None for h in hists):
        return None
    ts = [s.ts for s in history]
    bounds: tuple[float, ...] | None = None
    deltas: list[list[float] | None] = []
    prev: tuple[Snapshot, Histogram] | None = None
    for scrape, hist in zip(history, hists):
        if hist is None or scrape.snapshot is None:
            deltas.append(None)
            continue
        step = histogram_step(*prev, scrape.snapshot, hist) if prev is not None else None
        deltas.append(list(step.cumulative) if step is not None else [0.0] * len(hist.bounds))
        bounds = hist.bounds
        prev = (scrape.snapshot, hist)
    assert bounds is not None
    width = len(bounds)
    out_ts: list[float] = []
    out: dict[float, list[Quantile | None]] = {q: [] for q in qs}
    idx = set(_thin(len(ts), max_points))
    acc = [0.0] * width
    lo = 0
    for i, t in enumerate(ts):
        d = deltas[i]
        if d is not None and len(d) == width:
            for k in range(width):
                acc[k] += d[k]
        while ts[lo] <= t - window_seconds:
            old = deltas[lo]
            if old is not None and len(old) == width:
                for k in range(width):
                    acc[k] -= old[k]
            lo += 1
        if i in idx:
            out_ts.append(t)
            window_hist = Histogram(bounds, tuple(acc), 0.0, acc[-1])
            for q in qs:
                out[q].append(quantile_estimate(q, window_hist) if d is not None else None)
    return {q: QuantileSeries(out_ts, [e.value if e is not None else None for e in ests], ests)
            for q, ests in out.items()}


def labelled_increase(history: Sequence[Scrape], concept: str) -> dict[str, float] | None:
    """How much each label of a labelled counter rose over the history (e.g. finished_reason)."""
    return derive.labelled_increase(history, concept)


def label_picker(concept: str, label: str) -> Callable[[Snapshot], float | None]:
    def pick(snap: Snapshot) -> float | None:
        return (snap.by_label(concept) or {}).get(label)

    return pick
