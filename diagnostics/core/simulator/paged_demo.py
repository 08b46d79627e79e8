"""A small, deterministic workload stepped through the real allocator, frame by frame, for the
PagedAttention page: each request's block table, every physical block's state, and the events
(prefix hits, evictions, refusals) as they happen. Plus the figures that draw them."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from diagnostics.core.capacity.arithmetic import blocks_for, parallel_sampling_blocks
from diagnostics.core.simulator.allocator import CopyOnWriteBlockTables, KVCacheManager, Request

STATE_COLORS = {"null": "#424242", "free": "#f0f0f0", "cached": "#c6dbef", "used": "#74c476", "shared": "#fd8d3c"}


@dataclass(frozen=True, slots=True)
class Frame:
    step: int
    action: str
    events: tuple[str, ...]
    tables: dict[str, list[int]]
    block_state: tuple[str, ...]  # per physical block: null / free / cached / used / shared
    block_owner: tuple[str, ...]  # who holds it (comma-separated request ids), or the cached hash tag
    usage: float


SYSTEM_PROMPT = list(range(1000, 1010))  # a 10-token shared system prompt


def _snapshot(manager: KVCacheManager, step: int, action: str, events: list[str]) -> Frame:
    owners: dict[int, list[str]] = {}
    for rid, blocks in manager.req_to_blocks.items():
        for b in blocks:
            owners.setdefault(b.block_id, []).append(rid)
    states, labels = [], []
    for block in manager.block_pool.blocks:
        if block.is_null:
            states.append("null")
            labels.append("null block")
        elif block.ref_cnt > 1:
            states.append("shared")
            labels.append(", ".join(owners.get(block.block_id, [])))
        elif block.ref_cnt == 1:
            states.append("used")
            labels.append(", ".join(owners.get(block.block_id, [])))
        elif block.block_hash is not None:
            states.append("cached")
            labels.append("cached, free (evictable)")
        else:
            states.append("free")
            labels.append("free")
    tables = {rid: manager.get_block_ids(rid) for rid in manager.req_to_blocks}
    return Frame(step, action, tuple(events), tables, tuple(states), tuple(labels), manager.usage)


def demo_frames(num_gpu_blocks: int = 16, block_size: int = 4) -> list[Frame]:
    """Four requests sharing a system prompt arrive, decode, finish; a later one hits the cache;
    a long one forces evictions; one is refused when blocks run out."""
    manager = KVCacheManager(num_gpu_blocks, block_size)
    frames = [_snapshot(manager, 0, "empty pool: block 0 is the null block, never handed out", [])]
    live: dict[str, Request] = {}
    step = 0

    def admit(rid: str, tokens: list[int]) -> None:
        nonlocal step
        step += 1
        req = Request(rid, tokens)
        evicted_before = len(manager.block_pool.evicted)
        computed, hit = manager.get_computed_blocks(req)
        new = manager.allocate_slots(req, req.num_tokens - hit, computed)
        events = []
        if hit:
            events.append(f"{rid}: prefix-cache hit on {hit} tokens (blocks {[b.block_id for b in computed]})")
        if new is None:
            events.append(f"{rid}: allocate_slots returned None: not enough free blocks, it waits")
        else:
            req.num_computed_tokens = req.num_tokens
            live[rid] = req
        evicted = manager.block_pool.evicted[evicted_before:]
        if evicted:
            events.append(f"evicted cached content of blocks {evicted} (least recently freed first)")
        frames.append(_snapshot(manager, step, f"{rid} arrives with {req.num_tokens} prompt tokens", events))

    def decode(tokens: int) -> None:
        nonlocal step
        step += 1
        events = []
        for rid, req in list(live.items()):
            for t in range(tokens):
                req.token_ids.append(5000 + t)
                if manager.allocate_slots(req, 1) is None:
                    req.token_ids.pop()
                    events.append(f"{rid}: no block for its next token (vLLM would preempt it)")
                    break
                req.num_computed_tokens += 1
        frames.append(_snapshot(manager, step, f"every running request decodes {tokens} tokens", events))

    def finish(rid: str) -> None:
        nonlocal step
        step += 1
        manager.free(live.pop(rid))
        frames.append(
            _snapshot(
                manager,
                step,
                f"{rid} finishes: its blocks return to the free queue, still cached",
                [f"{rid}'s full blocks keep their hash until they are reused"],
            )
        )

    admit("A", SYSTEM_PROMPT + [1, 2, 3])
    admit("B", SYSTEM_PROMPT + [4, 5, 6, 7, 8])
    decode(3)
    finish("A")
    admit("C", SYSTEM_PROMPT + [1, 2, 3, 9])
    admit("D", list(range(2000, 2022)))
    admit("E", list(range(3000, 3030)))
    finish("B")
    finish("C")
    admit("E", list(range(3000, 3030)))
    return frames


def block_grid_figure(frame: Frame, columns: int = 8) -> go.Figure:
    """The physical blocks as a grid coloured by state, each labelled with its id and holders."""
    n = len(frame.block_state)
    xs = [i % columns for i in range(n)]
    ys = [i // columns for i in range(n)]
    fig = go.Figure()
    for state, color in STATE_COLORS.items():
        idx = [i for i in range(n) if frame.block_state[i] == state]
        if not idx:
            continue
        fig.add_trace(
            go.Scatter(
                x=[xs[i] for i in idx],
                y=[ys[i] for i in idx],
                mode="markers+text",
                name=state,
                marker={"symbol": "square", "size": 46, "color": color, "line": {"color": "#999", "width": 1}},
                text=[f"{i}" for i in idx],
                textfont={"color": "#000" if state != "null" else "#fff"},
                customdata=[frame.block_owner[i] for i in idx],
                hovertemplate="block %{text}: %{customdata}<extra>" + state + "</extra>",
            )
        )
    rows = (n + columns - 1) // columns
    fig.update_layout(
        height=90 + 62 * rows,
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        xaxis={"visible": False, "range": [-0.6, columns - 0.4]},
        yaxis={"visible": False, "autorange": "reversed", "range": [-0.6, rows - 0.4]},
        legend={"orientation": "h", "y": -0.05},
        plot_bgcolor="white",
    )
    return fig


def block_size_figure(lengths: list[int], block_sizes: list[int]) -> go.Figure:
    """Wasted slots in the last block, summed over the sequences, and block-table entries, per block size."""
    waste = [sum(blocks_for(n, bs)[1] for n in lengths) for bs in block_sizes]
    entries = [sum(blocks_for(n, bs)[0] for n in lengths) for bs in block_sizes]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(x=[str(b) for b in block_sizes], y=waste, name="wasted slots (last blocks)", marker_color="#fd8d3c")
    )
    fig.add_trace(
        go.Scatter(
            x=[str(b) for b in block_sizes],
            y=entries,
            name="block-table entries",
            yaxis="y2",
            mode="lines+markers",
            line={"color": "#3182bd"},
        )
    )
    fig.update_layout(
        height=300,
        margin={"l": 50, "r": 50, "t": 20, "b": 40},
        xaxis_title="block size (tokens)",
        xaxis_type="category",
        yaxis_title="wasted token slots",
        legend={"orientation": "h", "y": -0.3},
        yaxis2={"title": "entries", "overlaying": "y", "side": "right", "rangemode": "tozero"},
    )
    return fig


def sharing_figure(prompt_tokens: int, n: int, block_size: int, max_generated: int) -> go.Figure:
    """Physical blocks for n samples as they generate: no sharing, V0 copy-on-write, V1 prefix sharing."""
    gens = list(range(0, max_generated + 1))
    series = {
        k: [parallel_sampling_blocks(prompt_tokens, n, block_size, g)[k] for g in gens]
        for k in ("without_sharing", "copy_on_write", "v1_prefix_sharing")
    }
    names = {
        "without_sharing": "no sharing",
        "copy_on_write": "V0 copy-on-write",
        "v1_prefix_sharing": "V1 prefix sharing",
    }
    fig = go.Figure()
    styles = {"without_sharing": ("#d62728", "solid", 2), "copy_on_write": ("#1f77b4", "solid", 5),
              "v1_prefix_sharing": ("#2ca02c", "dash", 2)}
    for key, values in series.items():
        color, dash, width = styles[key]
        fig.add_trace(go.Scatter(x=gens, y=values, name=names[key], mode="lines", line_shape="hv",
                                 line={"color": color, "dash": dash, "width": width}))
    fig.update_layout(
        height=300,
        margin={"l": 50, "r": 20, "t": 20, "b": 40},
        xaxis_title="tokens generated per sample",
        yaxis_title="physical blocks",
        legend={"orientation": "h", "y": -0.3},
        yaxis_rangemode="tozero",
    )
    return fig


def block_size_rows(lengths: list[int], block_size: int) -> list[dict[str, int]]:
    """One row per sequence: blocks, last-block fill, wasted slots, block-table entries."""
    rows = []
    for n in lengths:
        blocks, waste = blocks_for(n, block_size)
        rows.append({"tokens": n, "blocks": blocks, "tokens in last block": block_size - waste,
                     "wasted slots": waste, "block-table entries": blocks})
    return rows


def cow_tables(prompt_tokens: int, n: int, block_size: int, generated: int) -> tuple[dict[str, list[int]], int]:
    """V0 block tables of n samples after ``generated`` tokens each, and how many copy-on-writes ran."""
    per_sample = prompt_tokens // block_size + generated // block_size + 3
    cow = CopyOnWriteBlockTables(num_gpu_blocks=n * per_sample + 2, block_size=block_size)
    cow.allocate_prompt("sample 0", prompt_tokens)
    for i in range(1, n):
        cow.fork("sample 0", f"sample {i}")
    for _ in range(generated):
        for i in range(n):
            cow.append_token(f"sample {i}")
    cow.check_invariants()
    return {s: [b.block_id for b in t] for s, t in cow.tables.items()}, len(cow.copies)
