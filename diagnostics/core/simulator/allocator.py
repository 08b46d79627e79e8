"""PagedAttention's block allocator, in vLLM's own vocabulary, for teaching and for the simulator.

:class:`BlockPool` and :class:`KVCacheManager` mirror vLLM v1 (``vllm/v1/core/block_pool.py``,
``kv_cache_manager.py``, ``kv_cache_utils.py``): fixed-size blocks, a null block (block 0, never
handed out), ``ref_cnt``, a free-block queue in LRU eviction order, hashes over *full* blocks
chained through the parent block's hash, prefix-cache hits, ``allocate_slots`` returning ``None``
when blocks run out, and eviction of cached blocks on demand. :class:`CopyOnWriteBlockTables`
mirrors V0's parallel sampling (``vllm/core/block/``): the n samples' block tables share the
prompt's blocks, and the first divergent write copies only the block being written.

Every public mutating method keeps :meth:`check_invariants` true; the tests call it after every step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

NULL_BLOCK_ID = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """``vllm/v1/core/kv_cache_utils.py::KVCacheBlock``: one physical block."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    is_null: bool = False


class FreeKVCacheBlockQueue:
    """``FreeKVCacheBlockQueue``: free blocks in eviction order (least recently freed first).

    vLLM keeps a doubly linked list for O(1) removal from the middle (a cached block touched
    again); an insertion-ordered dict gives the same operations here.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._queue: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.block_id in self._queue

    def popleft(self) -> KVCacheBlock:
        return self._queue.popitem(last=False)[1]

    def remove(self, block: KVCacheBlock) -> None:
        del self._queue[block.block_id]

    def append(self, block: KVCacheBlock) -> None:
        self._queue[block.block_id] = block

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put blocks at the front, ``blocks[0]`` first (next to be reused)."""
        for block in reversed(blocks):
            self._queue[block.block_id] = block
            self._queue.move_to_end(block.block_id, last=False)

    def ids(self) -> list[int]:
        return list(self._queue)


class BlockPool:
    """``vllm/v1/core/block_pool.py::BlockPool``."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True, record_evictions: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("need at least 2 blocks (one is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # vLLM takes the null block out of the free queue once, at start, and never frees it.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}
        # Block ids whose cached content was evicted, in order (for the teaching page; a long
        # simulation does not keep them).
        self.evicted: list[int] = []
        self.record_evictions = record_evictions

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        """``get_cached_block``: the block holding this content, if still cached."""
        return self.cached_block_hash_to_block.get(block_hash)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        """``cache_full_blocks``: give newly full blocks their hash so later requests can hit them."""
        if not self.enable_caching:
            return
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is not None:
                continue
            block.block_hash = block_hashes[i]
            self.cached_block_hash_to_block.setdefault(block_hashes[i], block)

    def _evict(self, block: KVCacheBlock) -> None:
        """``_maybe_evict_cached_block``: a reused free block forgets its cached content."""
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
            if self.record_evictions:
                self.evicted.append(block.block_id)
        block.block_hash = None

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """``get_new_blocks``: pop from the head of the free queue (evicting cached content)."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        out = []
        pop = self.free_block_queue._queue.popitem  # the queue's popleft, inlined (the simulator's hot path)
        cached = self.cached_block_hash_to_block
        record = self.evicted.append if self.record_evictions else None
        for _ in range(num_blocks):
            block = pop(last=False)[1]
            block_hash = block.block_hash
            if block_hash is not None:  # _evict, inlined
                if cached.get(block_hash) is block:
                    del cached[block_hash]
                    if record is not None:
                        record(block.block_id)
                block.block_hash = None
            block.ref_cnt += 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """``touch``: a prefix-cache hit takes a block out of the free queue if nobody held it."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """``free_blocks``: drop a reference. Callers pass blocks in eviction order (a request's
        tail first). Since vLLM 0.2x, blocks with no hash are reused first (prepended: LIFO, for
        locality) while cached blocks go to the tail (FIFO, which makes eviction LRU)."""
        evict_first: list[KVCacheBlock] = []
        queue = self.free_block_queue._queue
        caching = self.enable_caching
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if block.block_hash is None or not caching:
                    evict_first.append(block)
                else:
                    queue[block.block_id] = block  # the tail: evicted last
        if evict_first:
            self.free_block_queue.prepend_n(evict_first)

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_usage(self) -> float:
        """``get_usage``: vLLM's ``kv_cache_usage_perc`` (the null block excluded)."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def check_invariants(self) -> None:
        free_ids = set(self.free_block_queue.ids())
        assert len(free_ids) == len(self.free_block_queue), "a block is in the free queue twice"
        zero_ids = {b.block_id for b in self.blocks if b.ref_cnt == 0 and not b.is_null}
        assert free_ids == zero_ids, f"free queue {sorted(free_ids)} != ref_cnt==0 blocks {sorted(zero_ids)}"
        assert all(b.ref_cnt >= 0 for b in self.blocks), "negative ref_cnt"
        used = sum(1 for b in self.blocks if b.ref_cnt > 0 and not b.is_null)
        assert used + len(free_ids) == self.num_gpu_blocks - 1, "free + used != total - 1"
        for block_hash, block in self.cached_block_hash_to_block.items():
            assert block.block_hash == block_hash, "cached map points at a block with other content"


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """``hash_block_tokens``: a full block's hash, chained through its parent's so that equal
    blocks only match with equal prefixes."""
    return hash((parent_hash, tuple(token_ids)))


@dataclass(slots=True)
class Request:
    """What the manager needs of a request: its id and its tokens (prompt, then outputs)."""

    request_id: str
    token_ids: list[int]
    num_computed_tokens: int = 0
    num_prompt_tokens: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(slots=True)
class PrefixCacheStats:
    """``PrefixCacheStats``: what ``vllm:prefix_cache_queries/hits`` count (new requests only)."""

    queries: int = 0
    hits: int = 0


class KVCacheManager:
    """``vllm/v1/core/kv_cache_manager.py::KVCacheManager`` for one full-attention group."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool = True,
                 record_evictions: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, record_evictions)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.req_to_block_hashes: dict[str, list[int]] = {}  # vLLM keeps these on the Request
        self.prefix_cache_stats = PrefixCacheStats()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """``get_computed_blocks``: the longest cached prefix of full blocks. At least the last
        prompt token is always recomputed, so a fully cached prompt hits one token short."""
        if not self.enable_caching:
            return [], 0
        computed, num_computed_tokens = self.find_computed_blocks(request)
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_computed_tokens
        return computed, num_computed_tokens

    def find_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """:meth:`get_computed_blocks` without counting the lookup in the prefix-cache stats."""
        if not self.enable_caching:
            return [], 0
        hashes = self._hashes(request, request.num_tokens // self.block_size)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        computed: list[KVCacheBlock] = []
        cached = self.block_pool.cached_block_hash_to_block
        for block_hash in hashes[:max_hit_blocks]:
            block = cached.get(block_hash)
            if block is None:
                break
            computed.append(block)
        return computed, len(computed) * self.block_size

    def can_allocate(self, request: Request, num_new_tokens: int,
                     new_computed_blocks: Sequence[KVCacheBlock] = ()) -> bool:
        """Whether :meth:`allocate_slots` would succeed now."""
        blocks = self.req_to_blocks.get(request.request_id, ())
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_new_blocks = cdiv(num_computed + num_new_tokens, self.block_size) - len(blocks) - len(new_computed_blocks)
        # Touching a cached block with ref_cnt 0 takes it out of the free queue too.
        num_evictable_computed = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return num_new_blocks <= self.block_pool.get_num_free_blocks() - num_evictable_computed

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVCacheBlock] = ()) -> list[KVCacheBlock] | None:
        """``allocate_slots``: blocks for ``num_new_tokens`` more tokens, or None when the pool
        cannot supply them (the scheduler then preempts or waits)."""
        if not new_computed_blocks:
            return self._allocate_more(request, num_new_tokens)
        if not self.can_allocate(request, num_new_tokens, new_computed_blocks):
            return None
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_new_blocks = cdiv(num_computed + num_new_tokens, self.block_size) - len(blocks) - len(new_computed_blocks)
        self.block_pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(0, num_new_blocks))
        blocks.extend(new_blocks)
        if self.enable_caching:
            num_full = min(num_computed + num_new_tokens, request.num_tokens) // self.block_size
            cached = self.num_cached_block.get(request.request_id, 0)
            if num_full > cached:
                self.block_pool.cache_full_blocks(blocks, self._hashes(request, num_full), cached, num_full)
                self.num_cached_block[request.request_id] = num_full
        return new_blocks

    def _allocate_more(self, request: Request, num_new_tokens: int) -> list[KVCacheBlock] | None:
        """:meth:`allocate_slots` without prefix-cache hits (a decode step, a prompt that hit
        nothing): the same blocks and caching, in fewer steps (the simulator calls it per block)."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        if blocks is None:
            blocks = self.req_to_blocks[rid] = []
        total = request.num_computed_tokens + num_new_tokens
        bs = self.block_size
        num_new_blocks = -(-total // bs) - len(blocks)
        new_blocks: list[KVCacheBlock] = []
        if num_new_blocks > 0:
            pool = self.block_pool
            if num_new_blocks > len(pool.free_block_queue._queue):
                if not blocks:
                    del self.req_to_blocks[rid]
                return None
            if num_new_blocks == 1:  # a decoder's next block: get_new_blocks(1), inlined
                block = pool.free_block_queue._queue.popitem(last=False)[1]
                if block.block_hash is not None:
                    pool._evict(block)
                block.ref_cnt += 1
                new_blocks = [block]
                blocks.append(block)
            else:
                new_blocks = pool.get_new_blocks(num_new_blocks)
                blocks.extend(new_blocks)
        if self.enable_caching:
            tokens = request.token_ids
            num_full = min(total, len(tokens)) // bs
            cached = self.num_cached_block.get(rid, 0)
            if num_full > cached:
                hashes = self.req_to_block_hashes.get(rid)
                if num_full == cached + 1 and hashes is not None and len(hashes) == cached:
                    # One block just filled (a decoder's): _hashes and cache_full_blocks, inlined.
                    block_hash = hash((hashes[-1] if hashes else None, tuple(tokens[cached * bs:num_full * bs])))
                    hashes.append(block_hash)
                    block = blocks[cached]
                    if block.block_hash is None:
                        block.block_hash = block_hash
                        self.block_pool.cached_block_hash_to_block.setdefault(block_hash, block)
                else:
                    self.block_pool.cache_full_blocks(blocks, self._hashes(request, num_full), cached, num_full)
                self.num_cached_block[rid] = num_full
        return new_blocks

    def cache_computed(self, request: Request) -> None:
        """Give the request's computed full blocks their hashes now (what ``allocate_slots`` would
        have done at the step each filled; the simulator's fast-forward allocates only new blocks)."""
        if not self.enable_caching or request.request_id not in self.req_to_blocks:
            return
        num_full = min(request.num_computed_tokens, len(request.token_ids)) // self.block_size
        cached = self.num_cached_block.get(request.request_id, 0)
        if num_full > cached:
            blocks = self.req_to_blocks[request.request_id]
            self.block_pool.cache_full_blocks(blocks, self._hashes(request, num_full), cached, num_full)
            self.num_cached_block[request.request_id] = num_full

    def _hashes(self, request: Request, num_full_blocks: int) -> list[int]:
        """The request's chained block hashes, extended incrementally as its blocks fill."""
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        bs = self.block_size
        tokens = request.token_ids
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_full_blocks):
            parent = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))  # hash_block_tokens, inlined
            hashes.append(parent)
        return hashes

    def free(self, request: Request) -> None:
        """``free``: release a request's blocks, tail first (so its last blocks are evicted first)."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)
        self.req_to_block_hashes.pop(request.request_id, None)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table: logical block i lives in physical block ``ids[i]``."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def check_invariants(self) -> None:
        self.block_pool.check_invariants()
        holders: dict[int, int] = {}
        for blocks in self.req_to_blocks.values():
            for block in blocks:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        for block in self.block_pool.blocks:
            if not block.is_null:
                assert block.ref_cnt == holders.get(block.block_id, 0), (
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but held by {holders.get(block.block_id, 0)}")


class CopyOnWriteBlockTables:
    """V0 parallel sampling (``vllm/core/block/cpu_gpu_block_allocator.py`` + ``BlockTable.fork``):
    n sequences fork from one prompt and share its blocks (``ref_cnt`` = n); appending a token to
    a block someone else also holds copies that one block first (copy-on-write)."""

    def __init__(self, num_gpu_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching=False)
        self.tables: dict[str, list[KVCacheBlock]] = {}
        self.num_tokens: dict[str, int] = {}
        self.copies: list[tuple[str, int, int]] = []  # (seq id, from block, to block)

    def allocate_prompt(self, seq_id: str, num_prompt_tokens: int) -> list[int]:
        self.tables[seq_id] = self.block_pool.get_new_blocks(cdiv(num_prompt_tokens, self.block_size))
        self.num_tokens[seq_id] = num_prompt_tokens
        return [b.block_id for b in self.tables[seq_id]]

    def fork(self, parent: str, child: str) -> list[int]:
        """The child's table points at the parent's physical blocks (no copy yet)."""
        blocks = list(self.tables[parent])
        for block in blocks:
            block.ref_cnt += 1
        self.tables[child] = blocks
        self.num_tokens[child] = self.num_tokens[parent]
        return [b.block_id for b in blocks]

    def append_token(self, seq_id: str) -> list[int]:
        """One generated token: a new block when the last is full, a private copy when it is shared."""
        table = self.tables[seq_id]
        used = self.num_tokens[seq_id]
        if used % self.block_size == 0:
            table.extend(self.block_pool.get_new_blocks(1))
        elif table[-1].ref_cnt > 1:
            shared = table[-1]
            (copy,) = self.block_pool.get_new_blocks(1)
            self.block_pool.free_blocks([shared])
            table[-1] = copy
            self.copies.append((seq_id, shared.block_id, copy.block_id))
        self.num_tokens[seq_id] = used + 1
        return [b.block_id for b in table]

    def free(self, seq_id: str) -> None:
        self.block_pool.free_blocks(reversed(self.tables.pop(seq_id)))
        self.num_tokens.pop(seq_id)

    def num_physical_blocks(self) -> int:
        return self.block_pool.num_gpu_blocks - 1 - self.block_pool.get_num_free_blocks()

    def check_invariants(self) -> None:
        self.block_pool.check_invariants()
        holders: dict[int, int] = {}
        for table in self.tables.values():
            for block in table:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        for block in self.block_pool.blocks:
            if not block.is_null:
                assert block.ref_cnt == holders.get(block.block_id, 0)
