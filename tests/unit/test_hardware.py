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
