"""The signatures of :mod:`~diagnostics.core.diagnosis.causes`, checked in a window: one function per
symptom, returning a :class:`~diagnostics.core.diagnosis.causes.Ruling` for each of its causes with
the number that decided it. The rules call these and follow the cause named; nothing here advises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from diagnostics.core.diagnosis.causes import Differential, Ruling, differential
from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.data_parallel import engines_of
from diagnostics.core.diagnosis.rules.common import exposes, mean_from
from diagnostics.core.metrics.catalog import EngineKey, Histogram, Snapshot
from diagnostics.core.metrics.derive import (
    Scrape,
    counter_step,
    histogram_delta,
    histogram_quantile,
    merge_histograms,
    restarted,
)

# A seat cap binds when running sits at it in at least this share of the scrapes with requests
# waiting (the scheduler fills every seat while anything waits: only a request finishing between the
# step and the scrape leaves one free).
SEAT_HELD_SHARE = 0.5
# With the cap not known, it is inferred only from a running count held this often (a seat cap binds
# at nearly every scrape: 0.86-1.0 in the tuned corpus's queues at the cap).
SEAT_INFERRED_SHARE = 0.8
# Where a version observes each step's scheduled tokens, a known budget binds when the steps average
# this share of it (vLLM 0.32 observes prompts whole in the step that finishes them: only the flag tells).
BUDGET_FULL_SHARE = 0.75
# Served prompts this far under --max-model-len, and refused requests of fewer bytes than this share of
# the limit in tokens (a token is at least one byte of the prompt's text), cannot be context refusals.
CONTEXT_NEAR_SHARE = 0.5
# The refused requests' fitted size is used only when its standard error is within this share of it.
REFUSED_BYTES_REL_ERROR = 0.25


def fmt_tokens(n: float) -> str:
    return f"{n:,.0f}"


def capacity_waiting(snap: Snapshot, unit: EngineKey | None) -> float:
    """Requests waiting for capacity on one engine (or, with ``unit`` None, the server): the
    ``capacity`` reason where vLLM splits waiting by reason (0.20+), else every waiting request."""
    by_reason = snap.by_label("num_requests_waiting_by_reason", unit) or {}
    return by_reason.get("capacity", snap.value("num_requests_waiting", unit) or 0.0)


@dataclass(frozen=True, slots=True)
class Waiting:
    """The scrapes in which requests waited (the ones a waiting rule judges), per engine unit."""

    scrapes: tuple[tuple[Scrape, Snapshot], ...]
    units: tuple[EngineKey | None, ...]
    # The waiting gauge read 0 at every scrape while the request histograms say requests waited: the
    # scrapes are then those with requests running, and waiting is taken as given at each.
    blind: bool = False

    def queued(self, snap: Snapshot, unit: EngineKey | None) -> bool:
        return self.blind or capacity_waiting(snap, unit) > 0


def waiting_units(ctx: Context) -> tuple[EngineKey | None, ...]:
    """--max-num-seqs holds per engine: with data parallelism each engine is judged at its own cap."""
    engines = engines_of(ctx.ok)
    return tuple(engines) if len(engines) > 1 else (None,)


def _running_peak(ctx: Context, unit: EngineKey | None) -> float:
    return max((snap.value("num_requests_running", unit) or 0.0) for _, snap in ctx.ok) if ctx.ok else 0.0


def seat_caps(ctx: Context, units: Sequence[EngineKey | None]) -> dict[EngineKey | None, float]:
    """Each unit's seat cap: the flag where known, else the window's highest running count (a
    candidate that :func:`seat_cap_ruling` only accepts when running held at it while requests waited)."""
    return {u: float(ctx.flags.max_num_seqs or _running_peak(ctx, u)) for u in units}


def seat_cap_ruling(ctx: Context, w: Waiting) -> Ruling:
    """``seat_cap``: running at --max-num-seqs in most scrapes with requests waiting. Known flag: below
    it at every such scrape rules it out. Unknown: the cap is inferred from a running count that holds."""
    t = ctx.thresholds
    if not w.scrapes:
        return Ruling("seat_cap", "unknown", "no scrape caught a request waiting")
    caps = seat_caps(ctx, w.units)
    n = len(w.scrapes)
    at = sum(1 for _, snap in w.scrapes
             if any(w.queued(snap, u) and (snap.value("num_requests_running", u) or 0) >= caps[u] > 0
                    for u in w.units))
    peak = max((snap.value("num_requests_running", u) or 0.0) for _, snap in w.scrapes for u in w.units)
    low = min((snap.value("num_requests_running", u) or 0.0) for _, snap in w.scrapes for u in w.units)
    most = max(capacity_waiting(snap, u) for _, snap in w.scrapes for u in w.units)
    upto = (f"up to {most:.0f} waited" if not w.blind else
            "requests waited (the request histograms say so; the waiting gauge read 0)")
    with_waiting = "with requests running" if w.blind else "with requests waiting"
    known = ctx.flags.max_num_seqs
    per = " per engine" if len(w.units) > 1 else ""
    held = at >= t.hist_cap_min_scrapes and at >= (SEAT_HELD_SHARE if known else SEAT_INFERRED_SHARE) * n
    if known:
        if held:
            return Ruling("seat_cap", "fits", f"running at the --max-num-seqs cap of {known}{per} in {at} of {n} "
                                              f"scrapes {with_waiting}")
        if peak < known:
            return Ruling("seat_cap", "ruled_out", f"running peaked at {peak:.0f} of --max-num-seqs {known}{per} "
                                                   f"while {upto}")
        return Ruling("seat_cap", "unknown", f"running reached the cap of {known} in only {at} of {n} scrapes "
                                             f"{with_waiting}")
    cap = max(caps.values())
    if held:
        return Ruling("seat_cap", "fits", f"running held at {cap:.0f}{per} in {at} of {n} scrapes with requests "
                                          "waiting (the cap inferred from that count: --max-num-seqs is not known "
                                          "here)")
    if peak <= 0:
        return Ruling("seat_cap", "ruled_out", f"nothing ran while {upto}")
    if n >= 3 and at < SEAT_HELD_SHARE * n:
        return Ruling("seat_cap", "ruled_out", f"running ranged {low:.0f}–{peak:.0f} while requests waited, below its "
                                               f"own peak in {n - at} of {n} scrapes: no seat cap held")
    return Ruling("seat_cap", "unknown", f"running was at {peak:.0f}, the window's most, in {at} of {n} scrapes with "
                                         "requests waiting: too rarely to infer a cap from it (--max-num-seqs is not "
                                         "known here)")


def _intervals_of(ctx: Context, w: Waiting) -> list[Histogram | None]:
    """The engine-step histograms of the intervals that end at a scrape with requests waiting."""
    ends = {s.ts for s, _ in w.scrapes}
    return [iv.iteration_tokens for iv in ctx.intervals if iv.end in ends and not iv.restarted]


def largest_step_bound(hist: Histogram) -> float | None:
    """The upper bound of the highest populated iteration_tokens bucket (its lower bound when +Inf)."""
    populated = [i for i, (c, prev) in enumerate(zip(hist.cumulative, (0.0, *hist.cumulative))) if c > prev]
    if not populated:
        return None
    k = populated[-1]
    return hist.bounds[k] if k < len(hist.bounds) - 1 else hist.bounds[max(0, k - 1)]


def token_budget_ruling(ctx: Context, w: Waiting) -> Ruling:
    """``token_budget``: prompts split over several engine steps by --max-num-batched-tokens while requests
    waited with seats free. vLLM admits a waiting request only ``while token_budget > 0``, so when the
    running requests' prompt chunks take the budget, the queue waits however many seats are free.

    vLLM 0.32 observes ``iteration_tokens`` only in a step that emits a token, with the prompt tokens of
    the prefills that *finished* in it (a step of prompt chunks alone is never observed, and a prompt
    split in twenty chunks is counted whole in the last): the histogram cannot show a split. The
    recorded alternatives say the same: steps observed equal the tokens generated (392 of 392, 342 of
    342), and a single stream with no split reads as one-token steps too. So only a known budget
    decides: prompts longer than it fit, prompts within it rule it out; unknown, it is not checked
    (and may be named by elimination, :func:`waiting_differential`). A version that observes each
    step's scheduled tokens shows steps at the budget: their mean at ``BUDGET_FULL_SHARE`` of a known
    budget fits."""
    prompt = mean_from(histogram_delta([s for s, _ in w.scrapes], "request_prompt_tokens"))
    budget = ctx.flags.max_num_batched_tokens
    if budget is None:
        return Ruling("token_budget", "unknown", "--max-num-batched-tokens is not known here (give the flag or the "
                                                 "server's log: vLLM 0.32's iteration_tokens counts a split prompt "
                                                 "whole, so no series shows a split)")
    if prompt is None:
        steps = merge_histograms(_intervals_of(ctx, w))
        if steps is not None and steps.count > 0:
            mean = steps.sum / steps.count
            largest = largest_step_bound(steps) or mean
            if largest <= budget and mean >= BUDGET_FULL_SHARE * budget:
                return Ruling("token_budget", "fits", f"the engine's steps averaged {fmt_tokens(mean)} tokens against "
                                                      f"the --max-num-batched-tokens budget of {fmt_tokens(budget)}")
        return Ruling("token_budget", "unknown", "no prompt lengths counted while requests waited")
    if prompt <= budget:
        return Ruling("token_budget", "ruled_out", f"prompts averaged {fmt_tokens(prompt)} tokens, within the "
                                                   f"{fmt_tokens(budget)}-token budget: none needed splitting")
    return Ruling("token_budget", "fits", f"prompts averaged {fmt_tokens(prompt)} tokens against the "
                                          f"--max-num-batched-tokens budget of {fmt_tokens(budget)}: each took about "
                                          f"{math.ceil(prompt / budget):,} steps, and vLLM admits a waiting request "
                                          "only while a step's budget lasts")


def waiting_differential(ctx: Context, w: Waiting) -> Differential:
    """Why requests waited in ``w``'s scrapes: each cause of the ``waiting`` symptom checked."""
    t = ctx.thresholds
    ends = {s.ts for s, _ in w.scrapes}
    first, last = (min(ends), max(ends)) if ends else (0.0, 0.0)
    stalled = [s for s in ctx.stalls if s.start <= last and s.end >= first]
    if stalled:
        stall = Ruling("stalled", "fits", f"no token for {stalled[0].end - stalled[0].start:.0f} s with "
                                          f"{stalled[0].num_requests_running:.0f} running")
    else:
        stall = Ruling("stalled", "ruled_out", "tokens moved through the wait")
    slept = sum(1 for iv in ctx.intervals if iv.asleep and iv.end in ends)
    asleep = (Ruling("asleep", "fits", f"the engine was asleep at {slept} of the scrapes with requests waiting")
              if slept else Ruling("asleep", "ruled_out", "the engine was awake while requests waited"))
    if not exposes(ctx, "num_requests_waiting_by_reason"):
        deferred = Ruling("deferred", "unknown", "this vLLM does not split waiting by reason")
    else:
        peak = max(((snap.by_label("num_requests_waiting_by_reason", u) or {}).get("deferred", 0.0)
                    for _, snap in w.scrapes for u in w.units), default=0.0)
        deferred = (Ruling("deferred", "fits", f"up to {peak:.0f} waited 'deferred'") if peak > 0 else
                    Ruling("deferred", "ruled_out", "every waiting request waited for capacity, none 'deferred'"))
    usage = max(((snap.value("kv_cache_usage_perc", u) or 0.0) for _, snap in w.scrapes for u in w.units),
                default=0.0)
    preempted = sum(iv.num_preemptions or 0.0 for iv in ctx.intervals if iv.end in ends)
    if usage >= t.kv_full_perc or preempted > 0:
        kv = Ruling("kv_full", "fits", f"KV usage up to {usage * 100:.0f} %"
                    + (f", {preempted:.0f} preemptions" if preempted else "") + " while requests waited")
    elif usage < t.kv_low_perc:
        kv = Ruling("kv_full", "ruled_out", f"KV usage ≤ {usage * 100:.0f} % and no preemption while requests waited")
    else:
        kv = Ruling("kv_full", "unknown", f"KV usage up to {usage * 100:.0f} %: neither full nor clearly free")
    seat, budget = seat_cap_ruling(ctx, w), token_budget_ruling(ctx, w)
    # vLLM admits a waiting request unless a seat, the token budget, KV blocks, a LoRA slot (deferred) or a
    # paused engine stops it (Scheduler.schedule): with every other one ruled out, the one left. The seats
    # only for a cap inferred (a known one is measured: running under it while requests wait is no seat
    # cap); the budget only while it is not known (a known one is compared with the prompts).
    if (seat.fit == "unknown" and w.scrapes and not ctx.flags.max_num_seqs
            and all(r.fit == "ruled_out" for r in (stall, asleep, deferred, kv, budget))):
        seat = Ruling("seat_cap", "fits", f"by elimination ({seat.because}; every other admission limit ruled "
                                          "out below)")
    elif (budget.fit == "unknown" and w.scrapes and not ctx.flags.max_num_batched_tokens and not w.blind
          and all(r.fit == "ruled_out" for r in (stall, asleep, deferred, kv, seat))):
        budget = Ruling("token_budget", "fits", "by elimination: seats free, the KV cache free, nothing deferred "
                                                "or asleep, and vLLM admits a waiting request only while a step's "
                                                "token budget lasts (--max-num-batched-tokens is not known here)")
    return differential("waiting", (stall, asleep, deferred, kv, seat, budget))


def token_budget_target(ctx: Context) -> int | None:
    """A --max-num-batched-tokens that holds a prompt of the window's p95 plus the running decodes in one
    step: a power of two, at least twice the current budget (known or inferred)."""
    prompts = histogram_delta([s for s, _ in ctx.ok], "request_prompt_tokens")
    p95 = histogram_quantile(0.95, prompts) if prompts is not None and prompts.count > 0 else None
    current = ctx.flags.max_num_batched_tokens
    if p95 is None and not current:
        return None
    need = (p95 or 0.0) + max((snap.value("num_requests_running") or 0.0 for _, snap in ctx.ok), default=0.0)
    return max(2 * (current or 0), 2 ** math.ceil(math.log2(max(need, 2.0))))


# -- TTFT ---


def waiting_in(ctx: Context, waited: bool = False) -> Waiting:
    """Every good scrape with a request waiting (for capacity), on any engine; where none did and
    ``waited`` (the request histograms say requests waited), every scrape with requests running, as
    :attr:`Waiting.blind`."""
    units = waiting_units(ctx)
    seen = tuple((s, snap) for s, snap in ctx.ok if any(capacity_waiting(snap, u) > 0 for u in units))
    if seen or not waited:
        return Waiting(seen, units)
    busy = tuple((s, snap) for s, snap in ctx.ok if any((snap.value("num_requests_running", u) or 0) > 0 for u in units))
    return Waiting(busy, units, blind=True)


def prefill_differential(ctx: Context) -> Differential:
    """Why TTFT is mostly prefill: preemption (recompute inside the prefill time), prompts split over
    several steps by the token budget, or long prompts computed whole (no budget to raise)."""
    t = ctx.thresholds
    preempted = sum(iv.num_preemptions or 0.0 for iv in ctx.intervals)
    rulings = [Ruling("preemption", "fits", f"{preempted:.0f} preemptions in the window") if preempted > 0 else
               Ruling("preemption", "ruled_out", "no preemption in the window")]
    whole = Waiting(ctx.ok, waiting_units(ctx))
    budget = token_budget_ruling(ctx, whole)
    rulings.append(Ruling("token_budget", budget.fit, budget.because.replace(" while requests waited", "")))
    prompts = histogram_delta([s for s, _ in ctx.ok], "request_prompt_tokens")
    p95 = histogram_quantile(0.95, prompts) if prompts is not None and prompts.count > 0 else None
    if p95 is None:
        rulings.append(Ruling("long_prompts", "unknown", "no prompt lengths counted"))
    elif p95 >= t.hol_long_prompt_tokens:
        rulings.append(Ruling("long_prompts", "fits", f"prompt p95 about {fmt_tokens(p95)} tokens"))
    else:
        rulings.append(Ruling("long_prompts", "ruled_out", f"prompt p95 about {fmt_tokens(p95)} tokens"))
    return differential("ttft", rulings)


# -- HTTP 4xx ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestBytes:
    """Mean bytes of a refused and of an answered generation request, fitted over the window's
    intervals (``http_request_size_bytes_sum`` against ``http_requests_total`` by status class: the
    same middleware observes both when an answer ends): bytes_i = answered · answered_i + refused ·
    refused_i, least squares. None where the counts never vary apart."""

    refused_bytes: float
    answered_bytes: float
    intervals: int


def _bytes(snap: Snapshot) -> float | None:
    by_handler = snap.by_label("http_request_bytes")
    return sum(by_handler.values()) if by_handler else None


def request_bytes(ctx: Context) -> RequestBytes | None:
    rows: list[tuple[float, float, float]] = []
    for (_, a), (_, b) in zip(ctx.ok, ctx.ok[1:]):
        ba, bb = _bytes(a), _bytes(b)
        ha, hb = a.by_label("http_requests"), b.by_label("http_requests")
        if ba is None or bb is None or ha is None or hb is None:
            continue
        restart = restarted(a, b)
        size = counter_step(ba, bb, restart)
        steps = {k: counter_step(ha.get(k, 0.0), hb.get(k, 0.0), restart) for k in ("2xx", "4xx", "5xx")}
        answered, refused = steps["2xx"] + steps["5xx"], steps["4xx"]
        if answered or refused:
            rows.append((size, answered, refused))
    saa = sum(a * a for _, a, _ in rows)
    srr = sum(r * r for _, _, r in rows)
    sar = sum(a * r for _, a, r in rows)
    det = saa * srr - sar * sar
    # The two counts must vary apart (a determinant well clear of 0), or the split is not identified.
    if len(rows) < 3 or srr <= 0 or det <= 1e-6 * saa * srr:
        return None
    sba = sum(s * a for s, a, _ in rows)
    sbr = sum(s * r for s, _, r in rows)
    answered_bytes = (sba * srr - sbr * sar) / det
    refused_bytes = (sbr * saa - sba * sar) / det
    if refused_bytes <= 0 or answered_bytes <= 0:
        return None
    # The fit must pin the refused requests' size: its standard error (the residuals' variance times
    # the inverse normal matrix's entry) within REFUSED_BYTES_REL_ERROR of it. Counts that nearly vary
    # together (refusals in every interval alike) give a determinant clear of 0 and a size far off.
    residual = sum((size - answered_bytes * a - refused_bytes * r) ** 2 for size, a, r in rows)
    variance = residual / max(1, len(rows) - 2) * saa / det
    if variance > (REFUSED_BYTES_REL_ERROR * refused_bytes) ** 2:
        return None
    return RequestBytes(refused_bytes, answered_bytes, len(rows))


def context_limit_ruling(ctx: Context) -> Ruling:
    """``context_limit``: refused prompts over --max-model-len. The engine never sees them, so the
    sizes of the requests the API server received tell: each token of a prompt is at least one byte of
    its text, so refused requests averaging fewer bytes than ``CONTEXT_NEAR_SHARE`` of the limit cannot
    be, for the most part, over it (ruled out); refused requests that, at the served prompts' bytes per
    token, reach that share of it fit. Without the sizes, served prompts near the limit or answers cut
    at it fit; neither rules it out (the refused could be another sort of prompt)."""
    m = ctx.flags.max_model_len
    o = ctx.outcomes
    prompts = histogram_delta([s for s, _ in ctx.ok], "request_prompt_tokens")
    longest = largest_step_bound(prompts) if prompts is not None and prompts.count > 0 else None
    if m is None:
        return Ruling("context_limit", "unknown", "--max-model-len is not known here")
    fit = request_bytes(ctx)
    served = mean_from(prompts)
    if fit is not None:
        at_most = fit.refused_bytes / m
        if at_most < CONTEXT_NEAR_SHARE:
            return Ruling("context_limit", "ruled_out",
                          f"the refused requests averaged {fmt_tokens(fit.refused_bytes)} bytes (http_request_size "
                          f"over {fit.intervals} intervals), too few for prompts over {fmt_tokens(m)} tokens (a token "
                          f"is at least a byte): at most {at_most * 100:.0f} % of them could be"
                          + (f"; served prompts averaged {fmt_tokens(served)} tokens" if served else ""))
        if served is not None and fit.answered_bytes > 0:
            tokens = served * fit.refused_bytes / fit.answered_bytes
            if tokens >= CONTEXT_NEAR_SHARE * m:
                return Ruling("context_limit", "fits",
                              f"the refused requests averaged {fmt_tokens(fit.refused_bytes)} bytes against "
                              f"{fmt_tokens(fit.answered_bytes)} for the served ones ({fmt_tokens(served)}-token "
                              f"prompts): about {fmt_tokens(tokens)} tokens each at the same bytes per token, "
                              f"against --max-model-len {fmt_tokens(m)}")
    cut = o.cut or 0.0
    if cut > 0:
        return Ruling("context_limit", "fits", f"{cut:.0f} answers were cut at --max-model-len {fmt_tokens(m)}")
    if longest is not None and longest >= CONTEXT_NEAR_SHARE * m:
        return Ruling("context_limit", "fits", f"served prompts reached the {fmt_tokens(longest)}-token bucket of "
                                               f"--max-model-len {fmt_tokens(m)}")
    exported = any(_bytes(snap) is not None for _, snap in ctx.ok)
    size = ("the request sizes are not exported" if not exported else
            "the request sizes do not tell the refused requests from the served" if fit is None else
            "the refused requests' size is not conclusive")
    return Ruling("context_limit", "unknown",
                  f"{size}; served prompts ≤ {fmt_tokens(longest)} tokens of {fmt_tokens(m)}" if longest else size)


def rejected_differential(ctx: Context) -> Differential:
    """Why requests were refused with 4xx: the context limit from the sizes, the rest from the log's
    access lines (the metrics group every 4xx together)."""
    rulings = [context_limit_ruling(ctx)]
    access = ctx.access
    if access is None:
        why = "no access log given (paste the server's log: its access lines tell a 404 from a 400 or a 401)"
        rulings += [Ruling(c, "unknown", why) for c in ("model_not_served", "auth", "bad_request")]
        return differential("rejected_4xx", rulings)
    codes = access.client_errors()
    seen = ", ".join(f"{n:,} × {code}" for code, n in sorted(codes.items())) or "no 4xx"
    for cause, code, what in (("model_not_served", 404, "404 Not Found"), ("auth", 401, "401 Unauthorized"),
                              ("bad_request", 400, "400 Bad Request")):
        n = codes.get(code, 0)
        total = sum(codes.values())
        if n and n * 2 >= total:
            rulings.append(Ruling(cause, "fits", f"the server's access log shows {n:,} of its {total:,} 4xx answers on "
                                                 f"/v1/ as {what}"))
        else:
            rulings.append(Ruling(cause, "ruled_out", f"the access log shows {seen} on /v1/"))
    if codes.get(400, 0) * 2 >= sum(codes.values()) > 0:
        # A 400 is also what a prompt over the limit gets: the access line alone cannot tell them apart.
        context = rulings[0]
        if context.fit == "fits":
            rulings[-1] = Ruling("bad_request", "unknown", "the 400s may be the context limit's")
    return differential("rejected_4xx", rulings)

