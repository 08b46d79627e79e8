"""GPU health readings as typed values (pure): what NVML or NVIDIA's dcgm-exporter saw per device,
or why there is no reading.

Readings cross from the adapters (NVML on the GPU host, a dcgm-exporter ``/metrics`` anywhere)
through the collector to the charts and rules as these frozen values; only the recording file holds
them as JSON (:meth:`GpuDevice.to_json` / :meth:`from_json`). Every field but the index and the name
may be ``None``: a device or an exporter that does not report it (NVML's ``NotSupported``, a DCGM
field not in the exporter's counters) is unknown, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import IntFlag
from typing import Any


class ClockEvent(IntFlag):
    """Why the clocks are below their maximum: NVML's clocks-event (formerly "throttle") reasons
    bitmask (``nvmlClocksEventReason*`` in nvidia-ml-py, ``nvmlDeviceGetCurrentClocksEventReasons``),
    which DCGM exports unchanged as ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` (formerly
    ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``)."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


CLOCK_EVENT_LABELS: dict[ClockEvent, str] = {
    ClockEvent.GPU_IDLE: "idle",
    ClockEvent.APPLICATIONS_CLOCKS_SETTING: "application clocks setting",
    ClockEvent.SW_POWER_CAP: "SW power cap",
    ClockEvent.HW_SLOWDOWN: "HW slowdown",
    ClockEvent.SYNC_BOOST: "sync boost",
    ClockEvent.SW_THERMAL_SLOWDOWN: "SW thermal slowdown",
    ClockEvent.HW_THERMAL_SLOWDOWN: "HW thermal slowdown",
    ClockEvent.HW_POWER_BRAKE_SLOWDOWN: "HW power brake",
    ClockEvent.DISPLAY_CLOCK_SETTING: "display clock setting",
}
# The reasons that lower a loaded GPU's clocks for heat or for power (HW slowdown is either: NVML
# sets it for an over-temperature or an external power-brake signal).
THERMAL_EVENTS = ClockEvent.SW_THERMAL_SLOWDOWN | ClockEvent.HW_THERMAL_SLOWDOWN
POWER_EVENTS = ClockEvent.SW_POWER_CAP | ClockEvent.HW_POWER_BRAKE_SLOWDOWN
THROTTLE_EVENTS = THERMAL_EVENTS | POWER_EVENTS | ClockEvent.HW_SLOWDOWN


def clock_event_names(events: ClockEvent | None) -> tuple[str, ...]:
    """The named reasons set in ``events`` (bits NVML may add later are named by their value)."""
    if events is None:
        return ()
    names = [label for flag, label in CLOCK_EVENT_LABELS.items() if events & flag]
    known = 0
    for flag in CLOCK_EVENT_LABELS:
        known |= int(flag)
    rest = int(events) & ~known
    return (*names, *([f"reason 0x{rest:x}"] if rest else []))


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One device as NVML or DCGM reports it (memory counts all processes together).

    ``*_perc`` are 0..1 (NVML and DCGM report percent: the adapters divide); ``utilization_memory``
    is the share of time the memory was being read or written (NVML's ``memory`` rate, DCGM's
    ``MEM_COPY_UTIL``), not how full it is. ``host`` and ``uuid`` come from DCGM's ``Hostname`` and
    ``UUID`` labels (and NVML's UUID), the Fleet page's join keys.
    """

    index: int
    name: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    uuid: str | None = None
    host: str | None = None
    utilization_gpu_perc: float | None = None
    utilization_memory_perc: float | None = None
    temperature_celsius: float | None = None
    temperature_slowdown_celsius: float | None = None
    temperature_shutdown_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    memory_clock_mhz: float | None = None
    memory_clock_max_mhz: float | None = None
    clock_events: ClockEvent | None = None

    @property
    def label(self) -> str:
        """``GPU 0 · NVIDIA H200`` (with the host when DCGM names one)."""
        return f"GPU {self.index} · {self.name}" + (f" @ {self.host}" if self.host else "")

    @property
    def throttles(self) -> ClockEvent:
        """The thermal or power reasons set now (empty when none, or when unknown)."""
        return (self.clock_events or ClockEvent(0)) & THROTTLE_EVENTS

    def to_json(self) -> dict[str, Any]:
        """The recording's device entry: the set fields only (absent stays absent)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name not in ("memory_used_bytes", "memory_total_bytes"):
                continue
            out[f.name] = int(value) if isinstance(value, ClockEvent) else value
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> GpuDevice | None:
        """A recording's device entry; None when it is malformed (the reader skips it)."""
        try:
            events = obj.get("clock_events")
            return cls(
                int(obj["index"]), str(obj.get("name", "")), _opt_int(obj.get("memory_used_bytes")),
                _opt_int(obj.get("memory_total_bytes")),
                uuid=_opt_str(obj.get("uuid")), host=_opt_str(obj.get("host")),
                **{name: _opt_float(obj.get(name)) for name in _FLOAT_FIELDS},
                clock_events=ClockEvent(int(events)) if events is not None else None,
            )
        except (KeyError, TypeError, ValueError):
            return None


def device_order(device: GpuDevice) -> tuple[str, int, str]:
    """How devices are listed and told apart: by host, then index, then UUID."""
    return (device.host or "", device.index, device.uuid or "")


_FLOAT_FIELDS = tuple(f.name for f in fields(GpuDevice)
                      if f.name.endswith(("_perc", "_celsius", "_watts", "_mhz")))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One read of every device, or ``unavailable`` saying why there are none. ``source`` names
    where it came from ("NVML", or the dcgm-exporter URL)."""

    devices: tuple[GpuDevice, ...] = ()
    unavailable: str | None = None
    source: str | None = None

    @classmethod
    def from_json(cls, entries: Sequence[Mapping[str, Any]] | None, source: str | None = None) -> GpuReading | None:
        """A recording's ``gpus`` entries (and its ``gpu_source``); None when the line has none."""
        if entries is None:
            return None
        devices = tuple(d for d in (GpuDevice.from_json(e) for e in entries if isinstance(e, Mapping)) if d)
        return cls(devices, source=source)
