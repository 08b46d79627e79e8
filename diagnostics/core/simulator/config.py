"""What a simulated engine is started with: ``vllm serve``'s flags, the model and the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diagnostics.core.capacity.arithmetic import MODEL_PRESETS, ModelShape, capacity
from diagnostics.core.simulator.hardware import GPU_SPECS, GpuSpec

if TYPE_CHECKING:  # the cost model reads the config; only the protocol's type is needed here
    from diagnostics.core.simulator.cost import StepTime


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelShape = MODEL_PRESETS["Llama-3.1-8B"]
    gpu: GpuSpec = GPU_SPECS["H100-80GB"]
    tensor_parallel_size: int = 1
    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: from the capacity arithmetic
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    kv_dtype_bytes: float = 2.0
    weight_dtype_bytes: float = 2.0
    served_model_name: str = "sim-llama-3.1-8b"
    max_loras: int = 0  # --max-loras (0: LoRA off); adapters beyond it wait ("deferred")
    max_num_queued_reqs: int | None = None  # --max-num-queued-reqs: more waiting than this is rejected
    num_speculative_tokens: int = 0  # --speculative-config num_speculative_tokens (0: no speculation)
    spec_acceptance: float = 0.7  # chance each draft token is accepted, given the ones before it were
    # A step-time model fitted to a recording (``whatif.StepCost``) instead of the roofline; None: the
    # roofline (:class:`~diagnostics.core.simulator.cost.Roofline`).
    step_cost: StepTime | None = None

    def resolved_num_gpu_blocks(self) -> int:
        if self.num_gpu_blocks:
            return self.num_gpu_blocks
        cap = capacity(self.model, total_memory_bytes=self.gpu.memory_bytes,
                       gpu_memory_utilization=self.gpu_memory_utilization, weight_dtype_bytes=self.weight_dtype_bytes,
                       kv_dtype_bytes=self.kv_dtype_bytes, tensor_parallel_size=self.tensor_parallel_size,
                       overhead_bytes=2e9, block_size=self.block_size)
        return max(2, cap.blocks)
