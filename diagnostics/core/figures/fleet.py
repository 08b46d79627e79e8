"""The Fleet page's charts: one line per instance."""

from __future__ import annotations

import html
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from diagnostics.core.figures.common import apply_layout, as_datetimes

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
                x=as_datetimes([t for t, _ in points]),
                y=values,
                name=html.escape(instance),  # a label from the server: plotly renders names as HTML
                mode="lines",
                line={"width": 3.5 if instance in highlight else 1.5},
                hovertemplate=f"%{{fullData.name}}: %{{y:.3g}} {y_title}<extra></extra>",
                connectgaps=False,
            )
        )
    extra: dict[str, Any] = {"yaxis_range": [0, 105]} if unit == "%" else {"yaxis_rangemode": "tozero"}
    return apply_layout(fig, title, y_title, **extra)
