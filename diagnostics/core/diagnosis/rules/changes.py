"""Numbers that moved with nothing to explain them: TTFT or ITL p95 up (or ITL p99, on enough token
gaps), or tokens per second per running request down, by more than ``Thresholds.change_factor`` against the window's own early part
(or the hour before, when the window holds it), while the load stayed about the same and no other
rule found anything. Said instead of silence: a slower GPU (clocks, throttling), a co-tenant on the
device or the host, or a deploy changes these numbers and no vLLM flag does.

``unexplained_change`` runs only when every other rule came back with nothing above info (its table
row is ``only_when_quiet``): a finding that names a cause explains the change better than this one
can. ``latency_changed`` is the change whose cause is in the window and no other rule reports it: the
prefix cache that stopped serving the prompts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.core.diagnosis.causes import Differential, Ruling, differential
from diagnostics.core.diagnosis.context import Context, Interval
from diagnostics.core.diagnosis.rules.common import mean_from
from diagnostics.core.diagnosis.types import Finding
from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import Quantile, merge_histograms, quantile_estimate
from diagnostics.core.text import fmt_seconds_as_ms


@dataclass(frozen=True, slots=True)
class Parts:
    """The window's early part (the baseline) and its late part (now), as spans of intervals."""

    early: tuple[Interval, ...]
    late: tuple[Interval, ...]
    since_early: tuple[Interval, ...]  # every interval after the early part (where a change may begin)

    @property
    def early_range(self) -> tuple[float, float]:
        return self.early[0].start, self.early[-1].end

    @property
    def late_range(self) -> tuple[float, float]:
        return self.late[0].start, self.late[-1].end


@dataclass(frozen=True, slots=True)
class Change:
    """One measure that got worse by ``factor`` (≥ the threshold) from the early part to the late one."""

    measure: str  # "itl_p95", "itl_p99", "ttft_p95", "tokens_per_second_per_running_request"
    before: float
    after: float
    factor: float
    since: float  # the first late interval that showed it (the late part's start when none alone did)

    def describe(self) -> str:
        if self.measure == "tokens_per_second_per_running_request":
            return (f"tokens/s per running request fell {self.factor:.1f}× ({self.before:.1f} → "
                    f"{self.after:.1f})")
        name = {"itl_p95": "ITL p95", "itl_p99": "ITL p99", "ttft_p95": "TTFT p95"}[self.measure]
        return (f"{name} rose {self.factor:.1f}× ({fmt_seconds_as_ms(self.before)} → "
                f"{fmt_seconds_as_ms(self.after)})")


def parts(ctx: Context) -> Parts | None:
    """The late part is the window's last third (at most ``change_recent_max_seconds``); the early
    part a third of the window (at most ``change_baseline_max_seconds``, an hour), beginning no
    earlier than that hour before the late part: the window's first third, and on a long history the
    previous hour. None when either part is shorter than ``change_min_part_seconds`` or holds no
    interval."""
    t = ctx.thresholds
    ivs = [iv for iv in ctx.intervals if not iv.restarted and not iv.asleep]
    if not ivs:
        return None
    start, end = ivs[0].start, ivs[-1].end
    third = (end - start) / 3
    late_start = end - min(third, t.change_recent_max_seconds)
    early_start = max(start, late_start - t.change_baseline_max_seconds)
    early_end = min(early_start + min(third, t.change_baseline_max_seconds), late_start)
    early = tuple(iv for iv in ivs if iv.start >= early_start and iv.end <= early_end)
    late = tuple(iv for iv in ivs if iv.start >= late_start)
    if not early or not late:
        return None
    if min(early[-1].end - early[0].start, late[-1].end - late[0].start) < t.change_min_part_seconds:
        return None
    return Parts(early, late, tuple(iv for iv in ivs if iv.start >= early[-1].end))


def _before(q: Quantile) -> float | None:
    """A baseline quantile as a report may state it: the bound of a first bucket (the most it can
    be), None beyond the last bucket (unbounded, nothing to rise from)."""
    return None if q.bound == "above" else q.upper if q.bound == "below" else q.value


def _after(q: Quantile) -> float | None:
    """A recent quantile as a report may state it: the last finite bound beyond it (the least it can
    be), None in the first bucket (it may be anything below)."""
    return None if q.bound == "below" else q.lower if q.bound == "above" else q.value


def _rose(q_early: Quantile, q_late: Quantile, factor: float) -> tuple[float, float] | None:
    """``(before, after)`` when the late quantile is certainly higher (a higher bucket: its lower
    edge at or above the early one's upper edge) and, as interpolated, ``factor`` times the early one."""
    before, after = _before(q_early), _after(q_late)
    if before is None or after is None or before <= 0 or q_late.lower < q_early.upper or after < factor * before:
        return None
    return before, after


def _rise(ctx: Context, p: Parts, measure: str, q: float, pick: Callable[[Interval], Histogram | None],
          min_count: float) -> Change | None:
    """A quantile ``q`` that rose by the factor from the early part to the late one (:func:`_rose`),
    each part holding at least ``min_count`` observations."""
    t = ctx.thresholds
    early = merge_histograms([pick(iv) for iv in p.early])
    late = merge_histograms([pick(iv) for iv in p.late])
    if early is None or late is None or early.count < min_count or late.count < min_count:
        return None
    q_early, q_late = quantile_estimate(q, early), quantile_estimate(q, late)
    if q_early is None or q_late is None:
        return None
    rose = _rose(q_early, q_late, t.change_factor)
    if rose is None:
        return None
    before, after = rose
    since = next((iv.start for iv in p.since_early if (h := pick(iv)) is not None and h.count > 0
                  and (qi := quantile_estimate(q, h)) is not None and _rose(q_early, qi, t.change_factor)),
                 p.late[0].start)
    return Change(measure, before, after, after / before, since)


def _per_running(ivs: Sequence[Interval], min_intervals: int = 3) -> float | None:
    """Generated tokens per second per running request (the running gauge at each interval's end),
    over the intervals where the gauge saw requests; None with fewer than ``min_intervals`` of them."""
    seen = [iv for iv in ivs if iv.num_requests_running and iv.generation_tokens is not None]
    if not seen or len(seen) < min_intervals:
        return None
    held = sum((iv.num_requests_running or 0.0) * (iv.end - iv.start) for iv in seen)
    return sum(iv.generation_tokens or 0.0 for iv in seen) / held if held > 0 else None


def _rate_fall(ctx: Context, p: Parts) -> Change | None:
    if ctx.gauges_blind:
        return None  # a gauge that misses the work gives no per-request rate
    before, after = _per_running(p.early), _per_running(p.late)
    if before is None or after is None or after <= 0 or before < ctx.thresholds.change_factor * after:
        return None
    limit = before / ctx.thresholds.change_factor
    since = next((iv.start for iv in p.since_early if (r := _per_running([iv], 1)) is not None and r <= limit),
                 p.late[0].start)
    return Change("tokens_per_second_per_running_request", before, after, before / after, since)


def load(ivs: Sequence[Interval]) -> dict[str, float | None]:
    """What the clients asked of the server in a part: prompt tokens and first tokens (requests
    started) per second, prompt tokens per request started (longer prompts take longer to prefill
    and to attend over), and the mean running count when the gauge sees it."""
    seconds = ivs[-1].end - ivs[0].start
    prompt = [iv.prompt_tokens for iv in ivs if iv.prompt_tokens is not None]
    started = [iv.ttft.count for iv in ivs if iv.ttft is not None]
    running = [(iv.num_requests_running, iv.end - iv.start) for iv in ivs if iv.num_requests_running is not None]
    return {
        "prompt_tokens_per_second": sum(prompt) / seconds if prompt and seconds > 0 else None,
        "requests_started_per_second": sum(started) / seconds if started and seconds > 0 else None,
        "mean_prompt_tokens": sum(prompt) / sum(started) if prompt and started and sum(started) > 0 else None,
        "mean_num_requests_running": (sum(r * dt for r, dt in running) / seconds
                                      if running and seconds > 0 and any(r for r, _ in running) else None),
    }


def _load_rose(before: dict[str, float | None], after: dict[str, float | None], factor: float) -> str | None:
    """The load measure that rose by ``factor`` or more (from nothing counts), if any: more work
    explains a slower answer. The running count is an effect as well as a load (Little's law: running =
    requests per second × the time each stays), so it does not count where the engine ran under one
    request on average before (idle part of the time: more clients would have raised the request rate)
    and the requests started per second stayed within the factor: then the same clients asked the same,
    and each request simply stayed longer (:func:`_running_is_slowness`)."""
    for key, was in before.items():
        now = after.get(key)
        if now is None or was is None:
            continue
        if key == "mean_num_requests_running" and _running_is_slowness(before, after, factor):
            continue
        if (was <= 0 < now) or (was > 0 and now >= factor * was):
            return key
    return None


def _running_is_slowness(before: dict[str, float | None], after: dict[str, float | None], factor: float) -> bool:
    """More running at the same request rate, from an engine that was idle part of the time before."""
    was, rate_was, rate_now = (before.get("mean_num_requests_running"), before.get("requests_started_per_second"),
                               after.get("requests_started_per_second"))
    return (was is not None and was < 1.0 and rate_was is not None and rate_now is not None and rate_was > 0
            and rate_now < factor * rate_was)


@dataclass(frozen=True, slots=True)
class Moved:
    """What moved between the parts, at about the same load."""

    parts: Parts
    changes: tuple[Change, ...]
    before_load: dict[str, float | None]
    after_load: dict[str, float | None]

    @property
    def since(self) -> float:
        return min(c.since for c in self.changes)

    def evidence(self, ctx: Context) -> dict[str, Any]:
        p = self.parts
        out: dict[str, Any] = {"change_factor_threshold": ctx.thresholds.change_factor,
                               "before_range": list(p.early_range), "after_range": list(p.late_range),
                               "changed_since": self.since}
        for c in self.changes:
            out |= {f"{c.measure}_before": c.before, f"{c.measure}_after": c.after,
                    f"{c.measure}_factor": round(c.factor, 2)}
        out |= {f"{k}_before": _round(v) for k, v in self.before_load.items()}
        out |= {f"{k}_after": _round(v) for k, v in self.after_load.items()}
        return out

    def said(self) -> str:
        said = "; ".join(c.describe() for c in self.changes)
        return said[0].upper() + said[1:]


def moved(ctx: Context) -> Moved | None:
    """TTFT or ITL p95 up (or ITL p99), or tokens/s per running request down, by ``change_factor`` or
    more against the early part (:func:`parts`), with the load within ``change_load_factor``."""
    t = ctx.thresholds
    p = parts(ctx)
    if p is None or ctx.stalls:
        return None
    before_load, after_load = load(p.early), load(p.late)
    if _load_rose(before_load, after_load, t.change_load_factor) is not None:
        return None
    itl = _rise(ctx, p, "itl_p95", 0.95, lambda iv: iv.itl, t.change_min_itl_observations)
    # A device or host that stalls the engine now and then moves the tail first: p99, on enough gaps
    # that it rests on several of them.
    tail = None if itl else _rise(ctx, p, "itl_p99", 0.99, lambda iv: iv.itl, t.change_min_itl_tail_observations)
    changes = tuple(c for c in (
        itl, tail,
        _rise(ctx, p, "ttft_p95", 0.95, lambda iv: iv.ttft, t.change_min_requests),
        _rate_fall(ctx, p),
    ) if c is not None)
    return Moved(p, changes, before_load, after_load) if changes else None


def _hit_rate(ivs: Sequence[Interval]) -> float | None:
    queries = sum(iv.prefix_cache_queries or 0.0 for iv in ivs)
    return sum(iv.prefix_cache_hits or 0.0 for iv in ivs) / queries if queries > 0 else None


def _computed_per_request(ivs: Sequence[Interval]) -> float | None:
    """Prompt tokens computed (not served from the prefix cache) per request started."""
    started = sum(iv.ttft.count for iv in ivs if iv.ttft is not None)
    prompt = sum(iv.prompt_tokens or 0.0 for iv in ivs)
    hits = sum(iv.prefix_cache_hits or 0.0 for iv in ivs)
    return (prompt - hits) / started if started > 0 else None


def _mean_queue(ivs: Sequence[Interval]) -> float | None:
    return mean_from(merge_histograms([iv.queue_time for iv in ivs]))


# A hit rate falling to this share of the early part's (or less), with the prompt tokens computed per
# request up by this factor, is the cache that stopped serving the prompts.
HIT_RATE_FALL_SHARE = 0.5
COMPUTED_RISE_FACTOR = 1.5
QUEUE_MIN_SECONDS = 0.1


def change_differential(ctx: Context, m: Moved) -> Differential:
    """Why the numbers moved at the same load: each cause of the ``latency_change`` symptom checked."""
    t, p = ctx.thresholds, m.parts
    shown = ", ".join(f"{k.replace('_', ' ')} {_fmt(m.before_load[k])} → {_fmt(m.after_load[k])}"
                      for k in m.before_load if m.before_load[k] is not None and m.after_load.get(k) is not None)
    slower = (" (more running only because each request stayed longer: the request rate held, and the engine ran "
              "under one request on average before)"
              if _running_is_slowness(m.before_load, m.after_load, t.change_load_factor)
              and (m.after_load.get("mean_num_requests_running") or 0.0)
              >= t.change_load_factor * (m.before_load.get("mean_num_requests_running") or 0.0) else "")
    rulings = [Ruling("more_load", "ruled_out", f"the load stayed within {t.change_load_factor:g}×: {shown}{slower}")]
    hit_before, hit_after = _hit_rate(p.early), _hit_rate(p.late)
    computed_before, computed_after = _computed_per_request(p.early), _computed_per_request(p.late)
    if hit_before is None or hit_after is None or computed_before is None or computed_after is None:
        rulings.append(Ruling("prefix_cache_misses", "unknown", "no prefix-cache queries or requests counted in a part"))
    elif (hit_before > 0 and hit_after <= HIT_RATE_FALL_SHARE * hit_before
          and computed_after >= COMPUTED_RISE_FACTOR * max(computed_before, 1.0)):
        rulings.append(Ruling("prefix_cache_misses", "fits",
                              f"the prefix-cache hit rate fell from {hit_before * 100:.0f} % to {hit_after * 100:.0f} %, "
                              f"so each request's prompt needed {computed_before:,.0f} → {computed_after:,.0f} tokens "
                              "computed at the same prompt length"))
    else:
        rulings.append(Ruling("prefix_cache_misses", "ruled_out",
                              f"the prefix-cache hit rate went {hit_before * 100:.0f} % → {hit_after * 100:.0f} % "
                              f"(prompt tokens computed per request {computed_before:,.0f} → {computed_after:,.0f})"))
    pre_before = sum(iv.num_preemptions or 0.0 for iv in p.early)
    pre_after = sum(iv.num_preemptions or 0.0 for iv in p.late)
    if pre_after > 0 and pre_after >= 2 * pre_before:
        rulings.append(Ruling("preemption", "fits", f"{pre_after:.0f} preemptions in the late part, {pre_before:.0f} "
                                                    "before"))
    else:
        rulings.append(Ruling("preemption", "ruled_out", f"{pre_after:.0f} preemptions in the late part "
                                                         f"({pre_before:.0f} before)"))
    q_before, q_after = _mean_queue(p.early), _mean_queue(p.late)
    if q_after is None:
        rulings.append(Ruling("queueing", "unknown", "no queue time counted in the late part"))
    elif q_after >= QUEUE_MIN_SECONDS and q_after >= 2 * (q_before or 0.0):
        rulings.append(Ruling("queueing", "fits", f"requests queued {fmt_seconds_as_ms(q_after)} on average in the "
                                                  f"late part against {fmt_seconds_as_ms(q_before or 0.0)} before"))
    else:
        rulings.append(Ruling("queueing", "ruled_out", f"mean queue time {fmt_seconds_as_ms(q_before or 0.0)} → "
                                                       f"{fmt_seconds_as_ms(q_after)}"))
    return differential("latency_change", rulings)


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def latency_changed(ctx: Context) -> list[Finding]:
    """The numbers moved at the same load, and the cause that no other rule reports is in the window:
    the prefix cache stopped serving the prompts (its hit rate fell, the prompt tokens computed per
    request rose). Preemption and queueing have rules of their own: where one of those is the cause,
    this rule says nothing and theirs speak."""
    m = moved(ctx)
    if m is None:
        return []
    diff = change_differential(ctx, m)
    if diff.named is None or diff.named.id != "prefix_cache_misses":
        return []
    return [Finding(
        id="latency_changed",
        severity="warning",
        title=f"{m.said()} at the same load: prefix-cache misses — {diff.because()}",
        evidence={**m.evidence(ctx), **diff.evidence()},
        checks=(
            "The clients' prompts stopped sharing a prefix (a system prompt that changed per request, a template "
            "with a timestamp or a user id before the shared part): put the shared text first and keep it "
            "byte-identical. No vLLM flag brings the hits back.",
            "Prefix caching keeps full blocks only: a shared prefix shorter than one block (--block-size) is "
            "never a hit.",
            *diff.checks(),
        ),
        time_range=(m.since, m.parts.late[-1].end),
    )]


def unexplained_change(ctx: Context) -> list[Finding]:
    """TTFT or ITL p95 up (or ITL p99), or tokens/s per running request down, by ``change_factor`` or
    more against the early part (:func:`parts`) at about the same load, with no other rule to explain
    it: the causes checked are listed as ruled out, with their numbers."""
    m = moved(ctx)
    if m is None:
        return []
    diff = change_differential(ctx, m)
    return [Finding(
        id="unexplained_change",
        severity="warning",
        title=m.said() + " against the window's early part, at the same load, and no rule explains it",
        evidence={**m.evidence(ctx), **diff.evidence()},
        checks=(
            "The GPU: clocks and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK; DCGM_FI_DEV_SM_CLOCK, "
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS), temperature and power against their limits. No vLLM flag fixes "
            "a thermal or power limit.",
            "Co-tenants: other processes on the same GPU (nvidia-smi) or the same host's CPUs (top, CPU steal "
            "time); the engine process competing for cores slows every step.",
            "A deploy or a change around that time: a new image, model revision, driver or runtime, a node "
            "move — compare with the deploy log.",
            "Not a capacity problem by the numbers here: the load (prompt tokens/s, requests started/s, "
            "prompt length, running) stayed within the factor, so more --max-num-seqs or KV cache is not the "
            "answer.",
            *diff.checks(),
        ),
        time_range=(m.since, m.parts.late[-1].end),
    )]


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)

