"""GPU memory readings as typed values (pure): what NVML saw, or why there is no reading.

Readings cross from the NVML adapter through the collector to the chart as these frozen values;
only the recording file holds them as JSON (:meth:`GpuMemory.to_json` / :meth:`from_json`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """One device's memory, in bytes, as NVML reports it (all processes together)."""

    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "memory_used_bytes": self.memory_used_bytes,
                "memory_total_bytes": self.memory_total_bytes}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> GpuMemory | None:
        """A recording's device entry; None when it is malformed (the reader skips it)."""
        try:
            return cls(int(obj["index"]), str(obj.get("name", "")), int(obj["memory_used_bytes"]),
                       int(obj["memory_total_bytes"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One NVML read: the devices, or ``unavailable`` saying why there are none."""

    devices: tuple[GpuMemory, ...] = ()
    unavailable: str | None = None

    @classmethod
    def from_json(cls, entries: Sequence[Mapping[str, Any]] | None) -> GpuReading | None:
        if entries is None:
            return None
        devices = tuple(d for d in (GpuMemory.from_json(e) for e in entries if isinstance(e, Mapping)) if d)
        return cls(devices)
