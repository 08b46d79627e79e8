"""What the history store keeps, and for how long (pure, typed, bounded).

Tier 0 is every scrape; each later tier is per-interval aggregates (see
:mod:`diagnostics.core.store.downsample`) kept longer. Data ages out of a tier at its retention; the
size cap prunes the oldest chunks of the coarsest tier first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HOUR = 3600.0
DAY = 86400.0
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Tier:
    """``interval_seconds`` 0: every scrape as it was taken; otherwise one aggregate per interval.
    ``chunk_seconds``: the span one stored chunk covers (its rows are compressed together)."""

    interval_seconds: float
    retention_seconds: float
    chunk_seconds: float

    @property
    def name(self) -> str:
        return "every scrape" if self.interval_seconds == 0 else f"{_span(self.interval_seconds)} aggregates"


def _span(seconds: float) -> str:
    for unit, size in (("d", DAY), ("h", HOUR), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _default_tiers() -> tuple[Tier, ...]:
    # A range read takes the finest tier that holds it in at most max_read_rows points: up to 25 min
    # every scrape, up to 6 h at 15 s, up to 25 h at 1 min, up to 30 days at 30 min. Short chunk spans
    # on the coarse tiers keep the tail a read rebuilds from the finer tier small.
    return (
        Tier(0.0, 6 * HOUR, 600.0),
        Tier(15.0, 3 * DAY, 600.0),
        Tier(60.0, 14 * DAY, HOUR),
        Tier(1800.0, 30 * DAY, 6 * HOUR),
    )


@dataclass(frozen=True, slots=True)
class StorePolicy:
    """The tiers, the size cap, and how the writer batches (``batch_seconds``: at most this much is
    lost when the process is killed)."""

    tiers: tuple[Tier, ...] = field(default_factory=_default_tiers)
    max_bytes: int = 2048 * MIB
    batch_seconds: float = 5.0
    max_read_rows: int = 1_500  # a range read picks the finest tier that stays under this

    def problems(self) -> list[str]:
        """Why this policy cannot be used ([] when it can)."""
        out = []
        if not self.tiers or self.tiers[0].interval_seconds != 0:
            out.append("the first tier must keep every scrape (interval 0)")
        for i, tier in enumerate(self.tiers):
            if not (math.isfinite(tier.retention_seconds) and tier.retention_seconds > 0):
                out.append(f"tier {i}: retention must be a finite number of seconds > 0")
            if not (math.isfinite(tier.chunk_seconds) and tier.chunk_seconds > 0):
                out.append(f"tier {i}: chunk span must be > 0")
            if i and tier.interval_seconds <= self.tiers[i - 1].interval_seconds:
                out.append(f"tier {i}: its interval must be coarser than tier {i - 1}'s")
            if i and tier.interval_seconds and tier.chunk_seconds % tier.interval_seconds:
                out.append(f"tier {i}: the chunk span must be a whole number of intervals")
            if i and self.tiers[i - 1].retention_seconds < 2 * tier.chunk_seconds:
                # A coarse tier's open chunk is rebuilt from the finer tier after a crash.
                out.append(f"tier {i - 1}: retention must cover two of tier {i}'s chunks")
        if self.max_bytes < MIB:
            out.append("the size cap must be at least 1 MiB")
        if not 0 < self.batch_seconds <= 60:
            out.append("batches must be 0-60 s")
        return out

    @property
    def retention_seconds(self) -> float:
        """How far back the store reaches at most (its coarsest tier)."""
        return max(t.retention_seconds for t in self.tiers)

    def limited(self, *, max_bytes: int | None = None, retention_seconds: float | None = None) -> StorePolicy:
        """This policy under an operator's limits: a smaller size cap, and no tier kept longer than
        ``retention_seconds`` (the tiers that would then hold nothing are dropped). Check
        :meth:`problems` on the result."""
        tiers = self.tiers
        if retention_seconds is not None:
            kept = [t for t in tiers if t.interval_seconds == 0 or t.chunk_seconds * 2 <= retention_seconds]
            tiers = tuple(Tier(t.interval_seconds, min(t.retention_seconds, retention_seconds), t.chunk_seconds)
                          for t in kept)
            # A finer tier must still cover two of the next one's chunks (it rebuilds them).
            tiers = tuple(t for i, t in enumerate(tiers)
                          if i == 0 or tiers[i - 1].retention_seconds >= 2 * t.chunk_seconds)
        return StorePolicy(tiers, self.max_bytes if max_bytes is None else max_bytes, self.batch_seconds,
                           self.max_read_rows)

    def describe(self) -> str:
        tiers = ", then ".join(f"{t.name} for {_span(t.retention_seconds)}" for t in self.tiers)
        return f"{tiers}; at most {self.max_bytes / MIB:.0f} MiB"


DEFAULT_POLICY = StorePolicy()
