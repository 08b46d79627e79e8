"""The allocator against the real server: same prompts → same prefix-hit tokens (evictions
included), and the capacity arithmetic → the server's own block count and token capacity."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from diagnostics.core.capacity.arithmetic import ModelShape, capacity
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.simulator.allocator import KVCacheManager, Request
from tests.integration import load
from tests.integration.vllm_server import SERVED_NAME, VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def server_hits(url: str) -> tuple[float, int, int]:
    snap = parse_snapshot(httpx.get(url + "/metrics", timeout=5).text)
    config = snap.cache_config
    assert config is not None and config.num_gpu_blocks and config.block_size
    return snap.value("prefix_cache_hits") or 0.0, config.num_gpu_blocks, config.block_size


def run(url: str, prompt: list[int]) -> float:
    """One request with a token-id prompt; the server's prefix-hit tokens for it."""
    before, _, _ = server_hits(url)
    response = httpx.post(url + "/v1/completions", timeout=60,
                          json={"model": SERVED_NAME, "prompt": prompt, "max_tokens": 1})
    assert response.status_code == 200, response.text
    after, _, _ = server_hits(url)
    return after - before


def predict(manager: KVCacheManager, rid: str, prompt: list[int]) -> int:
    req = Request(rid, list(prompt))
    computed, hit = manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, req.num_tokens - hit, computed) is not None
    manager.check_invariants()
    manager.free(req)
    manager.check_invariants()
    return hit


def test_a_307_token_prompt_repeated_hits_256_as_the_allocator_says(vllm_main: VllmServer) -> None:
    rng = load.seeded_rng()
    prompt = [rng.randint(10, 2000) for _ in range(307)]
    _, blocks, block_size = server_hits(vllm_main.url)
    manager = KVCacheManager(blocks, block_size)
    assert (predict(manager, "a", prompt), run(vllm_main.url, prompt)) == (0, 0)
    assert (predict(manager, "b", prompt), run(vllm_main.url, prompt)) == (256, 256)


def test_hits_and_evictions_match_the_real_12_block_server(vllm_tiny: VllmServer) -> None:
    rng = load.seeded_rng()

    def fresh(n: int) -> list[int]:
        return [rng.randint(10, 2000) for _ in range(n)]

    p1, p3, p5 = fresh(300), fresh(700), fresh(900)
    workload = [p1, p1, p1[:256] + fresh(200), p3, p1, p3[:640] + fresh(10), p5, p3, p1, p5[:800] + fresh(5)]
    _, blocks, block_size = server_hits(vllm_tiny.url)
    assert (blocks, block_size) == (12, 128)
    manager = KVCacheManager(blocks, block_size)
    predicted = [predict(manager, f"r{i}", p) for i, p in enumerate(workload)]
    observed = [run(vllm_tiny.url, p) for p in workload]
    assert predicted == observed
    assert manager.block_pool.evicted, "the workload is meant to evict"
    assert any(h > 0 for h in observed) and any(h == 0 for h in observed[1:])


def test_the_capacity_arithmetic_gives_the_servers_blocks_and_tokens(vllm_main: VllmServer) -> None:
    snap = parse_snapshot(httpx.get(vllm_main.url + "/metrics", timeout=5).text)
    config = snap.cache_config
    assert config is not None and config.kv_cache_memory_bytes == 64 * 2**20
    shape = ModelShape.from_config(json.loads((ROOT / "tests/fixtures/tiny-config.json").read_text()), num_params=0)
    cap = capacity(shape, total_memory_bytes=config.kv_cache_memory_bytes, gpu_memory_utilization=1.0,
                   weight_dtype_bytes=0, block_size=config.block_size or 0)
    assert cap.blocks == config.num_gpu_blocks == 1024
    assert cap.tokens == config.kv_cache_size_tokens == 131072
