"""GPU memory through NVML (nvidia-ml-py), when the dashboard runs on the GPU host.

NVML absence is a state, not a crash: :func:`read_gpus` raises :class:`NvmlUnavailable` with the
reason, and :func:`probe` says why on a machine with no NVIDIA driver. ``pynvml`` is
imported lazily so that importing this module never touches the driver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

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


def read_gpus() -> list[dict[str, Any]]:
    """One dict per device, in the recording's ``gpus`` shape."""
    nvml = _nvml()
    try:
        out = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                {
                    "index": index,
                    "name": _text(nvml.nvmlDeviceGetName(handle)),
                    "memory_used_bytes": int(memory.used),
                    "memory_total_bytes": int(memory.total),
                }
            )
        return out
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML query failed ({exc})") from None


def probe() -> tuple[Callable[[], list[dict[str, Any]] | None] | None, str | None]:
    """One NVML read: ``(reader for the collector, None)`` when it works, ``(None, why not)``
    on a host with no usable NVIDIA driver."""
    try:
        read_gpus()
    except NvmlUnavailable as exc:
        return None, str(exc)
    return read_gpus, None
