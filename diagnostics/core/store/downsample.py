"""Per-interval aggregates that keep what triage reads (pure).

An interval of scrapes becomes its **last** scrape — the last value of every gauge, and the
cumulative value of every counter and histogram bucket, so the difference between two aggregates is
the counter's (or bucket's) increase and a percentile over aggregates is as honest as over raw
scrapes — plus, as :attr:`Scrape.peak`, the **maximum** of each value over the interval, so a
spike survives. An interval is closed early where a difference would lie: at a counter drop or a
process restart (the reset stays between two aggregates, where :func:`counter_step` finds it) and
where the layout changes. Failed scrapes are kept at the edges of each run of failures (its first
and last in the interval), so an outage keeps its start, its end and its messages.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from diagnostics.core.metrics.catalog import COUNTERS, LABELLED_COUNTERS, Layout, Snapshot
from diagnostics.core.metrics.derive import Scrape, restarted
from diagnostics.core.store.codec import Row


@dataclass(frozen=True, slots=True)
class _Split:
    """A layout's offsets split by kind: what only rises until a reset (counters, histogram numbers)
    and the rest (gauges: their maximum is kept)."""

    layout: Layout
    monotone: np.ndarray
    gauges: np.ndarray


_SPLITS: dict[int, _Split] = {}


def _split(layout: Layout) -> _Split:
    cached = _SPLITS.get(id(layout))
    if cached is not None and cached.layout is layout:
        return cached
    offsets = [o for c, per in layout.scalars.items() if c in COUNTERS for o in per.values()]
    offsets += [o for c, per in layout.labelled.items() if c in LABELLED_COUNTERS for by in per.values()
                for o in by.values()]
    for per_engine in layout.histograms.values():
        for bounds, o in per_engine.values():
            offsets.extend(range(o, o + len(bounds) + 2))
    width = max([o for per in layout.scalars.values() for o in per.values()]
                + [o for per in layout.labelled.values() for by in per.values() for o in by.values()]
                + [o + len(b) + 1 for per in layout.histograms.values() for b, o in per.values()] + [-1]) + 1
    monotone = np.array(sorted(set(offsets)), np.intp)
    gauges = np.setdiff1d(np.arange(width, dtype=np.intp), monotone)
    if len(_SPLITS) > 256:
        _SPLITS.clear()
    found = _SPLITS[id(layout)] = _Split(layout, monotone, gauges)
    return found


def monotone_offsets(layout: Layout) -> list[int]:
    """The offsets of a layout's counters and histogram numbers."""
    return [int(o) for o in _split(layout).monotone]


def _numbers(snapshot: Snapshot) -> np.ndarray:
    return np.frombuffer(snapshot.values, np.float64)


def _dropped(prev: Snapshot, cur: Snapshot) -> bool:
    idx = _split(cur.layout).monotone
    return bool(idx.size) and bool(np.any(_numbers(cur)[idx] < _numbers(prev)[idx]))


@dataclass(slots=True)
class _Open:
    bucket: float
    last: Row | None = None
    peak: np.ndarray | None = None  # the gauges' maxima so far
    num_ok: int = 0
    failures: list[Row] = field(default_factory=list)  # the current run of failures: first and last kept
    out: list[Row] = field(default_factory=list)


class Downsampler:
    """Streams rows (oldest first) into one aggregate per ``interval_seconds`` (see the module)."""

    def __init__(self, interval_seconds: float) -> None:
        if not interval_seconds > 0:
            raise ValueError("an aggregate interval must be > 0 s")
        self.interval_seconds = interval_seconds
        self._open: _Open | None = None
        self.last_ts: float | None = None  # set by a caller that resumes after rows already aggregated
        self._started = False
        self.last_ts_before: float | None = None

    def push(self, row: Row) -> list[Row]:
        """Take one row; return the aggregates it closed (oldest first)."""
        if self.last_ts is not None and row.ts <= self.last_ts:
            return []  # already aggregated (a tail read twice)
        if not self._started and self.last_ts_before is None:
            self.last_ts_before = self.last_ts
        self.last_ts = row.ts
        bucket = math.floor(row.ts / self.interval_seconds)
        done: list[Row] = []
        cur = self._open
        snap = row.scrape.snapshot
        if cur is not None and cur.bucket != bucket:
            done = self._close()
            cur = None
        elif cur is not None and snap is not None and cur.last is not None:
            before = cur.last.scrape.snapshot
            assert before is not None
            if before.layout is not snap.layout or restarted(before, snap) or _dropped(before, snap):
                done = self._close()
                cur = None
        if cur is None:
            cur = self._open = _Open(bucket)
        if snap is None:
            cur.failures.append(row)
            return done
        self._end_failures(cur)
        if not self._started:
            # The stream's first scrape stands alone: an increase over the first interval needs it.
            self._started = True
            if self.last_ts_before is None:
                cur.out.append(row)
                return done
        gauges = _split(snap.layout).gauges
        source = _numbers(row.scrape.peak if row.scrape.peak is not None else snap)
        if len(source) != len(snap.values):
            source = _numbers(snap)
        if cur.peak is None or cur.last is None or len(cur.peak) != len(gauges):
            cur.peak = source[gauges].copy()
        else:
            np.fmax(cur.peak, source[gauges], out=cur.peak)
        cur.last = row
        cur.num_ok += 1 if row.scrape.peak is None else 2  # an aggregate already stands for several
        return done

    def flush(self) -> list[Row]:
        """Close the open interval (the end of the data, or a clean shutdown)."""
        return self._close() if self._open is not None else []

    @staticmethod
    def _end_failures(cur: _Open) -> None:
        if cur.failures:
            cur.out.append(cur.failures[0])
            if len(cur.failures) > 1:
                cur.out.append(cur.failures[-1])
            cur.failures = []

    def _close(self) -> list[Row]:
        cur = self._open
        self._open = None
        if cur is None:
            return []
        self._end_failures(cur)
        out = cur.out
        if cur.last is not None:
            snap = cur.last.scrape.snapshot
            assert snap is not None and cur.peak is not None
            peak = None
            if cur.num_ok > 1:
                values = array("d", snap.values)  # a counter's maximum is its last value (resets split)
                numbers = np.frombuffer(values, np.float64)
                numbers[_split(snap.layout).gauges] = cur.peak
                peak = Snapshot(snap.layout, values, snap.cache_config, snap.process_start_time_seconds, snap.lora)
            out.append(Row(Scrape(cur.last.ts, snap, peak=peak), cur.last.gpus))
        out.sort(key=lambda r: r.ts)
        return out


def downsample(rows: Iterable[Row], interval_seconds: float) -> list[Row]:
    """Every row aggregated per ``interval_seconds`` (the open interval at the end included)."""
    sampler = Downsampler(interval_seconds)
    out: list[Row] = []
    for row in rows:
        out.extend(sampler.push(row))
    out.extend(sampler.flush())
    return out


def downsample_within(rows: list[Row], span: float, limit: int) -> list[Row]:
    """``rows`` (covering ``span`` seconds) aggregated to at most ``limit`` where aggregation can do it:
    intervals of ``span / (limit - 2)`` (the first row stands alone and the intervals need not line up
    with the range, so up to two more than ``span`` / width), doubled while an outage's kept failures
    still overflow (at most eight times: failures are never merged away)."""
    width = max(span, 1e-9) / max(1, limit - 2)
    out = downsample(rows, width)
    for _ in range(8):
        if len(out) <= limit:
            break
        width *= 2
        out = downsample(rows, width)
    return out
