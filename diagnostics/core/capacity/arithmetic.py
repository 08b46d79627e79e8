"""The capacity arithmetic behind the knob table (shared/reference §5, seed 000's stages 1-3).

KV bytes per token = 2 (K and V) × layers × KV heads per GPU (total ÷ TP, at least 1) × head dim ×
dtype bytes; for MLA (DeepSeek) one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer, not
split by TP. The capacity ceiling is what ``--gpu-memory-utilization`` leaves after the weights
and the runtime overhead, divided by those bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagnostics.core.hardware import GPUS

DTYPE_BYTES = {"auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0, "fp8": 1.0,
               "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "int8": 1.0, "int4": 0.5, "awq": 0.5, "gptq": 0.5}
GB = 1e9


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the arithmetic needs from a model's config.json."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    kv_lora_rank: int | None = None  # MLA
    qk_rope_head_dim: int | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "config.json",
                    num_params: float | None = None) -> ModelShape:
        """A Hugging Face ``config.json`` (dense, GQA or MLA). Raises ``ValueError`` with the
        missing key when it cannot be used."""
        def need(key: str) -> int:
            value = config.get(key)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"config.json has no usable {key!r}")
            return value

        layers = need("num_hidden_layers")
        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or hidden // heads
        params = num_params if num_params is not None else estimate_params(config)
        if config.get("kv_lora_rank"):
            return cls(name, layers, 1, int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0),
                       params, int(config["kv_lora_rank"]), int(config.get("qk_rope_head_dim") or 0))
        return cls(name, layers, int(kv_heads), int(head_dim), params)


def estimate_params(config: Mapping[str, Any]) -> float:
    """A dense decoder's parameter count from its config (embeddings, attention, MLP)."""
    hidden = int(config.get("hidden_size", 0))
    layers = int(config.get("num_hidden_layers", 0))
    heads = int(config.get("num_attention_heads", 1))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // max(heads, 1))
    inter = int(config.get("intermediate_size", 4 * hidden))
    vocab = int(config.get("vocab_size", 0))
    attention = hidden * head_dim * (heads * 2 + kv_heads * 2)
    mlp = 3 * hidden * inter
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return float(layers * (attention + mlp) + embeddings)


# config.json values of common models (parameter counts from their model cards).
MODEL_PRESETS: dict[str, ModelShape] = {
    "Llama-3.1-8B": ModelShape("Llama-3.1-8B", 32, 8, 128, 8.03e9),
    "Llama-3.1-70B": ModelShape("Llama-3.1-70B", 80, 8, 128, 70.6e9),
    "Qwen2.5-7B": ModelShape("Qwen2.5-7B", 28, 4, 128, 7.62e9),
    "Qwen2.5-72B": ModelShape("Qwen2.5-72B", 80, 8, 128, 72.7e9),
    "Mistral-7B-v0.1": ModelShape("Mistral-7B-v0.1", 32, 8, 128, 7.24e9),
    "DeepSeek-V2-Lite (MLA)": ModelShape("DeepSeek-V2-Lite (MLA)", 27, 1, 576, 15.7e9, 512, 64),
}


def _memory_presets() -> dict[str, float]:
    """The GPU table's memory sizes (GB), each named by the families that have it: "80 GB (A100 / H100)"."""
    families: dict[float, list[str]] = {}
    for gpu in GPUS:
        names = families.setdefault(gpu.memory_bytes / GB, [])
        if gpu.family not in names:
            names.append(gpu.family)
    return {f"{gb:g} GB ({' / '.join(names)})": gb for gb, names in sorted(families.items())}


GPU_PRESETS_GB = _memory_presets()


def kv_bytes_per_token(shape: ModelShape, kv_dtype_bytes: float = 2.0, tensor_parallel_size: int = 1) -> float:
    """KV-cache bytes one token occupies on one GPU."""
    if shape.is_mla:
        # One compressed latent per layer, replicated on every TP rank.
        return shape.num_layers * shape.head_dim * kv_dtype_bytes
    heads_per_rank = max(1, shape.num_kv_heads // max(1, tensor_parallel_size))
    return 2 * shape.num_layers * heads_per_rank * shape.head_dim * kv_dtype_bytes


def weight_bytes(shape: ModelShape, weight_dtype_bytes: float = 2.0, tensor_parallel_size: int = 1) -> float:
    """Weight bytes on one GPU."""
    return shape.num_params * weight_dtype_bytes / max(1, tensor_parallel_size)


@dataclass(frozen=True, slots=True)
class Capacity:
    total_bytes: float
    usable_bytes: float  # total × gpu_memory_utilization
    weight_bytes: float
    overhead_bytes: float
    kv_bytes: float  # what is left for the KV cache (≤ 0: does not fit)
    kv_bytes_per_token: float
    tokens: int
    blocks: int
    block_size: int
    concurrency_at_context: float | None
    context_tokens: int | None

    @property
    def fits(self) -> bool:
        return self.kv_bytes > 0 and self.tokens > 0


def capacity(
    shape: ModelShape,
    *,
    total_memory_bytes: float,
    gpu_memory_utilization: float = 0.9,
    weight_dtype_bytes: float = 2.0,
    kv_dtype_bytes: float = 2.0,
    tensor_parallel_size: int = 1,
    overhead_bytes: float = 0.0,
    block_size: int = 16,
    context_tokens: int | None = None,
) -> Capacity:
    """The KV capacity ceiling of one GPU: (total × utilization − weights − overhead) ÷ bytes/token."""
    usable = total_memory_bytes * gpu_memory_utilization
    weights = weight_bytes(shape, weight_dtype_bytes, tensor_parallel_size)
    per_token = kv_bytes_per_token(shape, kv_dtype_bytes, tensor_parallel_size)
    kv = usable - weights - overhead_bytes
    blocks = max(0, int(kv // (per_token * block_size))) if kv > 0 else 0
    tokens = blocks * block_size
    concurrency = tokens / context_tokens if context_tokens else None
    return Capacity(total_memory_bytes, usable, weights, overhead_bytes, kv, per_token, tokens, blocks, block_size,
                    concurrency, context_tokens)


def blocks_for(num_tokens: int, block_size: int) -> tuple[int, int]:
    """``(blocks, wasted slots in the last block)`` for one sequence."""
    blocks = math.ceil(num_tokens / block_size) if num_tokens > 0 else 0
    return blocks, blocks * block_size - num_tokens


def parallel_sampling_blocks(prompt_tokens: int, n: int, block_size: int,
                             generated_tokens: int = 0) -> dict[str, int]:
    """Blocks for n samples of one prompt: without sharing, with V0 copy-on-write, with V1 sharing.

    Without sharing every sample holds the whole prompt. With copy-on-write the prompt's blocks
    are shared until a sample writes into a shared partial block, which it then copies. In V1
    only *full* prompt blocks are shared (through the prefix cache); each sample owns its partial
    last block from the start.
    """
    prompt_blocks, _ = blocks_for(prompt_tokens, block_size)
    full_prompt_blocks = prompt_tokens // block_size
    per_sample_total, _ = blocks_for(prompt_tokens + generated_tokens, block_size)
    without = n * per_sample_total
    own_after_prompt = per_sample_total - full_prompt_blocks  # blocks each sample writes itself
    if generated_tokens == 0:
        cow = prompt_blocks
    else:
        cow = full_prompt_blocks + n * own_after_prompt
    v1 = full_prompt_blocks + n * own_after_prompt if prompt_tokens % block_size or generated_tokens else prompt_blocks
    return {"without_sharing": without, "copy_on_write": cow, "v1_prefix_sharing": v1}
