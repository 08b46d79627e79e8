"""The chart panels: each chart with a stable key or its empty state, the live panels over a
window, the roofline and the engines side by side.

Every string that came from a server goes through :func:`md_escape` before a Markdown-capable
element renders it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import plotly.graph_objects as go
import streamlit as st

from diagnostics.core.figures.engines import ENGINE_PANELS, engine_names, engines_figure
from diagnostics.core.figures.gpu import GPU_PANELS, gpu_figure
from diagnostics.core.figures.live import (
    LATENCY_NAMES,
    gpu_memory_figure,
    kv_usage_figure,
    latency_figure,
    outcomes_figure,
    prefix_hit_figure,
    queue_figure,
    roofline_figure,
    spec_decode_figure,
    throughput_figure,
)
from diagnostics.core.hardware import peak_for
from diagnostics.core.metrics.derive import Scrape, hit_rate_source, last_snapshot, prompt_sources, roofline, window
from diagnostics.core.metrics.gpu import GpuReading, clock_event_names
from diagnostics.core.text import gpu_rows, md_escape, prompt_sources_text, roofline_text


def chart(build: Callable[[], go.Figure | None], key: str, empty: str) -> None:
    """A chart with a stable key, or its empty state; a chart that fails to build says so and
    leaves the rest of the page standing."""
    try:
        fig = build()
    except Exception as exc:  # noqa: BLE001 - one broken chart must not take the panel down
        st.error(f"This chart could not be drawn: {md_escape(type(exc).__name__)}: {md_escape(exc)}")
        return
    if fig is None:
        st.info(empty)
    else:
        st.plotly_chart(fig, key=key, config={"displaylogo": False})


def panels(
    history: Sequence[Scrape],
    *,
    window_seconds: float,
    quantile_window_seconds: float,
    max_num_seqs: int | None,
    gpus: GpuReading | None,
    nvml_note: str | None,
    key: str,
    end: float | None = None,
    gpu_history: Sequence[tuple[float, GpuReading]] = (),
) -> None:
    """The live charts over ``window_seconds`` of history (``end`` defaults to the newest scrape);
    the GPU health panel over the GPU readings of the same window."""
    shown = window(history, window_seconds, end)
    last = last_snapshot(shown)
    config = last.snapshot.cache_config if last is not None and last.snapshot is not None else None
    if not shown:
        st.info("No scrape yet in this window.")
        return
    left, right = st.columns(2)
    with left:
        chart(lambda: kv_usage_figure(shown, config), f"{key}-kv", "This server exposes no KV-cache usage.")
    with right:
        chart(lambda: queue_figure(shown, max_num_seqs), f"{key}-queue", "No running/waiting gauges exposed.")
    left, right = st.columns(2)
    with left:
        chart(
            lambda: prefix_hit_figure(shown, quantile_window_seconds),
            f"{key}-prefix",
            "This server exposes no prefix-cache counters (V0, or prefix caching metrics absent).",
        )
        sources = prompt_sources_text(prompt_sources(window(shown, quantile_window_seconds)))
        st.caption(f"Hit rate: {md_escape(hit_rate_source(last.snapshot if last else None))}."
                   + (f" Prompt tokens over the last {quantile_window_seconds:g} s, at each request's first prefill: "
                      f"{md_escape(sources)}." if sources else ""))
    with right:
        chart(
            lambda: throughput_figure(shown), f"{key}-throughput", "No token counters yet (needs two scrapes)."
        )
    if last is not None and last.snapshot is not None and last.snapshot.has("spec_decode_num_drafts"):
        chart(partial(spec_decode_figure, shown, quantile_window_seconds), f"{key}-spec",
              "No draft token in this window.")
    roofline_panel(shown, quantile_window_seconds, gpus, key)
    engines_panel(shown, key)
    st.subheader("Latency")
    cols = st.columns(2)
    for i, concept in enumerate(LATENCY_NAMES):
        with cols[i % 2]:
            chart(
                partial(latency_figure, shown, concept, quantile_window_seconds),
                f"{key}-{concept}",
                f"No {LATENCY_NAMES[concept]} observed in this window (no request reached that point).",
            )
    left, right = st.columns(2)
    with left:
        chart(lambda: outcomes_figure(shown), f"{key}-outcomes", "No request finished in this window.")
    with right:
        if gpus is not None and gpus.devices:
            devices = gpus.devices
            chart(
                lambda: gpu_memory_figure(devices, config, last.snapshot if last else None),
                f"{key}-gpu",
                "No GPU reading.",
            )
        else:
            st.info("GPU memory: not available here" + _why(gpus, nvml_note) + ". " + GPU_SOURCES)
    start = shown[0].ts
    gpu_panel([g for g in gpu_history if g[0] >= start], gpus, nvml_note, key)


GPU_SOURCES = ("It is read with NVML when the dashboard runs on the GPU host, or from NVIDIA's dcgm-exporter "
               "given as the GPU metrics URL beside the vLLM URL; vLLM's /metrics has no GPU-health metric.")


def _why(gpus: GpuReading | None, nvml_note: str | None) -> str:
    why = gpus.unavailable if gpus is not None and gpus.unavailable else nvml_note
    return f" ({md_escape(why)})" if why else ""


def gpu_panel(history: Sequence[tuple[float, GpuReading]], last: GpuReading | None, nvml_note: str | None,
              key: str) -> None:
    """GPU health per device: the clocks-event reasons now, utilisation, temperature, power against
    its limit and the SM clock against its maximum over the window (NVML or dcgm-exporter)."""
    st.subheader("GPU health")
    if last is None or not last.devices:
        st.info("GPU health: not available here" + _why(last, nvml_note) + ". " + GPU_SOURCES)
        return
    st.caption(f"Read from {md_escape(last.source or 'NVML')} beside each scrape · {len(last.devices)} device"
               + ("s" if len(last.devices) != 1 else "") + ". Clock-event reasons are NVML's (DCGM exports the "
               "same bitmask): idle and application clocks are normal; power cap, power brake, thermal and HW "
               "slowdown hold the clocks down.")
    for device in last.devices:
        if device.throttles:
            st.warning(f"{md_escape(device.label)} is throttled now: "
                       f"{md_escape(', '.join(clock_event_names(device.throttles)))}. No vLLM flag fixes this: check "
                       "the cooling or the power cap (Diagnose names which).")
    rows = gpu_rows(last)
    st.dataframe(
        {"Device": [r.device for r in rows], "Clock-event reasons": [r.clock_events for r in rows],
         "Utilisation": [r.utilization for r in rows], "Temperature": [r.temperature for r in rows],
         "Power (of limit)": [r.power for r in rows], "SM clock (of max)": [r.sm_clock for r in rows]},
        hide_index=True, key=f"{key}-gpu-table",
    )
    cols = st.columns(2)
    for i, panel in enumerate(GPU_PANELS):
        with cols[i % 2]:
            chart(partial(gpu_figure, history, panel.key), f"{key}-gpu-{panel.key}",
                  f"{panel.title.split(' (')[0]}: not reported by {md_escape(last.source or 'this source')}.")


def roofline_panel(shown: Sequence[Scrape], window_seconds: float, gpus: GpuReading | None, key: str) -> None:
    """vLLM's estimate of the work per GPU, against the device's peaks when NVML names it."""
    last = last_snapshot(shown)
    if last is None or last.snapshot is None or not last.snapshot.has("estimated_flops_per_gpu"):
        return
    roof = roofline(window(shown, window_seconds))
    if roof is None:
        st.caption("Live roofline: off. vLLM estimates FLOP/s and memory traffic per GPU when the server runs with "
                   "`--enable-mfu-metrics` (its estimated_*_per_gpu counters stay 0 without it).")
        return
    peak = peak_for(gpus.devices[0].name) if gpus is not None and gpus.devices else None
    chart(partial(roofline_figure, shown, peak), f"{key}-roofline", "No work estimate in this window.")
    text = roofline_text(roof, peak)
    if text:
        st.caption(md_escape(text))


def engines_panel(shown: Sequence[Scrape], key: str) -> None:
    """Engines side by side, when the server runs more than one (``--data-parallel-size``)."""
    if len(engine_names(shown)) < 2:
        return
    st.subheader("Engines side by side")
    st.caption("One line per data-parallel engine. Judge an engine by its tokens: a rank whose tokens stop while "
               "its peers serve is hung (Diagnose names it), and the server totals above only drop by its share. "
               "Its gauges are what it last reported: they freeze when it stops. One rank queueing while another has "
               "room means requests are routed around vLLM's balancer (a sticky router); Diagnose names that too.")
    cols = st.columns(2)
    for i, (concept, title, unit, kind) in enumerate(ENGINE_PANELS):
        with cols[i % 2]:
            chart(partial(engines_figure, shown, concept, title, unit, kind), f"{key}-engines-{concept}",
                  f"No {title.lower()} in this window.")
