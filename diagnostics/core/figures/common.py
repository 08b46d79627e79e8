"""What every page's charts share: the time axis, the layout, the quantile lines."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import plotly.graph_objects as go

from diagnostics.core.metrics.series import QuantileSeries, Series
from diagnostics.core.text import fmt_latency

COLORS = {"p50": "#1f77b4", "p95": "#ff7f0e", "p99": "#d62728"}


def as_datetimes(ts: Sequence[float]) -> list[datetime]:
    """Unix seconds as the datetimes a time axis shows."""
    return [datetime.fromtimestamp(t) for t in ts]


def apply_layout(fig: go.Figure, title: str, y_title: str, **kw: Any) -> go.Figure:
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


def has_values(series: Series) -> bool:
    """Whether the series has any point to draw."""
    return any(v is not None for v in series.values)


def add_quantile_traces(fig: go.Figure, label: str, series: QuantileSeries) -> None:
    """A quantile line in ms, honest about its buckets: a point whose rank falls in the first bucket
    is only "< bound" — no line there (an interpolation would invent a number), a ▼ marker at the
    bound instead; beyond the last finite bucket a ▲ at it. The hover names the bucket."""
    color = COLORS.get(label)
    xs = as_datetimes(series.ts)
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
