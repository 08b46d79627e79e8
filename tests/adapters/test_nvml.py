"""The NVML adapter returns a typed reading, or one that says why there is none; it never raises.
pynvml is replaced by a small fake module (a unit test of one adapter; the GPU host is the real
check)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from diagnostics.core.metrics.gpu import GpuDevice, GpuReading
from diagnostics.sources import nvml


class NVMLError(Exception):
    pass


def fake_pynvml(*, init_fails: bool = False, query_fails: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError  # type: ignore[attr-defined]

    def init() -> None:
        if init_fails:
            raise NVMLError("NVML Shared Library Not Found")

    def count() -> int:
        if query_fails:
            raise NVMLError("GPU is lost")
        return 2

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = count  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA H100"  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        used=(10 + h) * 2**30, total=141 * 2**30)
    return module


@pytest.fixture(autouse=True)
def fresh_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(nvml, "_initialised", False)
    yield


def test_devices_are_read_as_typed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    reading = nvml.read_gpus()
    assert reading == GpuReading((GpuDevice(0, "NVIDIA H200", 10 * 2**30, 141 * 2**30),
                                  GpuDevice(1, "NVIDIA H100", 11 * 2**30, 141 * 2**30)))
    reader, note = nvml.probe()
    assert reader is nvml.read_gpus and note is None


def test_no_driver_is_a_reading_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    reading = nvml.read_gpus()
    assert reading.devices == () and "no NVIDIA driver here" in (reading.unavailable or "")
    assert nvml.probe() == (None, reading.unavailable)


def test_a_failing_query_is_a_reading_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(query_fails=True))
    assert nvml.read_gpus() == GpuReading(unavailable="NVML query failed (GPU is lost)")


def test_a_recording_round_trips_the_devices_and_skips_malformed_ones() -> None:
    device = GpuDevice(0, "NVIDIA H200", 10 * 2**30, 141 * 2**30)
    reading = GpuReading.from_json([device.to_json(), {"index": "x"}])
    assert reading == GpuReading((device,))
