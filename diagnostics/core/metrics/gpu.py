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


@dataclass(frozen=True, slots=True)
class DevicePeak:
    """A device's datasheet peaks: dense BF16 tensor FLOP/s (no sparsity) and memory bandwidth."""

    name: str
    flops_per_second: float
    bandwidth_bytes_per_second: float
    source: str

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from memory-bound to compute-bound."""
        return self.flops_per_second / self.bandwidth_bytes_per_second


# Matched against the NVML device name, most specific first.
DEVICE_PEAKS: tuple[tuple[str, DevicePeak], ...] = (
    ("H200", DevicePeak("H200 SXM", 989e12, 4.8e12, "NVIDIA H200 Tensor Core GPU datasheet")),
    ("H100 PCIe", DevicePeak("H100 PCIe", 756e12, 2.0e12, "NVIDIA H100 Tensor Core GPU datasheet (PCIe)")),
    ("H100", DevicePeak("H100 SXM", 989e12, 3.35e12, "NVIDIA H100 Tensor Core GPU datasheet (SXM)")),
    ("A100-SXM4-80GB", DevicePeak("A100 80GB SXM", 312e12, 2.039e12, "NVIDIA A100 Tensor Core GPU datasheet")),
    ("A100 80GB PCIe", DevicePeak("A100 80GB PCIe", 312e12, 1.935e12, "NVIDIA A100 Tensor Core GPU datasheet")),
    ("A100", DevicePeak("A100 40GB", 312e12, 1.555e12, "NVIDIA A100 Tensor Core GPU datasheet")),
    ("L40S", DevicePeak("L40S", 362e12, 864e9, "NVIDIA L40S datasheet")),
    ("L4", DevicePeak("L4", 121e12, 300e9, "NVIDIA L4 Tensor Core GPU datasheet")),
)


def peak_for(device_name: str | None) -> DevicePeak | None:
    """The datasheet peaks for an NVML device name (None for a device not in the table)."""
    if not device_name:
        return None
    for key, peak in DEVICE_PEAKS:
        if key.lower() in device_name.lower():
            return peak
    return None
