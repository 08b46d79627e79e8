"""How long a simulated engine step takes: a step-time model fitted to a recording, or the roofline.

The roofline (assumptions, stated): a step reads all weights plus the KV of every scheduled
sequence's context once from HBM, and does 2 × params FLOPs per token; its time is the larger of
bytes ÷ bandwidth and FLOPs ÷ (peak × 0.5 efficiency), plus the device's fixed per-step overhead
(scheduling and launches). No communication cost for TP beyond splitting weights and KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from diagnostics.core.capacity.arithmetic import kv_bytes_per_token, weight_bytes
from diagnostics.core.simulator.hardware import GpuSpec

if TYPE_CHECKING:  # the config names a StepTime; only its type is needed here
    from diagnostics.core.simulator.config import EngineConfig

COMPUTE_EFFICIENCY = 0.5


class StepTime(Protocol):
    """Seconds of one engine step (``step``: the engine's step number, for a model that draws noise)."""

    def seconds(self, prefill_tokens: int, num_seqs: int, context_tokens: int, step: int | None = None) -> float:
        ...


@dataclass(frozen=True, slots=True)
class Roofline:
    """The roofline of one model on one device, per GPU (see the module's assumptions)."""

    gpu: GpuSpec
    flops_per_token: float
    weight_bytes: float
    kv_bytes_per_token: float

    @classmethod
    def of(cls, config: EngineConfig) -> Roofline:
        tp = config.tensor_parallel_size
        return cls(config.gpu, 2 * config.model.num_params / max(1, tp),
                   weight_bytes(config.model, config.weight_dtype_bytes, tp),
                   kv_bytes_per_token(config.model, config.kv_dtype_bytes, tp))

    def work(self, prefill_tokens: int, num_seqs: int, context_tokens: int) -> tuple[float, float, float]:
        """One step's FLOPs, bytes read and bytes written per GPU (what vLLM's ``estimated_*_per_gpu``
        counters estimate): weights and KV read, new KV written."""
        tokens = prefill_tokens + num_seqs
        return (self.flops_per_token * tokens, self.weight_bytes + context_tokens * self.kv_bytes_per_token,
                tokens * self.kv_bytes_per_token)

    def seconds(self, prefill_tokens: int, num_seqs: int, context_tokens: int, step: int | None = None) -> float:
        """One step's time: memory or compute, whichever takes longer, plus the per-step overhead."""
        tokens = prefill_tokens + num_seqs
        memory_time = (self.weight_bytes + context_tokens * self.kv_bytes_per_token) / self.gpu.bandwidth_bytes_per_s
        compute_time = self.flops_per_token * tokens / (self.gpu.flops * COMPUTE_EFFICIENCY)
        return max(memory_time, compute_time) + self.gpu.step_overhead_s
