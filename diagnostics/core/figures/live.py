"""The live and replay pages' charts (pure: history in, figure out): KV cache, queue, prefix
cache, speculative decoding, roofline, latency, throughput, outcomes, GPU memory.

Each builder returns ``None`` when there is nothing honest to draw, and the page shows an empty
state instead of an empty chart. Units are the ones people use: %, ms, tok/s, GiB.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import plotly.graph_objects as go

from diagnostics.core.figures.common import add_quantile_traces, apply_layout, as_datetimes, has_values
from diagnostics.core.hardware import DevicePeak
from diagnostics.core.metrics.catalog import CacheConfig, Snapshot
from diagnostics.core.metrics.derive import Scrape, labels_total, spec_decode
from diagnostics.core.metrics.gpu import GpuDevice
from diagnostics.core.metrics.series import (
    gauge_series,
    increase_events,
    label_picker,
    labelled_increase,
    peak_series,
    rate_series,
    rolling_quantiles,
    rolling_ratio,
)
from diagnostics.core.text import GIB, si_scale

LATENCY_NAMES = {
    "time_to_first_token_seconds": "TTFT",
    "inter_token_latency_seconds": "ITL",
    "e2e_request_latency_seconds": "end-to-end",
    "request_queue_time_seconds": "queue time",
}
WAITING_COLORS = {"capacity": "#ff7f0e", "deferred": "#9e9e9e"}


def kv_usage_figure(history: Sequence[Scrape], config: CacheConfig | None) -> go.Figure | None:
    """KV-cache block usage (%), with blocks and tokens in the hover, preemptions marked."""
    usage = gauge_series(history, lambda s: s.value("kv_cache_usage_perc"))
    if not has_values(usage):
        return None
    pct = [v * 100 if v is not None else None for v in usage.values]
    custom = None
    hover = "%{y:.1f} %"
    if config is not None and config.num_gpu_blocks:
        usable = config.num_gpu_blocks - 1  # vLLM's usage excludes the null block
        block = config.block_size or 0
        custom = [[(v or 0) * usable, (v or 0) * usable * block] for v in usage.values]
        hover = "%{y:.1f} % · %{customdata[0]:,.0f} of " + f"{usable:,}" + " blocks · %{customdata[1]:,.0f} tokens"
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=as_datetimes(usage.ts),
            y=pct,
            name="KV-cache usage",
            mode="lines",
            line={"color": "#2ca02c"},
            customdata=custom,
            hovertemplate=hover + "<extra></extra>",
            connectgaps=False,
        )
    )
    peak = peak_series(history, lambda s: s.value("kv_cache_usage_perc"))
    if peak is not None:
        _peak_trace(fig, peak.ts, [v * 100 if v is not None else None for v in peak.values], "#2ca02c", "%{y:.1f} %")
    events = increase_events(history, lambda s: s.value("num_preemptions"))
    if events.ts:
        fig.add_trace(
            go.Scatter(
                x=as_datetimes(events.ts),
                y=[100] * len(events.ts),
                name="preemptions",
                mode="markers",
                marker={"symbol": "triangle-down", "size": 11, "color": "#d62728"},
                customdata=events.values,
                hovertemplate="%{customdata:.0f} preempted<extra></extra>",
            )
        )
    return apply_layout(fig, "KV-cache block usage", "% of blocks in use", yaxis_range=[0, 105])


def _peak_trace(fig: go.Figure, ts: Sequence[float], values: Sequence[float | None], color: str, hover: str) -> None:
    """The maximum within each point of a history of aggregates, dotted above the last values."""
    fig.add_trace(go.Scatter(x=as_datetimes(list(ts)), y=list(values), name="peak in the interval", mode="lines",
                             line={"color": color, "dash": "dot", "width": 1},
                             hovertemplate="peak " + hover + "<extra></extra>", connectgaps=False))


def prefix_hit_figure(history: Sequence[Scrape], window_seconds: float) -> go.Figure | None:
    """Prefix-cache hit rate over a trailing window, with queried and hit token rates."""
    if not any(s.snapshot is not None and s.snapshot.has("prefix_cache_queries") for s in history):
        return None
    ratio = rolling_ratio(
        history, lambda s: s.value("prefix_cache_hits"), lambda s: s.value("prefix_cache_queries"), window_seconds
    )
    queried = rate_series(history, lambda s: s.value("prefix_cache_queries"))
    hits = rate_series(history, lambda s: s.value("prefix_cache_hits"))
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=as_datetimes(ratio.ts),
            y=[v * 100 if v is not None else None for v in ratio.values],
            name=f"hit rate ({window_seconds:g} s window)",
            mode="lines",
            line={"color": "#9467bd", "width": 3},
            hovertemplate="%{y:.1f} %<extra>hit rate</extra>",
        )
    )
    for series, name, color in ((queried, "queried tok/s (5 s)", "#7f7f7f"), (hits, "hit tok/s (5 s)", "#17becf")):
        fig.add_trace(
            go.Scatter(
                x=as_datetimes(series.ts),
                y=series.values,
                name=name,
                mode="lines",
                yaxis="y2",
                line={"color": color, "dash": "dot"},
                hovertemplate="%{y:,.0f} tok/s<extra>" + name + "</extra>",
            )
        )
    return apply_layout(
        fig,
        "Prefix-cache hit rate",
        "% of queried tokens hit",
        yaxis_range=[0, 105],
        yaxis2={"title": "tokens/s", "overlaying": "y", "side": "right", "rangemode": "tozero"},
    )


def queue_figure(history: Sequence[Scrape], max_num_seqs: int | None) -> go.Figure | None:
    """Running and waiting requests (waiting by reason when exposed) against the running cap."""
    running = gauge_series(history, lambda s: s.value("num_requests_running"))
    if not has_values(running):
        return None
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=as_datetimes(running.ts), y=running.values, name="running", mode="lines", line={"color": "#1f77b4"})
    )
    running_peak = peak_series(history, lambda s: s.value("num_requests_running"))
    if running_peak is not None:
        _peak_trace(fig, running_peak.ts, running_peak.values, "#1f77b4", "%{y:.0f} running")
    reasons: set[str] = set()
    for s in history:
        if s.snapshot is not None:
            reasons.update((s.snapshot.by_label("num_requests_waiting_by_reason") or {}).keys())
    if reasons:
        for reason in sorted(reasons):
            series = gauge_series(history, label_picker("num_requests_waiting_by_reason", reason))
            color = WAITING_COLORS.get(reason, "#bcbd22")
            fig.add_trace(
                go.Scatter(
                    x=as_datetimes(series.ts), y=series.values, name=f"waiting ({reason})", mode="lines",
                    stackgroup="waiting", line={"color": color}, fillcolor=color,
                )
            )
    else:
        waiting = gauge_series(history, lambda s: s.value("num_requests_waiting"))
        fig.add_trace(
            go.Scatter(x=as_datetimes(waiting.ts), y=waiting.values, name="waiting", mode="lines", line={"color": "#ff7f0e"})
        )
    rejected = increase_events(history, labels_total("admission_rejections"))
    if rejected.ts:
        # Turned away at the queue limit (HTTP 503): marked where they happened, at the queue's height.
        fig.add_trace(
            go.Scatter(
                x=as_datetimes(rejected.ts),
                y=[_waiting_at(history, t) for t in rejected.ts],
                name="rejected (HTTP 503)",
                mode="markers",
                marker={"symbol": "x", "size": 10, "color": "#d62728"},
                customdata=rejected.values,
                hovertemplate="%{customdata:.0f} rejected by a queue limit<extra></extra>",
            )
        )
    swapped = gauge_series(history, lambda s: s.value("num_requests_swapped"))
    if has_values(swapped):
        fig.add_trace(go.Scatter(x=as_datetimes(swapped.ts), y=swapped.values, name="swapped (V0)", mode="lines"))
    if max_num_seqs:
        fig.add_hline(
            y=max_num_seqs,
            line_dash="dash",
            line_color="#d62728",
            annotation_text=f"--max-num-seqs {max_num_seqs}",
            annotation_position="top left",
        )
    return apply_layout(fig, "Queue depth", "requests", yaxis_rangemode="tozero")


def _waiting_at(history: Sequence[Scrape], ts: float) -> float:
    snap = next((s.snapshot for s in history if s.ts == ts and s.snapshot is not None), None)
    return (snap.value("num_requests_waiting") or 0.0) if snap is not None else 0.0


def spec_decode_figure(history: Sequence[Scrape], window_seconds: float) -> go.Figure | None:
    """Speculative decoding: the share of draft tokens accepted, and per draft position the share of
    drafts whose token there was accepted (over a trailing window); None without speculation."""
    overall = rolling_ratio(history, lambda s: s.value("spec_decode_num_accepted_tokens"),
                            lambda s: s.value("spec_decode_num_draft_tokens"), window_seconds)
    if not has_values(overall):
        return None
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=as_datetimes(overall.ts), y=[v * 100 if v is not None else None for v in overall.values],
                             name="all draft tokens", mode="lines", line={"width": 3, "color": "#2ca02c"},
                             hovertemplate="%{y:.0f} % of draft tokens accepted<extra></extra>"))
    positions: set[str] = set()
    for scrape in history:
        if scrape.snapshot is not None:
            positions.update(scrape.snapshot.by_label("spec_decode_num_accepted_tokens_per_pos") or {})
    for pos in sorted(positions, key=lambda p: int(p) if p.isdigit() else 0):
        series = rolling_ratio(history, label_picker("spec_decode_num_accepted_tokens_per_pos", pos),
                               lambda s: s.value("spec_decode_num_drafts"), window_seconds)
        fig.add_trace(go.Scatter(x=as_datetimes(series.ts), y=[v * 100 if v is not None else None for v in series.values],
                                 name=f"position {html.escape(pos)}", mode="lines", line={"width": 1.2, "dash": "dot"},
                                 hovertemplate=f"position {html.escape(pos)}: %{{y:.0f}} % of drafts<extra></extra>"))
    spec = spec_decode(history)
    length = spec.mean_accepted_length if spec is not None else None
    title = "Speculative decoding: draft acceptance" + (
        f" (mean accepted length {length:.2f} tokens/step)" if length is not None else "")
    return apply_layout(fig, title, f"% accepted ({window_seconds:g} s)", yaxis_range=[0, 105])


def roofline_figure(history: Sequence[Scrape], peak: DevicePeak | None = None) -> go.Figure | None:
    """vLLM's estimate of the work per GPU over time: TFLOP/s and memory TB/s (5 s average), as a
    share of the device's datasheet peaks when the device is known; None without the counters."""
    flops = rate_series(history, lambda s: s.value("estimated_flops_per_gpu"))
    read = rate_series(history, lambda s: s.value("estimated_read_bytes_per_gpu"))
    write = rate_series(history, lambda s: s.value("estimated_write_bytes_per_gpu"))
    if not any(v for v in flops.values if v) and not any(v for v in read.values if v):
        return None
    moved = [(r or 0.0) + (w or 0.0) if r is not None else None for r, w in zip(read.values, write.values)]
    fig = go.Figure()
    if peak is not None:
        for series, values, name, full in ((flops, flops.values, "compute (MFU)", peak.flops_per_second),
                                           (read, moved, "memory bandwidth", peak.bandwidth_bytes_per_second)):
            fig.add_trace(go.Scatter(x=as_datetimes(series.ts), y=[v / full * 100 if v is not None else None for v in values],
                                     name=name, mode="lines", hovertemplate="%{y:.1f} % of peak<extra>" + name
                                     + "</extra>"))
        return apply_layout(fig, f"Roofline (vLLM's estimate) against the {peak.name}", "% of datasheet peak",
                       yaxis_rangemode="tozero")
    f_scale, f_unit = si_scale([v for v in flops.values if v], "FLOP/s")
    b_scale, b_unit = si_scale([v for v in moved if v], "B/s")
    fig.add_trace(go.Scatter(x=as_datetimes(flops.ts), y=[v / f_scale if v is not None else None for v in flops.values],
                             name=f_unit, mode="lines", line={"color": "#9467bd"}))
    fig.add_trace(go.Scatter(x=as_datetimes(read.ts), y=[v / b_scale if v is not None else None for v in moved],
                             name=f"memory {b_unit}", mode="lines", line={"color": "#17becf"}, yaxis="y2"))
    fig.update_layout(yaxis2={"title": b_unit, "overlaying": "y", "side": "right", "rangemode": "tozero"})
    return apply_layout(fig, "Work per GPU (vLLM's estimate)", f_unit, yaxis_rangemode="tozero")




def latency_figure(history: Sequence[Scrape], concept: str, window_seconds: float) -> go.Figure | None:
    """p50 / p95 / p99 of one latency histogram over a trailing window, in ms."""
    quantiles = rolling_quantiles(history, concept, (0.5, 0.95, 0.99), window_seconds)
    if quantiles is None or not any(has_values(s) for s in quantiles.values()):
        return None
    fig = go.Figure()
    for q, series in quantiles.items():
        add_quantile_traces(fig, f"p{round(q * 100)}", series)
    name = LATENCY_NAMES.get(concept, concept)
    return apply_layout(fig, f"{name} ({window_seconds:g} s window)", "milliseconds", yaxis_rangemode="tozero")



def throughput_figure(history: Sequence[Scrape]) -> go.Figure | None:
    """Prompt and generation tokens per second."""
    prompt = rate_series(history, lambda s: s.value("prompt_tokens"))
    gen = rate_series(history, lambda s: s.value("generation_tokens"))
    if not gen.ts and not prompt.ts:
        return None
    fig = go.Figure()
    for series, name, color in ((prompt, "prompt", "#8c564b"), (gen, "generation", "#2ca02c")):
        fig.add_trace(
            go.Scatter(
                x=as_datetimes(series.ts),
                y=series.values,
                name=name,
                mode="lines",
                line={"color": color},
                hovertemplate="%{y:,.0f} tok/s<extra>" + name + "</extra>",
            )
        )
    return apply_layout(fig, "Token throughput (5 s average)", "tokens/s", yaxis_rangemode="tozero")


def outcomes_figure(history: Sequence[Scrape]) -> go.Figure | None:
    """Finished requests by reason over the history shown; None when nothing finished."""
    counts = labelled_increase(history, "request_success")
    if not counts or sum(counts.values()) <= 0:
        return None
    labels = [k for k, v in counts.items() if v > 0]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=[counts[k] for k in labels],
            marker_color="#1f77b4",
            hovertemplate="%{y:,.0f} requests<extra>%{x}</extra>",
        )
    )
    return apply_layout(fig, "Finished requests by reason", "requests", xaxis_title="finished_reason")


def gpu_memory_figure(
    devices: Sequence[GpuDevice], config: CacheConfig | None, snapshot: Snapshot | None
) -> go.Figure | None:
    """Where the GPU memory went: used vs total per device (NVML or DCGM), the gpu_memory_utilization
    ceiling, the KV pool and the KV bytes in use. Devices whose memory was not reported are left out."""
    gpus = [g for g in devices if g.memory_used_bytes is not None and g.memory_total_bytes]
    if not gpus:
        return None
    names = [g.label for g in gpus]
    used = [(g.memory_used_bytes or 0) / GIB for g in gpus]
    total = [(g.memory_total_bytes or 0) / GIB for g in gpus]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            y=names,
            x=total,
            name="total",
            orientation="h",
            marker_color="#e0e0e0",
            hovertemplate="%{x:.1f} GiB<extra>total</extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            y=names,
            x=used,
            name="used (all processes)",
            orientation="h",
            marker_color="#1f77b4",
            hovertemplate="%{x:.1f} GiB<extra>used</extra>",
        )
    )
    if config is not None and config.kv_cache_memory_bytes:
        pool = config.kv_cache_memory_bytes / GIB
        fig.add_trace(
            go.Bar(
                y=names,
                x=[pool] * len(gpus),
                name="KV pool (kv_cache_memory_bytes)",
                orientation="h",
                marker_color="#98df8a",
                width=0.3,
                hovertemplate="%{x:.2f} GiB<extra>KV pool</extra>",
            )
        )
        usage = snapshot.value("kv_cache_usage_perc") if snapshot is not None else None
        if usage is not None:
            fig.add_trace(
                go.Bar(
                    y=names,
                    x=[pool * usage] * len(gpus),
                    name="KV in use",
                    orientation="h",
                    marker_color="#2ca02c",
                    width=0.3,
                    hovertemplate="%{x:.2f} GiB<extra>KV in use</extra>",
                )
            )
    if config is not None and config.gpu_memory_utilization:
        ceiling = config.gpu_memory_utilization * max(total)
        fig.add_vline(
            x=ceiling,
            line_dash="dash",
            line_color="#d62728",
            annotation_text=f"gpu_memory_utilization {config.gpu_memory_utilization:g} × total",
        )
    fig.update_layout(barmode="overlay")
    return apply_layout(
        fig, "GPU memory", "", xaxis_title="GiB", hovermode="closest", height=180 + 50 * len(gpus),
        legend={"orientation": "h", "y": -0.45},
    )
