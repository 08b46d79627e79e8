"""Capacity: KV bytes per token, the ceiling at --gpu-memory-utilization, checked against the server."""

import json

import streamlit as st

from diagnostics.core.capacity.arithmetic import DTYPE_BYTES, GPU_PRESETS_GB, MODEL_PRESETS, ModelShape, capacity
from diagnostics.core.capacity.server_check import check_server
from diagnostics.core.metrics.derive import last_snapshot
from diagnostics.core.text import md_escape
from diagnostics.ui import resources, shell, state

target = shell.page("Capacity")
c1, c2, c3 = st.columns(3)
preset = c1.selectbox("Model", [*MODEL_PRESETS, "paste a config.json"], key="cap_model")
shape = MODEL_PRESETS.get(preset)
if shape is None:
    text = c1.text_area("config.json", key="cap_config", height=120)
    params_b = c1.number_input(
        "Parameters (billions; 0 = estimate from the config)", 0.0, 2000.0, 0.0, key="cap_params"
    )
    try:
        shape = ModelShape.from_config(json.loads(text or "{}"), num_params=params_b * 1e9 or None)
    except (ValueError, AttributeError) as exc:
        c1.error(f"Cannot use this config.json: {md_escape(exc)}")
        st.stop()
gpu = c2.selectbox("GPU memory", [*GPU_PRESETS_GB, "custom"], index=[*GPU_PRESETS_GB.values()].index(80),
                   key="cap_gpu")
total_gb = GPU_PRESETS_GB.get(gpu) or c2.number_input("GPU memory (GB)", 1.0, 1000.0, 80.0, key="cap_gb")
util = c2.slider("--gpu-memory-utilization", 0.5, 1.0, 0.9, 0.01, key="cap_util")
overhead = c2.number_input("Activations, CUDA graphs, runtime (GB)", 0.0, 100.0, 0.0, key="cap_overhead")
weights_dtype = c3.selectbox("Weights", ["bfloat16", "fp8", "int4", "float32"], key="cap_wdtype")
kv_dtype = c3.selectbox("--kv-cache-dtype", ["auto", "fp8"], key="cap_kvdtype")
tp = c3.select_slider("--tensor-parallel-size", [1, 2, 4, 8], key="cap_tp")
block = c3.select_slider("Block size", [16, 32, 64, 128], key="cap_block")
context = c3.number_input("Context per request (tokens)", 1, 1_000_000, 32768, key="cap_ctx")
cap = capacity(
    shape,
    total_memory_bytes=total_gb * 1e9,
    gpu_memory_utilization=util,
    weight_dtype_bytes=DTYPE_BYTES[weights_dtype],
    kv_dtype_bytes=DTYPE_BYTES[kv_dtype],
    tensor_parallel_size=tp,
    overhead_bytes=overhead * 1e9,
    block_size=block,
    context_tokens=int(context),
)
m = st.columns(4)
m[0].metric("Usable (total × utilization)", f"{cap.usable_bytes / 1e9:,.1f} GB")
m[1].metric("Weights per GPU", f"{cap.weight_bytes / 1e9:,.1f} GB")
m[2].metric("KV bytes per token", f"{cap.kv_bytes_per_token / 1024:,.1f} KiB")
m[3].metric("Left for the KV cache", f"{cap.kv_bytes / 1e9:,.1f} GB")
m = st.columns(4)
m[0].metric("KV capacity", f"{cap.tokens:,} tokens")
m[1].metric("Blocks", f"{cap.blocks:,}")
m[2].metric(f"Sequences at {int(context):,} tokens", f"{cap.concurrency_at_context or 0:,.1f}")
m[3].metric("Fits?", "yes" if cap.fits else "no")
if not cap.fits:
    st.error("The weights do not leave room for any KV cache: quantize, add --tensor-parallel-size, or both.")
st.caption(
    f"{md_escape(shape.name)}: 2 (K and V) × {shape.num_layers} layers × "
    f"{max(1, shape.num_kv_heads // tp) if not shape.is_mla else 1} KV heads per GPU × {shape.head_dim} × "
    f"{DTYPE_BYTES[kv_dtype]:g} bytes" + (" (MLA: one latent per layer, not split by TP)" if shape.is_mla else "")
)

st.header("Check against the attached server")
if target is None:
    st.info("Attach a server in the sidebar to check this arithmetic against what it reports.")
    st.stop()


@st.fragment(run_every=state.refresh_seconds())
def server_check() -> None:
    collector = resources.source(target)
    last = last_snapshot(collector.history())
    if last is None or last.snapshot is None or last.snapshot.cache_config is None:
        st.info("No cache_config_info from this server yet.")
        return
    for line in check_server(last.snapshot.cache_config, collector.status().info):
        getattr(st, line.level)(md_escape(line.text))


server_check()
