"""The one table of GPUs: datasheet numbers per variant, matched from NVML names, read alike by
the roofline, the simulated engine and the capacity page."""

from __future__ import annotations

import pytest

from diagnostics.core.capacity.arithmetic import GPU_PRESETS_GB
from diagnostics.core.hardware import GPUS, GPUS_BY_NAME, peak_for
from diagnostics.core.simulator.hardware import GPU_SPECS


@pytest.mark.parametrize(("variant", "bandwidth", "memory"), [
    # NVIDIA's datasheets (A100, H100, H200 Tensor Core GPU): memory bandwidth by form factor.
    ("A100 40GB", 1.555e12, 40e9), ("A100 80GB SXM", 2.039e12, 80e9), ("A100 80GB PCIe", 1.935e12, 80e9),
    ("H100 SXM", 3.35e12, 80e9), ("H100 PCIe", 2.0e12, 80e9), ("H200 SXM", 4.8e12, 141e9),
])
def test_each_variant_has_its_datasheet_bandwidth(variant: str, bandwidth: float, memory: float) -> None:
    gpu = GPUS_BY_NAME[variant]
    assert (gpu.bandwidth_bytes_per_second, gpu.memory_bytes) == (bandwidth, memory)


def test_a_key_inside_another_is_matched_after_it() -> None:
    """"L4" is inside "NVIDIA L40S", "A100" inside "NVIDIA A100-SXM4-80GB": the longer key must be
    tried first or the device gets the other's peaks."""
    for i, early in enumerate(GPUS):
        for later in GPUS[i + 1:]:
            assert early.nvml_match.lower() not in later.nvml_match.lower(), (early.name, later.name)


def test_the_simulator_and_the_roofline_read_the_same_a100() -> None:
    peak = peak_for("NVIDIA A100-SXM4-80GB")
    assert peak is not None and GPU_SPECS["A100-80GB"].bandwidth_bytes_per_s == peak.bandwidth_bytes_per_second


def test_a_device_held_for_its_memory_only_has_no_roofline() -> None:
    assert GPUS_BY_NAME["RTX 4090"].memory_bytes == 24e9 and peak_for("NVIDIA GeForce RTX 4090") is None


def test_the_capacity_page_offers_every_memory_size_of_the_table_once() -> None:
    assert GPU_PRESETS_GB == {"24 GB (L4 / A10G / 4090)": 24, "40 GB (A100)": 40, "48 GB (L40S / A6000)": 48,
                              "80 GB (A100 / H100)": 80, "141 GB (H200)": 141}


@pytest.mark.parametrize(("scenario", "model_name", "power_limit_watts", "max_sm_clock_mhz"), [
    # NVIDIA's datasheets: H100 SXM up to 700 W, 1,980 MHz boost; L4 72 W, 2,040 MHz boost.
    ("healthy", "NVIDIA H100 80GB HBM3", 700.0, 1980.0),
    ("head_of_line", "NVIDIA L4", 72.0, 2040.0),
])
def test_the_simulated_dcgm_endpoint_reads_its_board_from_the_gpu_table(
        scenario: str, model_name: str, power_limit_watts: float, max_sm_clock_mhz: float) -> None:
    """The simulated engine's GPUs are the table's rows: one GPU table, no second one in the simulator."""
    import diagnostics.sim.dcgm as sim_dcgm
    from diagnostics.core.metrics.dcgm import parse_dcgm
    from diagnostics.sim.driver import Simulation

    [(_, _, text)] = Simulation(scenario).run_for_with_gpus(1)
    [device] = parse_dcgm(text).devices
    assert (device.name, device.power_limit_watts, device.sm_clock_max_mhz) == (
        model_name, power_limit_watts, max_sm_clock_mhz)
    assert not hasattr(sim_dcgm, "BOARDS")


def test_every_simulated_gpu_has_its_row_and_the_board_limits_the_dcgm_endpoint_serves() -> None:
    for name, spec in GPU_SPECS.items():
        if spec.variant is None:
            continue  # the CPU host: no GPU row
        row = GPUS_BY_NAME[spec.variant]
        assert row.limits is not None, name
        assert row.peak() is not None and spec.bandwidth_bytes_per_s == row.bandwidth_bytes_per_second, name
