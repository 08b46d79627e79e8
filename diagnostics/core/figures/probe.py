"""The Probe page's charts: the clients' own samples, and the probe's run marked on the live panels."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import datetime

import plotly.graph_objects as go

from diagnostics.core.figures.common import apply_layout


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
    return apply_layout(fig, title, "count", xaxis_title=unit, hovermode="closest")
