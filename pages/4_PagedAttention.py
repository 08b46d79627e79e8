"""PagedAttention, explained with the real allocator: block size, sharing across samples, a workload."""

import pandas as pd
import streamlit as st

from diagnostics.core.capacity.arithmetic import parallel_sampling_blocks
from diagnostics.core.simulator.paged_demo import (
    block_grid_figure,
    block_size_figure,
    block_size_rows,
    cow_tables,
    demo_frames,
    sharing_figure,
)
from diagnostics.ui import shell

shell.page("PagedAttention")
st.markdown(
    "vLLM splits each sequence's KV cache into fixed-size **blocks**; a per-sequence **block table** "
    "maps logical token positions to physical blocks, like an OS page table. Nothing is reserved up "
    "front, so memory is wasted only in each sequence's last, partly filled block."
)

st.header("1 · Block size is a trade-off")
c1, c2 = st.columns([1, 2])
lengths_text = c1.text_input("Sequence lengths (tokens, comma-separated)", "40, 100, 1000", key="pa_lengths")
block_size = c1.select_slider("Block size", options=[8, 16, 32, 64, 128, 256], value=16, key="pa_block")
try:
    lengths = [int(x) for x in lengths_text.replace(" ", "").split(",") if x]
    if not lengths or min(lengths) <= 0:
        raise ValueError
except ValueError:
    c1.error("Enter positive whole numbers separated by commas, e.g. 40, 100, 1000.")
    lengths = [40]
rows = block_size_rows(lengths, block_size)
c1.dataframe(pd.DataFrame(rows), hide_index=True, key="pa_table")
c1.caption(
    "Seed example: 40 tokens at block size 16 → ⌈40/16⌉ = 3 blocks; the third holds 8 tokens and wastes 8 slots."
)
c2.plotly_chart(block_size_figure(lengths, [8, 16, 32, 64, 128, 256]), key="pa_bs_fig")
c2.caption("Larger blocks: more waste in the last block, fewer table entries. Smaller: the opposite.")

st.header("2 · Sharing blocks across parallel samples")
c1, c2 = st.columns([1, 2])
prompt = c1.number_input("Prompt tokens", 1, 100000, 200, key="pa_prompt")
n = c1.number_input("Samples (n)", 1, 64, 10, key="pa_n")
bs2 = c1.select_slider("Block size ", options=[8, 16, 32, 64, 128], value=16, key="pa_block2")
gen = c1.slider("Tokens generated per sample", 0, 64, 0, key="pa_gen")
blocks = parallel_sampling_blocks(int(prompt), int(n), bs2, gen)
m = c1.columns(3)
m[0].metric("No sharing", f"{blocks['without_sharing']:,}")
m[1].metric("V0 copy-on-write", f"{blocks['copy_on_write']:,}")
m[2].metric("V1 prefix sharing", f"{blocks['v1_prefix_sharing']:,}")
c2.plotly_chart(sharing_figure(int(prompt), int(n), bs2, 64), key="pa_share_fig")
c2.caption(
    "Seed example: 10 samples of a 200-token prompt at 16 → 13 × 10 = 130 blocks unshared, 13 shared "
    "until a sample diverges. V0 copies only the block being written (copy-on-write); V1 shares the full "
    "prompt blocks through the prefix cache and gives each sample its own partial last block."
)
tables, copies = cow_tables(int(prompt), int(n), bs2, gen)
with st.expander(f"V0 block tables after {gen} generated tokens ({copies} copy-on-write copies)"):
    st.dataframe(
        pd.DataFrame([{"sample": k, "block table": " ".join(map(str, t))} for k, t in tables.items()]),
        hide_index=True,
        key="pa_cow",
    )

st.header("3 · A workload, step by step")
frames = demo_frames()
step = st.slider("Step", 0, len(frames) - 1, 0, key="pa_step")
frame = frames[step]
st.markdown(f"**Step {frame.step}: {frame.action}** · KV usage {frame.usage * 100:.0f} %")
for event in frame.events:
    st.info(event)
c1, c2 = st.columns([3, 2])
c1.plotly_chart(block_grid_figure(frame), key="pa_grid")
c2.dataframe(
    pd.DataFrame([{"request": r, "block table": " → ".join(map(str, t))} for r, t in frame.tables.items()]),
    hide_index=True,
    key="pa_tables",
)
c2.caption(
    "16 blocks of 4 tokens. Green: held by one request; orange: shared (ref_cnt > 1); light blue: free but still "
    "cached, so a later prompt with the same prefix hits it. Freed blocks without cached content are reused "
    "first; cached ones are evicted least-recently-freed first (vLLM 0.32's free_blocks)."
)
