"""A prediction in the words and units a person reads."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from diagnostics.core.text import fmt_seconds_as_ms
from diagnostics.core.whatif.replay import METRICS

if TYPE_CHECKING:  # the prediction is said here; only its type is needed
    from diagnostics.core.whatif.gate import Check
    from diagnostics.core.whatif.predict import Prediction

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


def _same_unit(a: str, b: str) -> str:
    """``a`` without the unit it shares with ``b`` ("64 ms", "278 ms" → "64")."""
    for unit in (" ms", " s"):
        if a.endswith(unit) and b.endswith(unit):
            return a[: -len(unit)]
    return a


def check_text(check: Check) -> str:
    """"ITL p99 64 vs 278 ms recorded": one aimed metric, the baseline replay against the recording
    (", 250–300 ms by its histogram" when the recorded value is known only to a bucket)."""
    label = LABELS.get(check.metric, check.metric)
    if check.recorded is None:
        return f"the window does not record {label}"
    if check.replayed is None:
        return f"{label}: none replayed vs {fmt_value(check.metric, check.recorded)} recorded"
    recorded = fmt_value(check.metric, check.recorded)
    said = f"{label} {_same_unit(fmt_value(check.metric, check.replayed), recorded)} vs {recorded} recorded"
    if check.recorded_bucket is not None:
        low, high = (fmt_value(check.metric, v) for v in check.recorded_bucket)
        said += f", {_same_unit(low, high)}–{high} by its histogram"
    return said


def not_reproduced(checks: Sequence[Check]) -> str:
    """"the simulator does not reproduce this window (ITL p99 64 vs 278 ms recorded)"."""
    return ("the simulator does not reproduce this window ("
            + "; ".join(check_text(c) for c in checks if not c.reproduces) + ")")


def summary(prediction: Prediction, min_change: float = 0.05) -> str:
    """"ITL p99 278 → ~90 ms (60–140); trade-off: TTFT p95 …": the metrics that move, gains first;
    or, when the baseline did not reproduce the window, that and both numbers (no after-value)."""
    if not prediction.reproduces:
        return not_reproduced(prediction.checks)
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
        shown = prediction.ranges.get(name)
        after = shown.text(name) if shown is not None else f"~{fmt_value(name, a)}"
        text = f"{LABELS[name]} {fmt_value(name, b)} → {after}"
        (gains if better else costs).append(text)
    if not gains and not costs:
        return "no metric moves by 5 % or more"
    return "; ".join(gains) + (("; trade-off: " if gains else "costs: ") + "; ".join(costs) if costs else "")


def api_server_text(prediction: Prediction) -> str | None:
    """The API server's share of TTFT the replay adds, and what the range does with it (None when
    the window showed none): "48 ms of each TTFT outside the engine (the API server), measured while
    ~3 streams ran (as replayed, at each first token); this change runs up to 24 at once, so …"."""
    share = prediction.api_server_json()
    if not share["ttft_share_seconds"]:
        return None
    at = share["streams_at_window"]
    text = (f"{fmt_seconds_as_ms(share['ttft_share_seconds'])} of each TTFT outside the engine (the API server)"
            + (f", measured while ~{at:.0f} streams ran (as replayed, at each first token)" if at is not None else ""))
    if share["grown_in_range"]:
        text += (f"; this change runs up to {share['streams_after_at_most']} at once, so the TTFT range also grows "
                 "that share with the streams in flight (the point holds it)")
    return text
