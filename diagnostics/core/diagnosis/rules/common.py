"""What several rule families read the same way: the window's range, a gauge's peak, a metric the
server does not expose, the state just before an outage."""

from __future__ import annotations

import math
from typing import Any

from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.types import Finding
from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import Quantile


def whole(ctx: Context) -> tuple[float, float]:
    """The window's time range (first to last scrape), for a finding judged on all of it."""
    return ctx.history[0].ts, ctx.history[-1].ts


def quantile_evidence(key: str, q: Quantile) -> dict[str, Any]:
    """A quantile for a finding's evidence: the number, or the bucket edge it is bounded by."""
    value, bound = q.reported()
    return {f"{key}_seconds": value, f"{key}_bound": bound}


def absent(concept: str, rule: str, why: str) -> Finding:
    """The rule ``rule`` cannot run: this server does not expose ``concept`` (the table's ``absent``)."""
    return Finding(
        id=f"absent:{rule}",
        severity="info",
        title=f"Cannot check {rule.replace('_', ' ')}: this server does not expose {concept}",
        evidence={"missing": concept},
        checks=(why,),
    )


def exposes(ctx: Context, concept: str) -> bool:
    return any(snap.has(concept) for _, snap in ctx.ok)


def mean_from(hist: Histogram | None) -> float | None:
    if hist is None or hist.count <= 0 or math.isnan(hist.sum):
        return None
    return hist.sum / hist.count


def max_gauge(ctx: Context, concept: str) -> float:
    return max((snap.value(concept) or 0) for _, snap in ctx.ok)


def before(ctx: Context, ts: float) -> dict[str, Any]:
    """What the good scrapes in the ``before_seconds`` before ``ts`` showed, as ``before_*`` evidence
    ({} with none): the state the server was in when it went down or restarted."""
    seconds = ctx.thresholds.before_seconds
    snaps = [snap for s, snap in ctx.ok if ts - seconds <= s.ts < ts]
    if not snaps:
        return {}
    ivs = [iv for iv in ctx.intervals if ts - seconds <= iv.start and iv.end < ts and not iv.restarted]
    span = sum(iv.end - iv.start for iv in ivs)
    last = max(s.ts for s, _ in ctx.ok if s.ts < ts)

    def peak(concept: str) -> float | None:
        values = [v for snap in snaps if (v := snap.value(concept)) is not None]
        return max(values) if values else None

    return {
        "before_last_good_scrape_at": last,
        "before_max_num_requests_running": peak("num_requests_running"),
        "before_max_num_requests_waiting": peak("num_requests_waiting"),
        "before_max_kv_cache_usage_perc": peak("kv_cache_usage_perc"),
        "before_generation_tokens_per_second": round(sum(iv.generation_tokens or 0.0 for iv in ivs) / span, 1)
        if span > 0 else None,
        "before_num_preemptions": sum(iv.num_preemptions or 0.0 for iv in ivs) if ivs else None,
    }
