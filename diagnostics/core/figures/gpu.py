"""The GPU health panel's charts (pure: the collector's GPU readings in, figure out): utilisation,
temperature against its slowdown threshold, power against its enforced limit, SM clock against its
maximum with the clocks-event (throttle) reasons marked, one line per device (the reasons now, per
device, as rows: :func:`diagnostics.core.text.gpu_rows`).

Readings come from NVML or a dcgm-exporter alike (:class:`~diagnostics.core.metrics.gpu.GpuReading`).
A builder returns ``None`` when no device reported its field, and the page shows an empty state.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from diagnostics.core.figures.common import apply_layout, as_datetimes
from diagnostics.core.metrics.gpu import GpuDevice, GpuReading, clock_event_names, device_order

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


@dataclass(frozen=True, slots=True)
class GpuPanel:
    """One chart: the field drawn per device, the dotted companion (another field of the same unit,
    or the limit it is judged against), its unit and the scale from our unit to the drawn one."""

    key: str
    title: str
    unit: str
    value: Callable[[GpuDevice], float | None]
    companion: Callable[[GpuDevice], float | None] | None
    companion_name: str
    scale: float = 1.0


GPU_PANELS: tuple[GpuPanel, ...] = (
    GpuPanel("utilization", "GPU utilisation (dotted: memory busy)", "%", lambda d: d.utilization_gpu_perc,
             lambda d: d.utilization_memory_perc, "memory busy", 100.0),
    GpuPanel("temperature", "GPU temperature (dotted: slowdown threshold)", "°C", lambda d: d.temperature_celsius,
             lambda d: d.temperature_slowdown_celsius, "slowdown at"),
    GpuPanel("power", "Power draw (dotted: enforced limit)", "W", lambda d: d.power_watts,
             lambda d: d.power_limit_watts, "limit"),
    GpuPanel("clocks", "SM clock (dotted: its maximum; ✕ throttled)", "MHz", lambda d: d.sm_clock_mhz,
             lambda d: d.sm_clock_max_mhz, "max"),
)
PANELS_BY_KEY = {p.key: p for p in GPU_PANELS}


def gpu_figure(history: Sequence[tuple[float, GpuReading]], panel: str) -> go.Figure | None:
    """One line per device of ``panel``'s field over the readings, its companion dotted; for the
    clocks, a ✕ at each reading whose thermal or power reasons were set (the reasons in the hover)."""
    spec = PANELS_BY_KEY[panel]
    lines: dict[tuple[str, int, str], tuple[str, list[float], list[float | None], list[float | None], list[str]]] = {}
    for ts, reading in history:
        for device in reading.devices:
            entry = lines.setdefault(device_order(device), (device.label, [], [], [], []))
            value = spec.value(device)
            other = spec.companion(device) if spec.companion else None
            entry[1].append(ts)
            entry[2].append(value * spec.scale if value is not None else None)
            entry[3].append(other * spec.scale if other is not None else None)
            entry[4].append(", ".join(clock_event_names(device.throttles)))
    if not any(v is not None for _, _, values, _, _ in lines.values() for v in values):
        return None
    fig = go.Figure()
    for i, key in enumerate(sorted(lines)):
        label, times, values, others, reasons = lines[key]
        color = PALETTE[i % len(PALETTE)]
        name = html.escape(label)  # a label from the exporter: plotly renders names as HTML
        xs = as_datetimes(times)
        fig.add_trace(go.Scatter(x=xs, y=values, name=name, mode="lines", line={"color": color},
                                 hovertemplate=f"{name}: %{{y:.4g}} {spec.unit}<extra></extra>", connectgaps=False))
        if any(o is not None for o in others):
            fig.add_trace(go.Scatter(x=xs, y=others, name=f"{name} · {spec.companion_name}", mode="lines",
                                     line={"color": color, "dash": "dot", "width": 1.2},
                                     hovertemplate=f"{spec.companion_name}: %{{y:.4g}} {spec.unit}<extra></extra>"))
        if panel == "clocks" and any(reasons):
            marks = [(x, v, r) for x, v, r in zip(xs, values, reasons) if r and v is not None]
            fig.add_trace(go.Scatter(
                x=[m[0] for m in marks], y=[m[1] for m in marks], name=f"{name} · throttled", mode="markers",
                marker={"symbol": "x", "size": 9, "color": "#d62728"}, customdata=[html.escape(m[2]) for m in marks],
                hovertemplate="throttled: %{customdata}<extra></extra>"))
    extra = {"yaxis_range": [0, 105]} if spec.unit == "%" else {"yaxis_rangemode": "tozero"}
    return apply_layout(fig, spec.title, spec.unit, height=300, **extra)
