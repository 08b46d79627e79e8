"""A prediction in the words and units a person reads."""

from __future__ import annotations

import math

from diagnostics.core.text import fmt_seconds_as_ms
from diagnostics.core.whatif.predict import Prediction
from diagnostics.core.whatif.replay import METRICS

LABELS = {"itl_p50_seconds": "ITL p50", "itl_p95_seconds": "ITL p95", "itl_p99_seconds": "ITL p99",
          "itl_p999_seconds": "ITL p99.9",
          "ttft_p50_seconds": "TTFT p50", "ttft_p95_seconds": "TTFT p95",
          "output_tokens_per_second": "output tok/s", "preemptions_per_minute": "preemptions/min",
          "max_num_requests_waiting": "max waiting"}
HIGHER_IS_BETTER = {"output_tokens_per_second"}


def fmt_value(name: str, value: float) -> str:
    """A metric's value in the unit a person reads (ms or s for latencies)."""
    if name.endswith("_seconds"):
        return fmt_seconds_as_ms(value)
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.1f}"


def summary(prediction: Prediction, min_change: float = 0.05) -> str:
    """"ITL p99 278 → ~90 ms; TTFT p95 +10 % (the trade-off)": the metrics that move, gains first."""
    gains: list[str] = []
    costs: list[str] = []
    for name in METRICS:
        b, a = prediction.before.metrics[name], prediction.after.metrics[name]
        if b is None or a is None:
            continue
        if b == 0 and a == 0:
            continue
        change = (a - b) / b if b else math.inf
        if abs(change) < min_change:
            continue
        better = (a > b) == (name in HIGHER_IS_BETTER)
        text = f"{LABELS[name]} {fmt_value(name, b)} → ~{fmt_value(name, a)}"
        (gains if better else costs).append(text)
    if not gains and not costs:
        return "no metric moves by 5 % or more"
    return "; ".join(gains) + (("; trade-off: " if gains else "costs: ") + "; ".join(costs) if costs else "")
