"""Plotly figures for the live and replay pages (pure: history in, figure out).

Each builder returns ``None`` when there is nothing honest to draw, and the page shows an empty
state instead of an empty chart. Units are the ones people use: %, ms, tok/s, GiB.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import plotly.graph_objects as go

from diagnostics.core.hardware import DevicePeak
from diagnostics.core.metrics.catalog import RATIOS, CacheConfig, EngineKey, Snapshot
from diagnostics.core.metrics.derive import Scrape, labels_total, spec_decode
from diagnostics.core.metrics.gpu import GpuMemory
from diagnostics.core.metrics.series import (
    QuantileSeries,
    Series,
    gauge_series,
    increase_events,
    label_picker,
    labelled_increase,
    rate_series,
    rolling_quantiles,
    rolling_ratio,
)
from diagnostics.core.text import fmt_latency
from diagnostics.core.whatif import HIGHER_IS_BETTER, LABELS, METRICS, Prediction, fmt_value

GIB = 1024**3
LATENCY_NAMES = {
    "time_to_first_token_seconds": "TTFT",
    "inter_token_latency_seconds": "ITL",
    "e2e_request_latency_seconds": "end-to-end",
    "request_queue_time_seconds": "queue time",
}
COLORS = {"p50": "#1f77b4", "p95": "#ff7f0e", "p99": "#d62728"}
WAITING_COLORS = {"capacity": "#ff7f0e", "deferred": "#9e9e9e"}


def _times(ts: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t) for t in ts]


def _layout(fig: go.Figure, title: str, y_title: str, **kw: Any) -> go.Figure:
    """Shared layout; any keyword overrides the default of the same name."""
    layout: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 15}},
        "yaxis_title": y_title,
        "height": 320,
        "margin": {"l": 60, "r": 20, "t": 45, "b": 30},
        "legend": {"orientation": "h", "y": -0.22},
        "hovermode": "x unified",
        "uirevision": "keep",  # keep the user's zoom across live refreshes
    }
    layout.update(kw)
    fig.update_layout(**layout)
    return fig


def _has_values(series: Series) -> bool:
    return any(v is not None for v in series.values)


def kv_usage_figure(history: Sequence[Scrape], config: CacheConfig | None) -> go.Figure | None:
    """KV-cache block usage (%), with blocks and tokens in the hover, preemptions marked."""
    usage = gauge_series(history, lambda s: s.value("kv_cache_usage_perc"))
    if not _has_values(usage):
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
            x=_times(usage.ts),
            y=pct,
            name="KV-cache usage",
            mode="lines",
            line={"color": "#2ca02c"},
            customdata=custom,
            hovertemplate=hover + "<extra></extra>",
            connectgaps=False,
        )
    )
    events = increase_events(history, lambda s: s.value("num_preemptions"))
    if events.ts:
        fig.add_trace(
            go.Scatter(
                x=_times(events.ts),
                y=[100] * len(events.ts),
                name="preemptions",
                mode="markers",
                marker={"symbol": "triangle-down", "size": 11, "color": "#d62728"},
                customdata=events.values,
                hovertemplate="%{customdata:.0f} preempted<extra></extra>",
            )
        )
    return _layout(fig, "KV-cache block usage", "% of blocks in use", yaxis_range=[0, 105])


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
            x=_times(ratio.ts),
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
                x=_times(series.ts),
                y=series.values,
                name=name,
                mode="lines",
                yaxis="y2",
                line={"color": color, "dash": "dot"},
                hovertemplate="%{y:,.0f} tok/s<extra>" + name + "</extra>",
            )
        )
    return _layout(
        fig,
        "Prefix-cache hit rate",
        "% of queried tokens hit",
        yaxis_range=[0, 105],
        yaxis2={"title": "tokens/s", "overlaying": "y", "side": "right", "rangemode": "tozero"},
    )


def queue_figure(history: Sequence[Scrape], max_num_seqs: int | None) -> go.Figure | None:
    """Running and waiting requests (waiting by reason when exposed) against the running cap."""
    running = gauge_series(history, lambda s: s.value("num_requests_running"))
    if not _has_values(running):
        return None
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=_times(running.ts), y=running.values, name="running", mode="lines", line={"color": "#1f77b4"})
    )
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
                    x=_times(series.ts), y=series.values, name=f"waiting ({reason})", mode="lines",
                    stackgroup="waiting", line={"color": color}, fillcolor=color,
                )
            )
    else:
        waiting = gauge_series(history, lambda s: s.value("num_requests_waiting"))
        fig.add_trace(
            go.Scatter(x=_times(waiting.ts), y=waiting.values, name="waiting", mode="lines", line={"color": "#ff7f0e"})
        )
    rejected = increase_events(history, labels_total("admission_rejections"))
    if rejected.ts:
        # Turned away at the queue limit (HTTP 503): marked where they happened, at the queue's height.
        fig.add_trace(
            go.Scatter(
                x=_times(rejected.ts),
                y=[_waiting_at(history, t) for t in rejected.ts],
                name="rejected (HTTP 503)",
                mode="markers",
                marker={"symbol": "x", "size": 10, "color": "#d62728"},
                customdata=rejected.values,
                hovertemplate="%{customdata:.0f} rejected by a queue limit<extra></extra>",
            )
        )
    swapped = gauge_series(history, lambda s: s.value("num_requests_swapped"))
    if _has_values(swapped):
        fig.add_trace(go.Scatter(x=_times(swapped.ts), y=swapped.values, name="swapped (V0)", mode="lines"))
    if max_num_seqs:
        fig.add_hline(
            y=max_num_seqs,
            line_dash="dash",
            line_color="#d62728",
            annotation_text=f"--max-num-seqs {max_num_seqs}",
            annotation_position="top left",
        )
    return _layout(fig, "Queue depth", "requests", yaxis_rangemode="tozero")


def _waiting_at(history: Sequence[Scrape], ts: float) -> float:
    snap = next((s.snapshot for s in history if s.ts == ts and s.snapshot is not None), None)
    return (snap.value("num_requests_waiting") or 0.0) if snap is not None else 0.0


def spec_decode_figure(history: Sequence[Scrape], window_seconds: float) -> go.Figure | None:
    """Speculative decoding: the share of draft tokens accepted, and per draft position the share of
    drafts whose token there was accepted (over a trailing window); None without speculation."""
    overall = rolling_ratio(history, lambda s: s.value("spec_decode_num_accepted_tokens"),
                            lambda s: s.value("spec_decode_num_draft_tokens"), window_seconds)
    if not _has_values(overall):
        return None
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=_times(overall.ts), y=[v * 100 if v is not None else None for v in overall.values],
                             name="all draft tokens", mode="lines", line={"width": 3, "color": "#2ca02c"},
                             hovertemplate="%{y:.0f} % of draft tokens accepted<extra></extra>"))
    positions: set[str] = set()
    for scrape in history:
        if scrape.snapshot is not None:
            positions.update(scrape.snapshot.by_label("spec_decode_num_accepted_tokens_per_pos") or {})
    for pos in sorted(positions, key=lambda p: int(p) if p.isdigit() else 0):
        series = rolling_ratio(history, label_picker("spec_decode_num_accepted_tokens_per_pos", pos),
                               lambda s: s.value("spec_decode_num_drafts"), window_seconds)
        fig.add_trace(go.Scatter(x=_times(series.ts), y=[v * 100 if v is not None else None for v in series.values],
                                 name=f"position {html.escape(pos)}", mode="lines", line={"width": 1.2, "dash": "dot"},
                                 hovertemplate=f"position {html.escape(pos)}: %{{y:.0f}} % of drafts<extra></extra>"))
    spec = spec_decode(history)
    length = spec.mean_accepted_length if spec is not None else None
    title = "Speculative decoding: draft acceptance" + (
        f" (mean accepted length {length:.2f} tokens/step)" if length is not None else "")
    return _layout(fig, title, f"% accepted ({window_seconds:g} s)", yaxis_range=[0, 105])


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
            fig.add_trace(go.Scatter(x=_times(series.ts), y=[v / full * 100 if v is not None else None for v in values],
                                     name=name, mode="lines", hovertemplate="%{y:.1f} % of peak<extra>" + name
                                     + "</extra>"))
        return _layout(fig, f"Roofline (vLLM's estimate) against the {peak.name}", "% of datasheet peak",
                       yaxis_rangemode="tozero")
    f_scale, f_unit = _si_scale([v for v in flops.values if v], "FLOP/s")
    b_scale, b_unit = _si_scale([v for v in moved if v], "B/s")
    fig.add_trace(go.Scatter(x=_times(flops.ts), y=[v / f_scale if v is not None else None for v in flops.values],
                             name=f_unit, mode="lines", line={"color": "#9467bd"}))
    fig.add_trace(go.Scatter(x=_times(read.ts), y=[v / b_scale if v is not None else None for v in moved],
                             name=f"memory {b_unit}", mode="lines", line={"color": "#17becf"}, yaxis="y2"))
    fig.update_layout(yaxis2={"title": b_unit, "overlaying": "y", "side": "right", "rangemode": "tozero"})
    return _layout(fig, "Work per GPU (vLLM's estimate)", f_unit, yaxis_rangemode="tozero")


def _si_scale(values: Sequence[float], unit: str) -> tuple[float, str]:
    """The SI prefix that puts the largest value between 1 and 1000 ("GFLOP/s" for 2e9 FLOP/s)."""
    top = max(values, default=0.0)
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= scale:
            return scale, prefix + unit
    return 1.0, unit


def latency_figure(history: Sequence[Scrape], concept: str, window_seconds: float) -> go.Figure | None:
    """p50 / p95 / p99 of one latency histogram over a trailing window, in ms."""
    quantiles = rolling_quantiles(history, concept, (0.5, 0.95, 0.99), window_seconds)
    if quantiles is None or not any(_has_values(s) for s in quantiles.values()):
        return None
    fig = go.Figure()
    for q, series in quantiles.items():
        _add_quantile_traces(fig, f"p{round(q * 100)}", series)
    name = LATENCY_NAMES.get(concept, concept)
    return _layout(fig, f"{name} ({window_seconds:g} s window)", "milliseconds", yaxis_rangemode="tozero")


def _add_quantile_traces(fig: go.Figure, label: str, series: QuantileSeries) -> None:
    """A quantile line in ms, honest about its buckets: a point whose rank falls in the first bucket
    is only "< bound" — no line there (an interpolation would invent a number), a ▼ marker at the
    bound instead; beyond the last finite bucket a ▲ at it. The hover names the bucket."""
    color = COLORS.get(label)
    xs = _times(series.ts)
    line_y: list[float | None] = []
    hover: list[str] = []
    marks: list[tuple[datetime, float, str, str]] = []
    for x, est in zip(xs, series.estimates):
        if est is None:
            line_y.append(None)
            hover.append("")
        elif est.bound is None:
            line_y.append(est.value * 1000)
            hover.append(f"{fmt_latency(est)} (bucket {est.lower * 1000:,.0f}–{est.upper * 1000:,.0f} ms)")
        else:
            line_y.append(None)
            hover.append("")
            edge = est.upper if est.bound == "below" else est.lower
            where = "all in the first bucket" if est.bound == "below" else "beyond the last bucket"
            marks.append((x, edge * 1000, "triangle-down" if est.bound == "below" else "triangle-up",
                          f"{fmt_latency(est)} ({where})"))
    fig.add_trace(go.Scatter(x=xs, y=line_y, name=label, mode="lines", line={"color": color}, customdata=hover,
                             hovertemplate="%{customdata}<extra>" + label + "</extra>"))
    if marks:
        fig.add_trace(go.Scatter(
            x=[m[0] for m in marks], y=[m[1] for m in marks], name=f"{label} (bound)", mode="markers",
            marker={"symbol": [m[2] for m in marks], "color": color, "size": 7}, customdata=[m[3] for m in marks],
            hovertemplate="%{customdata}<extra>" + label + "</extra>", legendgroup=label, showlegend=False))


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
                x=_times(series.ts),
                y=series.values,
                name=name,
                mode="lines",
                line={"color": color},
                hovertemplate="%{y:,.0f} tok/s<extra>" + name + "</extra>",
            )
        )
    return _layout(fig, "Token throughput (5 s average)", "tokens/s", yaxis_rangemode="tozero")


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
    return _layout(fig, "Finished requests by reason", "requests", xaxis_title="finished_reason")


def gpu_memory_figure(
    gpus: Sequence[GpuMemory], config: CacheConfig | None, snapshot: Snapshot | None
) -> go.Figure | None:
    """Where the GPU memory went: used vs total per device, the gpu_memory_utilization ceiling,
    the KV pool and the KV bytes in use."""
    if not gpus:
        return None
    names = [f"GPU {g.index} · {g.name}" for g in gpus]
    used = [g.memory_used_bytes / GIB for g in gpus]
    total = [g.memory_total_bytes / GIB for g in gpus]
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
    return _layout(
        fig, "GPU memory", "", xaxis_title="GiB", hovermode="closest", height=180 + 50 * len(gpus),
        legend={"orientation": "h", "y": -0.45},
    )


def finding_figure(
    history: Sequence[Scrape], chart: str | None, time_range: tuple[float, float] | None
) -> go.Figure | None:
    """The small chart beside a finding's evidence, with the symptom's time range shaded."""
    if chart is None or not history:
        return None
    if chart in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        # The median shows a batch-size symptom, p99 a head-of-line tail: draw both.
        quantiles = rolling_quantiles(history, chart, (0.5, 0.95, 0.99), window_seconds=5.0)
        if quantiles is None:
            return None
        fig = go.Figure()
        for q, qseries in quantiles.items():
            _add_quantile_traces(fig, f"p{round(q * 100)}", qseries)
        y_title = "ms (5 s window)"
    elif chart == "generation_tokens" and len(names := engine_names(history)) > 1:
        # Engines side by side: a hung rank is the line that drops to zero while the others go on.
        fig = go.Figure()
        for key, label in names.items():
            rates = rate_series(history, engine_pick("generation_tokens", key), window_seconds=1.0)
            fig.add_trace(go.Scatter(x=_times(rates.ts), y=rates.values, name=label, mode="lines"))
        y_title = "tokens/s"
    else:
        if chart == "generation_tokens":
            series = rate_series(history, lambda s: s.value("generation_tokens"), window_seconds=1.0)
            y_title, scale, name = "tokens/s", 1.0, "generation"
        elif chart in RATIOS:
            numerator, denominator = RATIOS[chart]
            series = rolling_ratio(history, lambda s: s.value(numerator), lambda s: s.value(denominator), 30.0)
            y_title, scale, name = {"spec_decode_acceptance": ("% accepted (30 s)", 100.0, "draft acceptance")}.get(
                chart, ("% hit (30 s)", 100.0, "hit rate"))
        else:
            concept = chart
            series = gauge_series(history, lambda s: s.value(concept))
            scale = 100.0 if chart.endswith("_perc") else 1.0
            y_title, name = ("%" if scale == 100.0 else "requests"), chart.removeprefix("num_requests_")
        if not _has_values(series):
            return None
        fig = go.Figure(go.Scatter(x=_times(series.ts), y=[v * scale if v is not None else None for v in series.values],
                                   name=name, mode="lines"))
    if time_range is not None:
        start, end = time_range
        if end - start < 1:
            start, end = start - 0.5, end + 0.5
        fig.add_vrect(x0=datetime.fromtimestamp(start), x1=datetime.fromtimestamp(end), fillcolor="#d62728",
                      opacity=0.12, line_width=0)
    fig.update_layout(height=220, margin={"l": 50, "r": 10, "t": 10, "b": 30}, yaxis_title=y_title,
                      showlegend=len(fig.data) > 1, legend={"orientation": "h", "y": -0.3}, uirevision="keep")
    return fig


_FLEET_SCALE = {"%": (100.0, "%"), "s": (1000.0, "ms"), "/s": (1.0, "per second"), "": (1.0, ""),
                "tok/s": (1.0, "tokens/s")}


def fleet_figure(
    title: str,
    unit: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    highlight: Collection[str] = (),
) -> go.Figure | None:
    """One line per instance (engines side by side, fleet-wide); instances named in ``highlight``
    (outliers) drawn thick, the others thin. NaN (no answer from a quantile over an idle window)
    is a gap, not zero."""
    if not any(series.values()):
        return None
    scale, y_title = _FLEET_SCALE.get(unit, (1.0, unit))
    fig = go.Figure()
    for instance in sorted(series):
        points = series[instance]
        values = [v * scale if math.isfinite(v) else None for _, v in points]
        fig.add_trace(
            go.Scatter(
                x=_times([t for t, _ in points]),
                y=values,
                name=html.escape(instance),  # a label from the server: plotly renders names as HTML
                mode="lines",
                line={"width": 3.5 if instance in highlight else 1.5},
                hovertemplate=f"%{{fullData.name}}: %{{y:.3g}} {y_title}<extra></extra>",
                connectgaps=False,
            )
        )
    extra: dict[str, Any] = {"yaxis_range": [0, 105]} if unit == "%" else {"yaxis_rangemode": "tozero"}
    return _layout(fig, title, y_title, **extra)


ENGINE_PANELS: tuple[tuple[str, str, str, str], ...] = (
    # (concept, title, unit, kind): one line per engine of a data-parallel server
    ("kv_cache_usage_perc", "KV-cache usage by engine", "%", "gauge"),
    ("generation_tokens", "Generated tokens by engine", "tok/s", "rate"),
    ("num_requests_running", "Running by engine", "requests", "gauge"),
    ("num_requests_waiting", "Waiting by engine", "requests", "gauge"),
)


def engine_pick(concept: str, engine: EngineKey) -> Callable[[Snapshot], float | None]:
    """One engine's value of a concept, as series builders pick it."""
    return lambda snap: snap.value(concept, engine)


def engine_names(history: Sequence[Scrape]) -> dict[EngineKey, str]:
    """The engines the newest good scrape labels, named as a person reads them ("engine 1")."""
    for scrape in reversed(history):
        if scrape.snapshot is not None:
            keys = scrape.snapshot.engines
            models = {model for model, _ in keys}
            return {key: f"engine {key[1] or '0'}" + (f" · {key[0]}" if len(models) > 1 else "") for key in keys}
    return {}


def engines_figure(history: Sequence[Scrape], concept: str, title: str, unit: str, kind: str,
                   highlight: Collection[str] = ()) -> go.Figure | None:
    """One line per engine for a gauge, or a counter's per-interval rate; None with a single engine."""
    names = engine_names(history)
    if len(names) < 2:
        return None
    series: dict[str, list[tuple[float, float]]] = {}
    for key, name in names.items():
        if kind == "rate":
            rates = rate_series(history, engine_pick(concept, key))
            series[name] = [(t, math.nan if v is None else v) for t, v in zip(rates.ts, rates.values)]
        else:
            pick = engine_pick(concept, key)
            series[name] = [(s.ts, v) for s in history if s.snapshot is not None and (v := pick(s.snapshot)) is not None]
    return fleet_figure(title, unit, series, highlight)


def mark_span(fig: go.Figure, start: float, end: float, label: str) -> go.Figure:
    """Shade [start, end] on a time-axis figure and name it (the probe's run over the live panels)."""
    fig.add_vrect(
        x0=datetime.fromtimestamp(start), x1=datetime.fromtimestamp(end), fillcolor="#9467bd", opacity=0.12,
        line_width=0, annotation_text=label, annotation_position="top left",
    )
    return fig


def distribution_figure(title: str, series: Mapping[str, Sequence[float]], unit: str = "ms",
                        scale: float = 1000.0) -> go.Figure | None:
    """Histograms of client-side samples (TTFT, inter-token gaps, e2e), one trace per series."""
    if not any(series.values()):
        return None
    fig = go.Figure()
    for name, values in series.items():
        if values:
            fig.add_trace(go.Histogram(x=[v * scale for v in values], name=name, opacity=0.75, nbinsx=40,
                                       hovertemplate=f"%{{x}} {unit}: %{{y}}<extra>{html.escape(name)}</extra>"))
    fig.update_layout(barmode="overlay")
    return _layout(fig, title, "count", xaxis_title=unit, hovermode="closest")


def prediction_figure(prediction: Prediction) -> go.Figure | None:
    """A suggestion's predicted effect: one bar per metric, the change from the replay under the
    current flags to the replay under the change, green where it helps and red where it costs, each
    labelled with both values in units a person reads."""
    names, changes, colors, texts = [], [], [], []
    for metric in METRICS:
        before, after = prediction.before.metrics.get(metric), prediction.after.metrics.get(metric)
        if before is None or after is None or (before == 0 and after == 0):
            continue
        change = (after - before) / before * 100 if before else 100.0
        better = (after > before) == (metric in HIGHER_IS_BETTER)
        names.append(LABELS[metric])
        changes.append(max(-100.0, min(300.0, change)))
        colors.append("#2ca02c" if better or abs(change) < 5 else "#d62728")
        texts.append(f"{fmt_value(metric, before)} → ~{fmt_value(metric, after)}")
    if not names:
        return None
    fig = go.Figure(go.Bar(
        x=changes, y=names, orientation="h", marker_color=colors, text=texts, textposition="auto",
        hovertemplate="%{y}: %{text} (%{x:+.0f} %)<extra></extra>",
    ))
    fig.add_vline(x=0, line_color="#555", line_width=1)
    fig = _layout(fig, "Predicted effect (the simulated engine replaying this window)", "",
                  xaxis_title="change from the replay under the current flags (%)", hovermode="closest",
                  height=60 + 28 * len(names), margin={"l": 120, "r": 20, "t": 45, "b": 40})
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="linear")
    return fig
