"""The Diagnose page's chart beside each finding: the concept the finding names, its time range shaded."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import plotly.graph_objects as go

from diagnostics.core.figures.common import add_quantile_traces, as_datetimes, has_values
from diagnostics.core.figures.engines import engine_names, engine_pick
from diagnostics.core.metrics.catalog import RATIOS
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.series import gauge_series, rate_series, rolling_quantiles, rolling_ratio


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
            add_quantile_traces(fig, f"p{round(q * 100)}", qseries)
        y_title = "ms (5 s window)"
    elif chart == "generation_tokens" and len(names := engine_names(history)) > 1:
        # Engines side by side: a hung rank is the line that drops to zero while the others go on.
        fig = go.Figure()
        for key, label in names.items():
            rates = rate_series(history, engine_pick("generation_tokens", key), window_seconds=1.0)
            fig.add_trace(go.Scatter(x=as_datetimes(rates.ts), y=rates.values, name=label, mode="lines"))
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
        if not has_values(series):
            return None
        fig = go.Figure(go.Scatter(x=as_datetimes(series.ts), y=[v * scale if v is not None else None for v in series.values],
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
