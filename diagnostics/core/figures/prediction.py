"""The what-if's chart: a suggestion's predicted effect (this module imports the simulator)."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.core.figures.common import apply_layout
from diagnostics.core.whatif import HIGHER_IS_BETTER, LABELS, METRICS, Prediction, fmt_value


def prediction_figure(prediction: Prediction) -> go.Figure | None:
    """A suggestion's predicted effect: one bar per metric, the change from the replay under the
    current flags to the replay under the change, green where it helps and red where it costs, each
    labelled with both values in units a person reads. None when the baseline did not reproduce
    the window (there is no after-value to draw)."""
    if not prediction.reproduces:
        return None
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
        shown = prediction.ranges.get(metric)
        texts.append(f"{fmt_value(metric, before)} → {shown.text(metric) if shown else '~' + fmt_value(metric, after)}")
    if not names:
        return None
    fig = go.Figure(go.Bar(
        x=changes, y=names, orientation="h", marker_color=colors, text=texts, textposition="auto",
        hovertemplate="%{y}: %{text} (%{x:+.0f} %)<extra></extra>",
    ))
    fig.add_vline(x=0, line_color="#555", line_width=1)
    fig = apply_layout(fig, "Predicted effect (the simulated engine replaying this window)", "",
                  xaxis_title="change from the replay under the current flags (%)", hovermode="closest",
                  height=60 + 28 * len(names), margin={"l": 120, "r": 20, "t": 45, "b": 40})
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="linear")
    return fig
