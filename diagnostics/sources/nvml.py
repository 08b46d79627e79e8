"""GPU memory through NVML (nvidia-ml-py), when the dashboard runs on the GPU host.

NVML absence is a state, not a crash: :func:`read_gpus` returns a :class:`GpuReading` that says
why there is none, and :func:`probe` says why on a machine with no NVIDIA driver. ``pynvml`` is
imported lazily so that importing this module never touches the driver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from diagnostics.core.metrics.gpu import GpuMemory, GpuReading
from diagnostics.errors import NvmlUnavailable

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


def read_gpus() -> GpuReading:
    """Every device's memory now; never raises: a failure is a reading that says why."""
    try:
        nvml = _nvml()
    except NvmlUnavailable as exc:
        return GpuReading(unavailable=str(exc))
    try:
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(GpuMemory(index, _text(nvml.nvmlDeviceGetName(handle)), int(memory.used),
                                     int(memory.total)))
        return GpuReading(tuple(devices))
    except nvml.NVMLError as exc:
        return GpuReading(unavailable=f"NVML query failed ({exc})")


def probe() -> tuple[Callable[[], GpuReading] | None, str | None]:
    """One NVML read: ``(reader for the collector, None)`` when it works, ``(None, why not)``
    on a host with no usable NVIDIA driver."""
    first = read_gpus()
    if first.unavailable is not None:
        return None, first.unavailable
    return read_gpus, None
