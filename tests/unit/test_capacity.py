"""The capacity arithmetic on the seed's and vLLM's worked examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnostics.core.capacity.arithmetic import MODEL_PRESETS, ModelShape, capacity, kv_bytes_per_token
from diagnostics.core.text import GIB

LLAMA_8B = MODEL_PRESETS["Llama-3.1-8B"]


def test_llama_31_8b_in_bf16_needs_128_kib_per_token() -> None:
    assert kv_bytes_per_token(LLAMA_8B, 2.0) == 128 * 1024


def test_80_gb_at_0_9_leaves_72_gb() -> None:
    assert capacity(LLAMA_8B, total_memory_bytes=80e9, gpu_memory_utilization=0.9).usable_bytes == pytest.approx(72e9)


def test_40_gib_of_kv_holds_20480_blocks_and_10x_at_32k() -> None:
    # shared/reference §5.3: 40 GiB available KV → 20,480 blocks of 16 ≈ 327,680 tokens; 10.0x at 32,768.
    weights = LLAMA_8B.num_params * 2
    cap = capacity(LLAMA_8B, total_memory_bytes=40 * GIB + weights, gpu_memory_utilization=1.0,
                   block_size=16, context_tokens=32768)
    assert cap.blocks == 20480 and cap.tokens == 327680
    assert cap.concurrency_at_context == pytest.approx(10.0)


def test_fp8_doubles_and_tp2_halves_the_bytes() -> None:
    assert kv_bytes_per_token(LLAMA_8B, 1.0) == 64 * 1024
    assert kv_bytes_per_token(LLAMA_8B, 2.0, tensor_parallel_size=2) == 64 * 1024
    # KV heads replicate when TP exceeds them: never fewer than one head per rank.
    assert kv_bytes_per_token(LLAMA_8B, 2.0, tensor_parallel_size=16) == kv_bytes_per_token(LLAMA_8B, 2.0, 8)


def test_mla_is_one_latent_per_layer_and_not_split_by_tp() -> None:
    mla = MODEL_PRESETS["DeepSeek-V2-Lite (MLA)"]
    assert kv_bytes_per_token(mla, 2.0) == 27 * 576 * 2
    assert kv_bytes_per_token(mla, 2.0, tensor_parallel_size=8) == kv_bytes_per_token(mla, 2.0)


def test_a_model_that_does_not_fit_says_so() -> None:
    cap = capacity(MODEL_PRESETS["Llama-3.1-70B"], total_memory_bytes=80e9, gpu_memory_utilization=0.9)
    assert not cap.fits and cap.tokens == 0


def test_config_json_of_the_test_model() -> None:
    config = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "tiny-config.json").read_text())
    shape = ModelShape.from_config(config)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (2, 2, 32)
    # 2 (K,V) × 2 layers × 2 heads × 32 × 2 bytes: 64 MiB hold 131,072 tokens = 1,024 blocks of 128,
    # which is what the real server reports (tests/integration/test_paged_real.py).
    assert kv_bytes_per_token(shape, 2.0) == 512
    assert 64 * 2**20 // 512 // 128 == 1024


def test_config_json_without_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelShape.from_config({"hidden_size": 4096})
