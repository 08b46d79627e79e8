"""The one table of GPUs: datasheet memory, bandwidth and dense BF16 peak, each row naming its
variant and the datasheet it comes from, and for the boards the simulated engine runs on, the
limits NVML / DCGM report for them (power limit, maximum clocks, temperature thresholds). The
roofline (against an NVML device name), the simulated engine's devices and their dcgm-exporter
endpoint, and the capacity page's memory sizes all read it."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True, slots=True)
class BoardLimits:
    """What NVML / DCGM report for one board: its name there, the default power limit, the maximum
    clocks and the temperature thresholds (datasheet TDP and clocks); the idle draw is the
    simulated engine's own assumption, not a datasheet number."""

    nvml_name: str  # the device name NVML (and DCGM's ``modelName``) gives
    power_limit_watts: float
    idle_watts: float
    max_sm_clock_mhz: float
    max_mem_clock_mhz: float
    slowdown_celsius: float
    shutdown_celsius: float


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU variant as its datasheet gives it; ``None`` where the table holds no datasheet number
    (such a device has memory for the capacity page but no roofline peak)."""

    name: str  # the variant ("A100 80GB SXM"): the form factor changes the bandwidth and the peak
    family: str  # how the capacity page names it beside its memory size ("A100")
    nvml_match: str  # matched (case-insensitive) inside the NVML device name
    memory_bytes: float  # decimal GB, as the datasheet states it
    bandwidth_bytes_per_second: float | None
    flops_per_second: float | None  # dense BF16 tensor peak, without sparsity
    source: str
    limits: BoardLimits | None = None  # where the simulated engine serves this board's DCGM fields

    def peak(self) -> DevicePeak | None:
        """Its roofline peaks; None when the table holds only its memory."""
        if self.flops_per_second is None or self.bandwidth_bytes_per_second is None:
            return None
        return DevicePeak(self.name, self.flops_per_second, self.bandwidth_bytes_per_second, self.source)


# Matched in this order, so a name that contains another's key comes first ("L40S" before "L4",
# "H100 PCIe" before "H100", the 80 GB A100s before the 40 GB one); within a memory size, rows are
# in the order the capacity page lists their families.
GPUS: tuple[Gpu, ...] = (
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, BF16 362 TFLOPS dense (733 with sparsity).
    Gpu("L40S", "L40S", "L40S", 48e9, 864e9, 362e12, "NVIDIA L40S datasheet"),
    # NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6, 300 GB/s, BF16 121 TFLOPS dense (242 sparse).
    Gpu("L4", "L4", "L4", 24e9, 300e9, 121e12, "NVIDIA L4 Tensor Core GPU datasheet",
        BoardLimits("NVIDIA L4", 72.0, 16.0, 2040.0, 6251.0, 85.0, 90.0)),
    # Memory only (no peak here): AWS EC2 G5's A10G, 24 GB GDDR6.
    Gpu("A10G", "A10G", "A10G", 24e9, None, None, "AWS EC2 G5 instance specifications"),
    # Memory only: GeForce RTX 4090, 24 GB GDDR6X.
    Gpu("RTX 4090", "4090", "RTX 4090", 24e9, None, None, "NVIDIA GeForce RTX 4090 specifications"),
    # Memory only: RTX A6000, 48 GB GDDR6.
    Gpu("RTX A6000", "A6000", "RTX A6000", 48e9, None, None, "NVIDIA RTX A6000 datasheet"),
    # NVIDIA A100 Tensor Core GPU datasheet: 80 GB HBM2e; SXM 2,039 GB/s, PCIe 1,935 GB/s; 40 GB
    # HBM2 1,555 GB/s (SXM and PCIe); BF16 312 TFLOPS dense (624 sparse) on every variant.
    Gpu("A100 80GB SXM", "A100", "A100-SXM4-80GB", 80e9, 2.039e12, 312e12, "NVIDIA A100 Tensor Core GPU datasheet",
        BoardLimits("NVIDIA A100-SXM4-80GB", 400.0, 60.0, 1410.0, 1593.0, 88.0, 93.0)),
    Gpu("A100 80GB PCIe", "A100", "A100 80GB PCIe", 80e9, 1.935e12, 312e12, "NVIDIA A100 Tensor Core GPU datasheet"),
    Gpu("A100 40GB", "A100", "A100", 40e9, 1.555e12, 312e12, "NVIDIA A100 Tensor Core GPU datasheet"),
    # NVIDIA H100 Tensor Core GPU datasheet: 80 GB; PCIe 2 TB/s and BF16 756 TFLOPS dense (1,513
    # sparse); SXM 3.35 TB/s and 989 TFLOPS dense (1,979 sparse).
    Gpu("H100 PCIe", "H100", "H100 PCIe", 80e9, 2.0e12, 756e12, "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    Gpu("H100 SXM", "H100", "H100", 80e9, 3.35e12, 989e12, "NVIDIA H100 Tensor Core GPU datasheet (SXM)",
        BoardLimits("NVIDIA H100 80GB HBM3", 700.0, 72.0, 1980.0, 2619.0, 87.0, 92.0)),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, BF16 989 TFLOPS dense.
    Gpu("H200 SXM", "H200", "H200", 141e9, 4.8e12, 989e12, "NVIDIA H200 Tensor Core GPU datasheet",
        BoardLimits("NVIDIA H200", 700.0, 75.0, 1980.0, 3201.0, 87.0, 92.0)),
)
GPUS_BY_NAME = {gpu.name: gpu for gpu in GPUS}


def peak_for(device_name: str | None) -> DevicePeak | None:
    """The datasheet peaks for an NVML device name (None for a device not in the table, or one it
    holds only the memory of)."""
    if not device_name:
        return None
    for gpu in GPUS:
        if gpu.nvml_match.lower() in device_name.lower():
            return gpu.peak()
    return None
