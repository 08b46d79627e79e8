"""The block allocator: exact block ids in scenarios, invariants under random operations, and the
seed's worked examples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnostics.core.capacity.arithmetic import blocks_for, parallel_sampling_blocks
from diagnostics.core.simulator.allocator import CopyOnWriteBlockTables, KVCacheManager, Request


def admit(manager: KVCacheManager, request: Request) -> list[int] | None:
    """What the scheduler does for a new request: prefix-cache lookup, then allocate the rest."""
    computed, num_computed = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - num_computed, computed)
    if new is None:
        return None
    request.num_computed_tokens = request.num_tokens
    manager.check_invariants()
    return manager.get_block_ids(request.request_id)


def test_blocks_come_from_the_head_of_the_free_queue_and_block_0_is_null() -> None:
    manager = KVCacheManager(num_gpu_blocks=10, block_size=4)
    assert admit(manager, Request("a", list(range(10)))) == [1, 2, 3]
    assert admit(manager, Request("b", list(range(100, 105)))) == [4, 5]
    assert manager.usage == pytest.approx(5 / 9)


def test_a_repeated_prompt_hits_its_full_blocks_only() -> None:
    manager = KVCacheManager(num_gpu_blocks=10, block_size=4)
    admit(manager, Request("a", list(range(10))))  # blocks 1, 2 full; 3 partial
    second = Request("b", list(range(10)))
    computed, hit_tokens = manager.get_computed_blocks(second)
    assert [b.block_id for b in computed] == [1, 2] and hit_tokens == 8
    manager.allocate_slots(second, 2, computed)
    assert manager.get_block_ids("b") == [1, 2, 4]
    assert manager.block_pool.blocks[1].ref_cnt == 2
    manager.check_invariants()


def test_the_307_token_prompt_at_block_size_128_hits_256() -> None:
    """What the real vllm serve reports: 2 full blocks of 128 hit, the 51-token tail never does."""
    manager = KVCacheManager(num_gpu_blocks=64, block_size=128)
    prompt = list(range(307))
    admit(manager, Request("first", prompt))
    manager.free(Request("first", prompt))
    before = manager.prefix_cache_stats.hits
    admit(manager, Request("again", list(prompt)))
    assert manager.prefix_cache_stats.hits - before == 256


def test_a_fully_cached_prompt_still_recomputes_its_last_token() -> None:
    manager = KVCacheManager(num_gpu_blocks=10, block_size=4)
    admit(manager, Request("a", list(range(8))))
    _, hit = manager.get_computed_blocks(Request("b", list(range(8))))
    assert hit == 4


def test_freed_blocks_stay_cached_until_evicted_in_lru_order() -> None:
    manager = KVCacheManager(num_gpu_blocks=6, block_size=4)  # 5 usable blocks
    a = Request("a", list(range(8)))
    admit(manager, a)  # blocks 1, 2
    manager.free(a)  # tail first: free queue ... 2, 1
    assert manager.block_pool.get_num_free_blocks() == 5
    admit(manager, Request("b", list(range(100, 112))))  # needs 3: takes 3, 4, 5
    assert manager.get_block_ids("b") == [3, 4, 5]
    assert manager.block_pool.evicted == []
    admit(manager, Request("c", list(range(200, 204))))  # needs 1: evicts block 2 (a's tail) first
    assert manager.get_block_ids("c") == [2] and manager.block_pool.evicted == [2]
    _, hit = manager.get_computed_blocks(Request("a2", list(range(8)) + [999]))
    assert hit == 4  # a's first block (1) is still cached


def test_allocate_slots_returns_none_when_blocks_run_out() -> None:
    manager = KVCacheManager(num_gpu_blocks=4, block_size=4)  # 3 usable
    assert admit(manager, Request("a", list(range(12)))) == [1, 2, 3]
    req = Request("b", list(range(50, 54)))
    assert admit(manager, req) is None
    assert "b" not in manager.req_to_blocks
    manager.check_invariants()


def test_decode_appends_a_block_at_each_boundary() -> None:
    manager = KVCacheManager(num_gpu_blocks=10, block_size=4)
    req = Request("a", list(range(4)))
    admit(manager, req)
    for token in range(5):
        req.token_ids.append(1000 + token)
        assert manager.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
        manager.check_invariants()
    assert manager.get_block_ids("a") == [1, 2, 3]


def test_copy_on_write_copies_only_the_written_block() -> None:
    cow = CopyOnWriteBlockTables(num_gpu_blocks=64, block_size=16)
    assert cow.allocate_prompt("s0", 200) == list(range(1, 14))
    for i in range(1, 10):
        assert cow.fork("s0", f"s{i}") == list(range(1, 14))
    assert cow.num_physical_blocks() == 13
    table = cow.append_token("s3")  # writes into the shared partial block 13: copy it
    assert table[:12] == list(range(1, 13)) and table[12] == 14
    assert cow.copies == [("s3", 13, 14)]
    assert cow.num_physical_blocks() == 14
    cow.check_invariants()


def test_seed_examples() -> None:
    assert blocks_for(40, 16) == (3, 8)
    blocks = parallel_sampling_blocks(200, 10, 16)
    assert blocks["without_sharing"] == 130 and blocks["copy_on_write"] == 13
    # V1 shares only the 12 full prompt blocks; each sample owns its 8-token tail block.
    assert blocks["v1_prefix_sharing"] == 12 + 10


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["new", "decode", "free"]), st.integers(0, 7), st.integers(1, 40)),
                max_size=60))
def test_invariants_hold_under_any_sequence_of_operations(ops: list[tuple[str, int, int]]) -> None:
    manager = KVCacheManager(num_gpu_blocks=12, block_size=4)
    live: dict[int, Request] = {}
    for op, slot, size in ops:
        if op == "new" and slot not in live:
            # Shared prefixes on purpose: slots 0-3 and 4-7 share their first tokens.
            req = Request(f"r{slot}-{size}", [slot // 4] * 6 + list(range(size)))
            if admit(manager, req) is not None:
                live[slot] = req
        elif op == "decode" and slot in live:
            req = live[slot]
            req.token_ids.append(size)
            if manager.allocate_slots(req, 1) is not None:
                req.num_computed_tokens += 1
            else:
                req.token_ids.pop()
        elif op == "free" and slot in live:
            manager.free(live.pop(slot))
        manager.check_invariants()
    for req in live.values():
        manager.free(req)
    manager.check_invariants()
    assert manager.block_pool.get_num_free_blocks() == 11


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.lists(st.integers(0, 7), max_size=40))
def test_copy_on_write_invariants(prompt: int, n: int, writers: list[int]) -> None:
    cow = CopyOnWriteBlockTables(num_gpu_blocks=200, block_size=8)
    cow.allocate_prompt("s0", prompt)
    for i in range(1, n):
        cow.fork("s0", f"s{i}")
    for w in writers:
        cow.append_token(f"s{w % n}")
        cow.check_invariants()
    for i in range(n):
        cow.free(f"s{i}")
    cow.check_invariants()


def test_uncached_blocks_are_reused_first_and_cached_ones_last() -> None:
    """vLLM 0.32's free_blocks: a freed block with no hash is prepended (LIFO reuse), a cached one
    appended (so cached content is evicted least-recently-freed first)."""
    manager = KVCacheManager(num_gpu_blocks=10, block_size=4)
    a = Request("a", list(range(6)))  # block 1 full (cached), block 2 partial (no hash)
    admit(manager, a)
    manager.free(a)
    assert manager.block_pool.free_block_queue.ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1]
    assert admit(manager, Request("b", list(range(100, 104)))) == [2]
