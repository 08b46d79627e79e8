"""GPU health through NVML (nvidia-ml-py), when the dashboard runs on the GPU host.

NVML absence is a state, not a crash: :func:`read_gpus` returns a :class:`GpuReading` that says
why there is none, and :func:`probe` says why on a machine with no NVIDIA driver. ``pynvml`` is
imported lazily so that importing this module never touches the driver. A query a device does not
support (``NVMLError_NotSupported``, e.g. clocks-event reasons on a consumer card, temperature
thresholds in a VM) leaves that field ``None``; the rest of the reading stands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from diagnostics.core.metrics.gpu import ClockEvent, GpuDevice, GpuReading
from diagnostics.errors import NvmlUnavailable

SOURCE = "NVML"
_lock = threading.Lock()
_initialised = False


def _nvml() -> Any:
    global _initialised
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py is not installed") from None
    with _lock:
        if not _initialised:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise NvmlUnavailable(f"no NVIDIA driver here ({exc})") from None
            _initialised = True
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml: Any, call: Callable[[], Any]) -> Any:
    """``call()``, or None when the device does not support it (``NVMLError_NotSupported``) or the
    driver's library lacks the function (``NVMLError_FunctionNotFound``, an older driver); any other
    NVML error is the whole reading's failure."""
    unsupported = tuple(getattr(nvml, name) for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
                        if hasattr(nvml, name))
    try:
        return call()
    except unsupported:
        return None


def _clock_events(nvml: Any, handle: Any) -> ClockEvent | None:
    # nvidia-ml-py 12.535+ names it ...ClocksEventReasons; older drivers' bindings only ...ThrottleReasons.
    getter = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
    mask = _optional(nvml, lambda: getter(handle))
    return None if mask is None else ClockEvent(int(mask))


def _device(nvml: Any, index: int) -> GpuDevice:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    rates = _optional(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    milliwatts = _optional(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    limit = _optional(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))

    def number(call: Callable[[], Any]) -> float | None:
        value = _optional(nvml, call)
        return None if value is None else float(value)

    return GpuDevice(
        index,
        _text(nvml.nvmlDeviceGetName(handle)),
        int(memory.used),
        int(memory.total),
        uuid=_optional(nvml, lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
        utilization_gpu_perc=rates.gpu / 100 if rates is not None else None,
        utilization_memory_perc=rates.memory / 100 if rates is not None else None,
        temperature_celsius=number(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        temperature_slowdown_celsius=number(lambda: nvml.nvmlDeviceGetTemperatureThreshold(
            handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
        temperature_shutdown_celsius=number(lambda: nvml.nvmlDeviceGetTemperatureThreshold(
            handle, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)),
        power_watts=milliwatts / 1000 if milliwatts is not None else None,
        power_limit_watts=limit / 1000 if limit is not None else None,
        sm_clock_mhz=number(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        sm_clock_max_mhz=number(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
        memory_clock_mhz=number(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        memory_clock_max_mhz=number(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        clock_events=_clock_events(nvml, handle),
    )


def read_gpus() -> GpuReading:
    """Every device's health now; never raises: a failure is a reading that says why."""
    try:
        nvml = _nvml()
    except NvmlUnavailable as exc:
        return GpuReading(unavailable=str(exc), source=SOURCE)
    try:
        devices = tuple(_device(nvml, index) for index in range(nvml.nvmlDeviceGetCount()))
        return GpuReading(devices, source=SOURCE)
    except nvml.NVMLError as exc:
        return GpuReading(unavailable=f"NVML query failed ({exc})", source=SOURCE)


def probe() -> tuple[Callable[[], GpuReading] | None, str | None]:
    """One NVML read: ``(reader for the collector, None)`` when it works, ``(None, why not)``
    on a host with no usable NVIDIA driver."""
    first = read_gpus()
    if first.unavailable is not None:
        return None, first.unavailable
    return read_gpus, None
