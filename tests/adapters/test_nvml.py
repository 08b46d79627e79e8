"""The NVML adapter returns a typed reading, or one that says why there is none; it never raises.
pynvml is replaced by a small fake module (a unit test of one adapter; the GPU host is the real
check) that speaks nvidia-ml-py's names: ``NVMLError`` with a ``value``, its ``NVMLError_NotSupported``
subclass, the ``NVML_*`` constants and the ``nvmlDevice*`` calls with their units (mW, percent, MHz, °C)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from diagnostics.core.metrics.gpu import ClockEvent, GpuDevice, GpuReading
from diagnostics.sources import nvml


class NVMLError(Exception):
    def __init__(self, value: int, text: str = "") -> None:
        super().__init__(text or f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - nvidia-ml-py's spelling
    def __init__(self) -> None:
        super().__init__(3, "Not Supported")


def _unsupported(*_: object) -> None:
    raise NVMLError_NotSupported()


def fake_pynvml(*, init_fails: bool = False, query_fails: bool = False, old_bindings: bool = False,
                unsupported: tuple[str, ...] = ()) -> types.ModuleType:
    """Two devices: 0 is an H200 thermally throttled (SM 1275 of 1980 MHz, 89 °C, 512.3 W of 700 W),
    1 an H100 at full clock; the calls named in ``unsupported`` raise NotSupported."""
    module = types.ModuleType("pynvml")
    consts = {"NVMLError": NVMLError, "NVMLError_NotSupported": NVMLError_NotSupported, "NVML_ERROR_NOT_SUPPORTED": 3,
              "NVML_TEMPERATURE_GPU": 0, "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": 0,
              "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1, "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2}
    for name, value in consts.items():
        setattr(module, name, value)

    def init() -> None:
        if init_fails:
            raise NVMLError(12, "NVML Shared Library Not Found")

    def count() -> int:
        if query_fails:
            raise NVMLError(15, "GPU is lost")
        return 2

    calls = {
        "nvmlInit": init,
        "nvmlDeviceGetCount": count,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(used=(10 + h) * 2**30, total=141 * 2**30),
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=100 if h == 0 else 35, memory=63),
        "nvmlDeviceGetTemperature": lambda h, sensor: 89 if h == 0 else 61,
        "nvmlDeviceGetTemperatureThreshold": lambda h, which: {0: 92, 1: 87}[which],
        "nvmlDeviceGetPowerUsage": lambda h: 512_314 if h == 0 else 301_000,  # mW
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,  # mW
        "nvmlDeviceGetClockInfo": lambda h, clock: {1: 1275 if h == 0 else 1980, 2: 3201}[clock],
        "nvmlDeviceGetMaxClockInfo": lambda h, clock: {1: 1980, 2: 3201}[clock],
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: 0x60 if h == 0 else 0,
    }
    if not old_bindings:
        calls["nvmlDeviceGetCurrentClocksEventReasons"] = lambda h: 0x60 if h == 0 else 0
    for name in unsupported:
        calls[name] = _unsupported
    for name, fn in calls.items():
        setattr(module, name, fn)
    return module


@pytest.fixture(autouse=True)
def fresh_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(nvml, "_initialised", False)
    yield


HOT = GpuDevice(
    0, "NVIDIA H200", 10 * 2**30, 141 * 2**30, uuid="GPU-0",
    utilization_gpu_perc=1.0, utilization_memory_perc=0.63,
    temperature_celsius=89.0, temperature_slowdown_celsius=87.0, temperature_shutdown_celsius=92.0,
    power_watts=512.314, power_limit_watts=700.0,  # 512,314 mW and 700,000 mW
    sm_clock_mhz=1275.0, sm_clock_max_mhz=1980.0, memory_clock_mhz=3201.0, memory_clock_max_mhz=3201.0,
    clock_events=ClockEvent.SW_THERMAL_SLOWDOWN | ClockEvent.HW_THERMAL_SLOWDOWN,  # 0x60
)


def test_every_field_is_read_in_our_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    reading = nvml.read_gpus()
    assert reading.source == "NVML" and reading.unavailable is None
    hot, cool = reading.devices
    assert hot == HOT
    assert (cool.name, cool.utilization_gpu_perc, cool.power_watts, cool.clock_events) == (
        "NVIDIA H100 80GB HBM3", 0.35, 301.0, ClockEvent(0))
    reader, note = nvml.probe()
    assert reader is nvml.read_gpus and note is None


def test_an_unsupported_query_leaves_its_field_none_and_the_rest_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(unsupported=(
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMaxClockInfo")))
    hot = nvml.read_gpus().devices[0]
    assert (hot.clock_events, hot.temperature_slowdown_celsius, hot.temperature_shutdown_celsius) == (None, None, None)
    assert (hot.power_watts, hot.power_limit_watts, hot.utilization_gpu_perc, hot.utilization_memory_perc) == (
        None, None, None, None)
    assert (hot.sm_clock_max_mhz, hot.memory_clock_max_mhz) == (None, None)
    assert (hot.memory_used_bytes, hot.temperature_celsius, hot.sm_clock_mhz) == (10 * 2**30, 89.0, 1275.0)


def test_older_bindings_read_the_reasons_through_the_throttle_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(old_bindings=True))
    assert nvml.read_gpus().devices[0].clock_events == HOT.clock_events


def test_no_driver_is_a_reading_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    reading = nvml.read_gpus()
    assert reading.devices == () and "no NVIDIA driver here" in (reading.unavailable or "")
    assert nvml.probe() == (None, reading.unavailable)


def test_a_failing_query_is_a_reading_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(query_fails=True))
    assert nvml.read_gpus() == GpuReading(unavailable="NVML query failed (GPU is lost)", source="NVML")


def test_a_recording_round_trips_the_devices_and_skips_malformed_ones() -> None:
    reading = GpuReading.from_json([HOT.to_json(), {"index": "x"}], "NVML")
    assert reading == GpuReading((HOT,), source="NVML")
    legacy = GpuReading.from_json([{"index": 0, "name": "NVIDIA H200", "memory_used_bytes": 1, "memory_total_bytes": 2}])
    assert legacy == GpuReading((GpuDevice(0, "NVIDIA H200", 1, 2),))


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801 - nvidia-ml-py's spelling
    def __init__(self) -> None:
        super().__init__(13, "Function Not Found")


def _raises(error: Exception) -> object:
    def call(*_: object) -> None:
        raise error
    return call


@pytest.mark.parametrize("call", ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons",
                                  "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetUUID"])
def test_a_lost_gpu_in_an_optional_query_fails_the_reading_not_just_the_field(
    monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """Only "not supported" (and "function not found") leave a field None: a GPU that fell off the bus
    (NVML_ERROR_GPU_IS_LOST, 15) in any query is the reading's failure, never a device that reads
    as having no power draw, no reasons or no thresholds."""
    module = fake_pynvml()
    setattr(module, call, _raises(NVMLError(15, "GPU is lost")))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert nvml.read_gpus() == GpuReading(unavailable="NVML query failed (GPU is lost)", source="NVML")


def test_a_function_the_drivers_library_lacks_leaves_its_field_none(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_pynvml()
    module.NVMLError_FunctionNotFound = NVMLError_FunctionNotFound  # type: ignore[attr-defined]
    module.nvmlDeviceGetTemperatureThreshold = _raises(NVMLError_FunctionNotFound())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    hot = nvml.read_gpus().devices[0]
    assert (hot.temperature_slowdown_celsius, hot.temperature_shutdown_celsius) == (None, None)
    assert (hot.temperature_celsius, hot.power_watts) == (89.0, 512.314)
