"""What a page or a command reads of a target, wherever its history comes from (pure).

:class:`HistorySource` is the reader side that the live collector
(:class:`diagnostics.collector.Collector`), an instance read through Prometheus
(:class:`diagnostics.prometheus_fleet.PrometheusTarget`) and a recording (:class:`Replay`, from
:meth:`diagnostics.recording.Recording.replay`) all provide; pages and the CLI type against it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import ServerInfo, TargetStatus


@runtime_checkable
class HistorySource(Protocol):
    """A target's bounded history of scrapes, its status, and its GPU readings."""

    def history(self) -> list[Scrape]:
        """The scrapes, oldest first; a failed scrape is kept with its error."""
        ...

    def status(self) -> TargetStatus:
        """What the target is (its server info) and how it is doing as of the newest scrape."""
        ...

    def gpu_history(self) -> list[tuple[float, GpuReading]]:
        """NVML readings with their time, oldest first (none where NVML was not read)."""
        ...


@dataclass(frozen=True, slots=True)
class Replay:
    """A recording as a history source: the target is in the state its last scrape says."""

    target: str
    scrapes: tuple[Scrape, ...]
    info: ServerInfo | None = None
    gpus: tuple[tuple[float, GpuReading], ...] = ()

    def between(self, start: float, end: float) -> Replay:
        """The scrapes and GPU readings from ``start`` to ``end`` (both included)."""
        return replace(self, scrapes=tuple(s for s in self.scrapes if start <= s.ts <= end),
                       gpus=tuple(g for g in self.gpus if start <= g[0] <= end))

    def history(self) -> list[Scrape]:
        return list(self.scrapes)

    def gpu_history(self) -> list[tuple[float, GpuReading]]:
        return list(self.gpus)

    def status(self) -> TargetStatus:
        last = self.scrapes[-1] if self.scrapes else None
        ok = [s.ts for s in self.scrapes if s.snapshot is not None]
        return TargetStatus(
            target=self.target,
            state="up" if last is not None and last.snapshot is not None else "down",
            since=None,  # a recording says when each scrape was taken, not when the state began
            error=last.error if last is not None else None,
            last_ok_ts=ok[-1] if ok else None,
            last_attempt_ts=last.ts if last is not None else None,
            info=self.info,
            num_scrapes=len(self.scrapes),
            num_failures=len(self.scrapes) - len(ok),
        )
