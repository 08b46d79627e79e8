"""dcgm-exporter's text → typed GPU readings. The fixtures are written in dcgm-exporter's exact
format (``# HELP``/``# TYPE`` then one line per GPU with the labels gpu, UUID, pci_bus_id, device,
modelName, Hostname, the driver version and the Kubernetes pod mapping); each expected value below
is the fixture's number worked by hand: MiB × 1,048,576 to bytes, % ÷ 100, the reasons' bits named."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostics.core.metrics.dcgm import devices_from_samples, parse_dcgm
from diagnostics.core.metrics.gpu import ClockEvent, GpuDevice, GpuReading, clock_event_names
from diagnostics.errors import BadMetricsPayload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
H100 = (FIXTURES / "dcgm-exporter-h100x2-custom-counters.txt").read_text()
L4 = (FIXTURES / "dcgm-exporter-l4-default-counters.txt").read_text()


def test_the_custom_counters_payload_reads_every_field_of_both_gpus() -> None:
    reading = parse_dcgm(H100, source="http://gpu-node-7:9400/metrics")
    assert reading.unavailable is None and reading.source == "http://gpu-node-7:9400/metrics"
    hot, cool = reading.devices
    assert hot == GpuDevice(
        0, "NVIDIA H100 80GB HBM3",
        memory_used_bytes=75_497_472_000,  # 72,000 MiB
        memory_total_bytes=83_602_964_480,  # 72,000 + 7,200 free + 530 reserved = 79,730 MiB
        uuid="GPU-5d9e3c7a-1f2b-4c8d-9e0f-a1b2c3d4e5f6", host="gpu-node-7",
        utilization_gpu_perc=1.0, utilization_memory_perc=0.63,
        temperature_celsius=89.0, temperature_slowdown_celsius=87.0, temperature_shutdown_celsius=92.0,
        power_watts=512.314, power_limit_watts=700.0,
        sm_clock_mhz=1275.0, sm_clock_max_mhz=1980.0, memory_clock_mhz=2619.0, memory_clock_max_mhz=2619.0,
        clock_events=ClockEvent.SW_THERMAL_SLOWDOWN | ClockEvent.HW_THERMAL_SLOWDOWN,  # 96 = 0x20 | 0x40
    )
    assert cool.index == 1 and cool.label == "GPU 1 · NVIDIA H100 80GB HBM3 @ gpu-node-7"
    assert cool.memory_used_bytes == 75_287_756_800  # 71,800 MiB
    assert cool.memory_total_bytes == 83_602_964_480  # 71,800 + 7,400 + 530 = 79,730 MiB
    assert (cool.utilization_gpu_perc, cool.power_watts, cool.sm_clock_mhz) == (0.97, 655.871, 1980.0)
    assert cool.clock_events == ClockEvent(0) and cool.throttles == ClockEvent(0)
    assert clock_event_names(hot.throttles) == ("SW thermal slowdown", "HW thermal slowdown")


def test_the_default_counters_leave_the_limits_unknown_and_read_the_old_reasons_name() -> None:
    """dcgm-exporter's default-counters.csv has no power limit, maximum clocks or thresholds (None,
    not 0); an older exporter names the reasons DCGM_FI_DEV_CLOCK_THROTTLE_REASONS."""
    [l4] = parse_dcgm(L4).devices
    assert (l4.name, l4.host, l4.index) == ("NVIDIA L4", "l4-box", 0)
    assert l4.memory_used_bytes == 21_411_921_920  # 20,420 MiB
    assert l4.memory_total_bytes == 23_667_408_896  # 20,420 + 2,151 MiB (no FB_RESERVED field)
    assert (l4.utilization_gpu_perc, l4.utilization_memory_perc) == (0.42, 0.17)
    assert (l4.temperature_celsius, l4.power_watts, l4.sm_clock_mhz, l4.memory_clock_mhz) == (54.0, 71.927, 2040.0,
                                                                                              6250.0)
    assert (l4.power_limit_watts, l4.sm_clock_max_mhz, l4.temperature_slowdown_celsius) == (None, None, None)
    assert l4.clock_events == ClockEvent.SW_POWER_CAP  # 4


def test_the_newer_reasons_name_wins_when_both_are_exported() -> None:
    labels = {"gpu": "0", "UUID": "GPU-a", "modelName": "NVIDIA H200", "Hostname": "h"}
    [device] = devices_from_samples([("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", labels, 4.0),
                                     ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", labels, 64.0)])
    assert device.clock_events == ClockEvent.HW_THERMAL_SLOWDOWN


def test_fb_total_is_used_when_exported_and_memory_unknown_without_fb_fields() -> None:
    labels = {"gpu": "0", "UUID": "GPU-a"}
    [device] = devices_from_samples([("DCGM_FI_DEV_FB_USED", labels, 1024.0), ("DCGM_FI_DEV_FB_FREE", labels, 10.0),
                                     ("DCGM_FI_DEV_FB_TOTAL", labels, 2048.0)])
    assert (device.memory_used_bytes, device.memory_total_bytes) == (2**30, 2 * 2**30)
    [bare] = devices_from_samples([("DCGM_FI_DEV_GPU_TEMP", labels, 50.0)])
    assert (bare.memory_used_bytes, bare.memory_total_bytes, bare.temperature_celsius) == (None, None, 50.0)


def test_a_payload_without_dcgm_fields_is_a_reading_that_says_why() -> None:
    reading = parse_dcgm('vllm:num_requests_running{engine="0"} 1\n')
    assert reading.devices == () and "no DCGM_FI_DEV_ GPU fields" in (reading.unavailable or "")


def test_a_malformed_dcgm_line_raises_with_its_line_number() -> None:
    with pytest.raises(BadMetricsPayload, match="line 2"):
        parse_dcgm('# HELP x\nDCGM_FI_DEV_GPU_TEMP{gpu="0" 50\n')


def test_the_devices_round_trip_through_a_recording() -> None:
    devices = parse_dcgm(H100).devices
    back = GpuReading.from_json([d.to_json() for d in devices], "http://gpu-node-7:9400/metrics")
    assert back == GpuReading(devices, source="http://gpu-node-7:9400/metrics")


def test_a_nan_sample_is_absent_and_an_older_name_fills_in_for_it() -> None:
    """dcgm-exporter writes NaN for a field it could not read: the power draw is then unknown (None),
    and a NaN under the newer reasons name leaves the older name's value (64: HW thermal slowdown)."""
    labels = 'gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H200",Hostname="h"'
    text = (f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 88\n"
            f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} NaN\n"
            f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels}}} NaN\n"
            f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{labels}}} 64\n")
    [device] = parse_dcgm(text).devices
    assert (device.temperature_celsius, device.power_watts) == (88.0, None)
    assert device.clock_events == ClockEvent.HW_THERMAL_SLOWDOWN
    # A device whose only sample is NaN is no device.
    assert parse_dcgm(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} NaN\n").devices == ()
