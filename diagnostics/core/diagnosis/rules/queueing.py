"""Requests that wait or are turned away: at the concurrency cap while memory has room, for a LoRA
slot or a KV transfer, or at the frontend's queue limits."""

from __future__ import annotations

import math
from dataclasses import dataclass

from diagnostics.core.diagnosis.causes import Ruling, differential
from diagnostics.core.diagnosis.context import Context, episodes
from diagnostics.core.diagnosis.data_parallel import engines_of
from diagnostics.core.diagnosis.outcomes import outcomes
from diagnostics.core.diagnosis.rules.common import absent, exposes, max_gauge, mean_from
from diagnostics.core.diagnosis.rules.memory import suggest_more_kv
from diagnostics.core.diagnosis.rules.signatures import (
    Waiting,
    capacity_waiting,
    seat_caps,
    token_budget_target,
    waiting_differential,
    waiting_units,
)
from diagnostics.core.diagnosis.types import Finding, Suggestion
from diagnostics.core.metrics.catalog import EngineKey, Snapshot
from diagnostics.core.metrics.derive import (
    count_above,
    counter_steps,
    histogram_delta,
    labelled_increase,
    labels_total,
    merge_histograms,
)
from diagnostics.core.text import fmt_duration, fmt_seconds_as_ms


def queue_at_cap(ctx: Context) -> list[Finding]:
    """Requests waiting while the KV cache has room: why is checked, not assumed
    (:func:`~.signatures.waiting_differential`). Running at its seat cap: raise --max-num-seqs
    (``queue_at_cap``); the engine's steps at the token budget with seats free: raise
    --max-num-batched-tokens (``queue_token_budget``); neither: ``requests_waiting``, cause not
    identified, no flag.

    Scrapes inside a stall, or inside a long prefill step (head-of-line blocking), are left out:
    while no token moves, or one long step holds the engine, admission is not what queues."""
    t, ok = ctx.thresholds, ctx.ok
    if not exposes(ctx, "num_requests_waiting"):
        return [absent("vllm:num_requests_waiting", "queueing", "Queueing cannot be seen.")]
    units = list(waiting_units(ctx))
    caps = seat_caps(ctx, units)
    cap = max(caps.values())
    if cap <= 0:
        return queue_from_histograms(ctx, None)
    # Scrapes where another engine had room for as long as a queue takes to count here: routing,
    # which engine_imbalance judges (room that flickers is no way around the cap).
    skews = [(skew.since, skew.until) for skew in ctx.skews_lasting(t.queue_min_seconds) if skew.kind == "waiting"]
    points = []
    for scrape, snap in ok:
        routed = any(a <= scrape.ts <= b for a, b in skews)
        stalled = any(s.start <= scrape.ts <= s.end for s in ctx.stalls) or ctx.itl.blocked(scrape.ts)
        # Waiting with the cache not full (under kv_full_perc): between "clearly free" and full the KV
        # cache is neither ruled in nor out, and the finding says so rather than nothing at all.
        points.append((scrape.ts, not routed and not stalled and any(_queued_with_room(snap, u, t.kv_full_perc)
                                                                     for u in units)))
    found = [e for e in episodes(points, t.queue_merge_seconds) if e[1] - e[0] >= t.queue_min_seconds]
    if not found:
        return queue_from_histograms(ctx, cap)
    in_ep = tuple((s, snap) for s, snap in ok if any(a <= s.ts <= b for a, b in found)
                  and any(_queued_with_room(snap, u, t.kv_full_perc) for u in units))
    diff = waiting_differential(ctx, Waiting(in_ep, tuple(units)))
    named = diff.named.id if diff.named else None
    if named in ("stalled", "asleep", "deferred", "kv_full"):
        return []  # the stall, sleep, deferral and KV-pressure rules say these, with their own advice
    if named in ("seat_cap", "token_budget") and diff.ruling("kv_full").fit == "unknown":
        # The cache neither full nor clearly free: more seats or a larger budget may just fill it, so the
        # queue is said with no flag, the limit that held kept on the card as not decided.
        kv = diff.ruling("kv_full").because
        diff = differential("waiting", tuple(
            Ruling(r.cause, "unknown", f"{r.because}, but with {kv} the KV cache may hold admission too")
            if r.fit == "fits" else r for r in diff.rulings))
        named = None
    peak_waiting = max((snap.value("num_requests_waiting", u) or 0) for _, snap in in_ep for u in units)
    max_usage = max((snap.value("kv_cache_usage_perc") or 0) for _, snap in in_ep)
    seconds = sum(b - a for a, b in found)
    where = f" per engine ({len(units)} engines)" if len(units) > 1 else ""
    one = " on one engine" if len(units) > 1 else ""
    evidence = {"evidence_basis": "gauges", "num_engines": len(units), "num_requests_running_cap": cap,
                "cap_known_from_flags": ctx.flags.max_num_seqs is not None,
                "max_num_requests_waiting": peak_waiting, "max_kv_cache_usage_perc": max_usage,
                "seconds_queued": round(seconds, 3), **diff.evidence()}
    span = (found[0][0], found[-1][1])
    if named == "seat_cap":
        target = int(cap + peak_waiting)
        return [Finding(
            id="queue_at_cap",
            severity="warning",
            title=f"Queueing at the concurrency cap: {cap:.0f} running{where}, up to {peak_waiting:.0f} "
            f"waiting{one}, KV usage ≤ {max_usage * 100:.0f} %",
            evidence={**evidence, "seconds_queued_at_cap": round(seconds, 3)},
            suggestions=(
                Suggestion("--max-num-seqs", "increase", target,
                           f"{diff.sentence()}, up to {peak_waiting:.0f} waiting{one} for "
                           f"{fmt_duration(seconds)} while the KV cache stayed ≤ {max_usage * 100:.0f} % full: the "
                           "cap, not memory, is what queues."),
            ),
            checks=(
                "Confirm KV usage stays below ~90 % after raising the cap; if it fills, this turns into preemption.",
                "A larger batch raises ITL: keep the new cap within your ITL budget (the defended batch size).",
                *diff.checks(),
            ),
            time_range=span,
        )]
    if named == "token_budget":
        value = token_budget_target(ctx)
        budget = ctx.flags.max_num_batched_tokens
        return [Finding(
            id="queue_token_budget",
            severity="warning",
            title=f"Queueing at the token budget: up to {peak_waiting:.0f} waiting{one} with seats free, prompts "
            f"prefilled in chunks of --max-num-batched-tokens {budget:,}" if budget else
            f"Queueing at the token budget: up to {peak_waiting:.0f} waiting{one} with seats free and every other "
            "admission limit ruled out (--max-num-batched-tokens not known)",
            evidence={**evidence, "max_num_batched_tokens": budget},
            suggestions=(
                Suggestion("--max-num-batched-tokens", "increase", value,
                           (f"{diff.sentence()}: the budget is the one admission limit left" if not budget else
                            f"{diff.sentence()}: long prompts take the budget in chunks and the rest wait with "
                            "seats free")
                           + (f"; {value:,} tokens holds a whole prompt of the window's p95 and the running "
                              "decodes in one step" if value else "") + "."),
            ),
            checks=(
                "A larger budget makes each prefill step longer: check ITL (head-of-line blocking) after the change.",
                "Not the batch size: raising --max-num-seqs adds seats nobody reaches.",
                *diff.checks(),
            ),
            time_range=span,
        )]
    return [Finding(
        id="requests_waiting",
        severity="warning",
        title=f"Requests waiting: cause not identified — up to {peak_waiting:.0f} waiting{one} for "
        f"{fmt_duration(seconds)}, KV usage ≤ {max_usage * 100:.0f} %",
        evidence=evidence,
        checks=("No flag is suggested: no admission limit is confirmed by the numbers below (each is listed, ruled "
                "out or not decided). Read the server log for what the scheduler waited on, or give the flags "
                "the server runs with (--max-num-seqs, --max-num-batched-tokens).", *diff.checks()),
        time_range=span,
    )]


def _queued_with_room(snap: Snapshot, unit: EngineKey | None, kv_low: float) -> bool:
    """Requests waiting for capacity while the KV cache has room, on one engine (or the whole server)."""
    usage = snap.value("kv_cache_usage_perc", unit)
    return capacity_waiting(snap, unit) > 0 and (usage is None or usage < kv_low)


def _queued_at_cap(snap: Snapshot, unit: EngineKey | None, cap: float, kv_low: float) -> bool:
    """Requests waiting for capacity while running sits at ``cap`` and the KV cache has room, on one
    engine (or, with ``unit`` None, the whole server)."""
    usage = snap.value("kv_cache_usage_perc", unit)
    running = snap.value("num_requests_running", unit) or 0
    return capacity_waiting(snap, unit) > 0 and cap > 0 and running >= cap and (usage is None or usage < kv_low)


@dataclass(frozen=True, slots=True)
class Occupancy:
    """How many requests each engine held, on average, from finished-request counts and the
    per-request histograms (Little's law: requests in a stage = completions per second × mean time
    in it), for when the running and waiting gauges cannot be read."""

    requests_per_second: float  # finished requests per second while requests finished
    mean_queue_seconds: float
    mean_running_seconds: float | None  # prefill + decode (request_inference_time_seconds)
    num_engines: int

    @property
    def waiting_per_engine(self) -> float:
        return self.requests_per_second * self.mean_queue_seconds / self.num_engines

    @property
    def running_per_engine(self) -> float | None:
        if self.mean_running_seconds is None:
            return None
        return self.requests_per_second * self.mean_running_seconds / self.num_engines


def occupancy(ctx: Context) -> Occupancy | None:
    """The window's mean occupancy per engine (None without finished requests or a queue-time histogram)."""
    ivs = [iv for iv in ctx.intervals if iv.requests_finished and not iv.restarted]
    queue = mean_from(histogram_delta(ctx.history, "request_queue_time_seconds"))
    if not ivs or queue is None:
        return None
    seconds = ivs[-1].end - ivs[0].start
    if seconds <= 0:
        return None
    running = mean_from(histogram_delta(ctx.history, "request_inference_time_seconds"))
    return Occupancy(sum(iv.requests_finished or 0.0 for iv in ivs) / seconds, queue, running,
                     max(1, len(engines_of(ctx.ok))))


def queue_from_histograms(ctx: Context, cap: float | None) -> list[Finding]:
    """The queue at the cap judged from the requests themselves when the running gauge missed the
    work (``ctx.gauges_blind``): requests that certainly queued ``hist_queue_min_seconds`` or more
    (counted above a bucket bound of request_queue_time_seconds, never interpolated), a share of the
    window's requests and over ``queue_min_seconds``; queueing, not prefill, is what they waited
    for; and no other cause explains a wait — no preemption (the KV cache), no full cache, no stall,
    hung rank, long prefill step, sleep in the window, deferral or admission limit. The batch size
    to suggest comes from :func:`occupancy` when the flag is not known."""
    t = ctx.thresholds
    # Requests held by a sleeping engine, a stall or a hung rank finish later with long queue times too.
    if not ctx.gauges_blind or ctx.stalls or ctx.silent_ranks or ctx.itl.head_of_line or any(
            iv.asleep for iv in ctx.intervals):
        return []
    ivs = [iv for iv in ctx.intervals if iv.queue_time is not None and not iv.restarted]
    window = merge_histograms([iv.queue_time for iv in ivs])
    if window is None or window.count <= 0:
        return []
    long = count_above(window, t.hist_queue_min_seconds)
    if long < t.hist_queue_min_requests or long < t.hist_queue_share * window.count:
        return []
    queued = [iv for iv in ivs if count_above(iv.queue_time, t.hist_queue_min_seconds) > 0]
    start, end = queued[0].start, queued[-1].end
    if end - start < t.queue_min_seconds:
        return []
    scrapes = [s for s, _ in ctx.ok]
    usage = max_gauge(ctx, "kv_cache_usage_perc")
    preempted = sum(iv.num_preemptions or 0.0 for iv in ctx.intervals)
    rejected = sum((labelled_increase(scrapes, "admission_rejections") or {}).values())
    deferred = max(((snap.by_label("num_requests_waiting_by_reason") or {}).get("deferred", 0.0)
                    for _, snap in ctx.ok), default=0.0)
    prefill = mean_from(histogram_delta(ctx.history, "request_prefill_time_seconds"))
    mean_queue = window.sum / window.count
    if preempted > 0 or usage >= t.kv_low_perc or rejected > 0 or deferred > 0 or (
            prefill is not None and mean_queue < prefill):
        return []
    occ = occupancy(ctx)
    engines = occ.num_engines if occ is not None else 1
    running = occ.running_per_engine if occ is not None else None
    waiting = occ.waiting_per_engine if occ is not None else None
    # The cap from the gauge itself where it was read often enough: scrapes (one engine) that caught
    # requests waiting for capacity while running sat at the window's highest count. A gauge that
    # reads 0 between steps still shows the queue now and then (a busy 2-core host: 65 of 93
    # intervals read 0, yet 12 scrapes showed 3 waiting at 4 running).
    at_cap = ([snap for _, snap in ctx.ok if _queued_at_cap(snap, None, cap, t.kv_low_perc)]
              if cap and engines == 1 else [])
    cap_from_gauge = cap if len(at_cap) >= t.hist_cap_min_scrapes else None
    peak_waiting = max((snap.value("num_requests_waiting") or 0.0 for snap in at_cap), default=0.0)
    cap_flag = ctx.flags.max_num_seqs or (int(cap_from_gauge) if cap_from_gauge else None)
    # A value only from a known cap (the flag, or the gauge at it): the occupancy is a mean over the
    # window, not the cap (under it while the batch is not full, over it where requests finished in
    # the window began before it: 2.8 per engine against a cap of 4 in queue_cap_dp2_mid, 7.3 against
    # 6 in queue_cap_closed_loop).
    target = (cap_flag + max(1, math.ceil(waiting or 0.0), math.ceil(peak_waiting))
              if cap_flag and (waiting is not None or peak_waiting) else None)
    blind = sum(1 for iv in ctx.intervals if (iv.generation_tokens or 0) > 0 and not iv.num_requests_running)
    flowing = sum(1 for iv in ctx.intervals if (iv.generation_tokens or 0) > 0)
    share = long / window.count
    where = " per engine" if engines > 1 else ""
    occupied = (f"; on average {running:.1f} ran and {waiting:.1f} waited{where}"
                + (f" over {engines} engines" if engines > 1 else "") + " (from finished requests: Little's law)"
                if running is not None and waiting is not None else "")
    why = (f"{long:.0f} of {window.count:.0f} requests ({share * 100:.0f} %) queued ≥ "
           f"{fmt_seconds_as_ms(t.hist_queue_min_seconds)} (mean {fmt_seconds_as_ms(mean_queue)}"
           + (f" against {fmt_seconds_as_ms(prefill)} of prefill" if prefill is not None else "")
           + f") with no preemption and the KV cache ≤ {usage * 100:.0f} % full: the cap, not memory, is what "
           f"queues{occupied}."
           + (f" The gauge caught {len(at_cap)} scrapes with up to {peak_waiting:.0f} waiting while {cap_flag} ran, "
              "the window's most: that is the cap." if cap_flag and not ctx.flags.max_num_seqs else "")
           + ("" if cap_flag else " The cap is not known here (pass --max-num-seqs, or the server's log): raise it "
              f"by about the waiting count{where} or more."))
    return [Finding(
        id="queue_at_cap",
        severity="warning",
        title=f"Queueing at the concurrency cap, seen in the request histograms: {share * 100:.0f} % of requests "
        f"queued ≥ {fmt_seconds_as_ms(t.hist_queue_min_seconds)}, while the running gauge read 0 in {blind} of "
        f"{flowing} intervals with tokens",
        evidence={"evidence_basis": "histograms",
                  "requests_queued_over_min": long, "requests_finished_in_window": window.count,
                  "queued_over_min_seconds": t.hist_queue_min_seconds, "mean_queue_seconds": mean_queue,
                  "mean_prefill_seconds": prefill, "max_kv_cache_usage_perc": usage,
                  "intervals_gauge_read_zero": blind, "intervals_with_tokens": flowing,
                  "num_engines": engines, "num_requests_running_cap": cap_flag,
                  "cap_known_from_flags": ctx.flags.max_num_seqs is not None,
                  "scrapes_queued_at_gauge_cap": len(at_cap), "max_num_requests_waiting_at_gauge_cap": peak_waiting,
                  "estimated_running_per_engine": round(running, 2) if running is not None else None,
                  "estimated_waiting_per_engine": round(waiting, 2) if waiting is not None else None,
                  "finished_requests_per_second": round(occ.requests_per_second, 3) if occ is not None else None,
                  "gauge_cap_seen": cap},
        suggestions=(Suggestion("--max-num-seqs", "increase", target, why),),
        checks=(
            "The running/waiting gauges missed this queue (under data parallelism vLLM's per-engine gauges can "
            "read 0 between steps): read the queue-time histogram (request_queue_time_seconds) or the clients' "
            "TTFT to confirm.",
            "Confirm KV usage stays below ~90 % after raising the cap; if it fills, this turns into preemption.",
            "A larger batch raises ITL: keep the new cap within your ITL budget (the defended batch size).",
        ),
        time_range=(start, end),
    )]


def waiting_deferred(ctx: Context) -> list[Finding]:
    """Requests waiting for a LoRA slot or a KV transfer (``reason="deferred"``, vLLM 0.20+), not for
    capacity: raise ``--max-loras`` when the server's LoRA info shows adapters waiting; never the batch."""
    t = ctx.thresholds
    points: list[tuple[float, bool]] = []
    waiting_adapters: set[str] = set()
    seen_adapters: set[str] = set()
    max_lora: int | None = None
    for scrape, snap in ctx.ok:
        by_reason = snap.by_label("num_requests_waiting_by_reason")
        if by_reason is None:
            continue
        deferred = by_reason.get("deferred", 0.0) > 0
        points.append((scrape.ts, deferred))
        if deferred and snap.lora is not None:
            max_lora = snap.lora.max_lora if snap.lora.max_lora is not None else max_lora
            waiting_adapters.update(snap.lora.waiting)
            seen_adapters.update(snap.lora.waiting + snap.lora.running)
    # Deferral comes and goes as adapters take turns in the slots: on a real server under --max-loras 1
    # the gauge read "deferred" for 0.5–1.3 s at a time, 2–3 s apart, 9 s of a 39 s window. The window's
    # episodes count together, so a flickering deferral is named as a steady one would be.
    found = episodes(points, t.queue_merge_seconds)
    seconds = sum(b - a for a, b in found)
    if seconds < t.queue_min_seconds:
        return []
    in_ep = [snap for s, snap in ctx.ok if any(a <= s.ts <= b for a, b in found)]
    peak = max((snap.by_label("num_requests_waiting_by_reason") or {}).get("deferred", 0.0) for snap in in_ep)
    capacity = max((snap.by_label("num_requests_waiting_by_reason") or {}).get("capacity", 0.0) for snap in in_ep)
    lora = max_lora is not None
    suggestions: tuple[Suggestion, ...] = ()
    if lora and max_lora is not None:
        value = max(max_lora + 1, len(seen_adapters))
        suggestions = (Suggestion(
            "--max-loras", "increase", value,
            f"Requests named {len(seen_adapters)} adapters while only {max_lora} fit in a batch: vLLM defers the rest "
            "(waiting reason 'deferred') however much room the KV cache and --max-num-seqs have."),)
    why = "for a LoRA slot" if lora else "for a KV transfer or another transient constraint (not capacity)"
    return [Finding(
        id="waiting_deferred",
        severity="warning",
        title=f"Requests wait {why}: up to {peak:.0f} deferred for {fmt_duration(seconds)}"
        + (f" ({capacity:.0f} waiting for capacity)" if capacity else ""),
        evidence={"max_num_requests_waiting_deferred": peak, "max_num_requests_waiting_capacity": capacity,
                  "seconds_deferred": round(seconds, 3), "max_lora": max_lora,
                  "adapters_waiting": sorted(waiting_adapters)[:10]},
        suggestions=suggestions,
        checks=(
            ("Each LoRA slot holds an adapter's weights on the device (up to --max-lora-rank): check memory after "
             "raising --max-loras; --max-cpu-loras keeps more adapters cached on the host."
             if lora else
             "No LoRA budget is exported: with disaggregated serving, requests wait for KV blocks from the prefill "
             "instance; check the KV connector's logs and the prefill side."),
            "Not a capacity problem: raising --max-num-seqs does not admit a deferred request.",
        ),
        time_range=(found[0][0], found[-1][1]),
    )]


def _drained(ctx: Context, end: float) -> float:
    """When the queue behind a rejected burst (last counted at ``end``) had drained: the first good
    scrape after it with nothing running or waiting, at least ``admission_drain_seconds`` and at most
    ``admission_settle_seconds`` after it."""
    t = ctx.thresholds
    idle = next((s.ts for s, snap in ctx.ok if s.ts > end and not snap.value("num_requests_running")
                 and not snap.value("num_requests_waiting")), None)
    settled = end + t.admission_settle_seconds if idle is None else min(idle, end + t.admission_settle_seconds)
    return max(end + t.admission_drain_seconds, settled)


def admission_rejected(ctx: Context) -> list[Finding]:
    """Requests the frontend turned away (HTTP 503) at ``--max-num-queued-reqs`` /
    ``--max-num-queued-tokens`` (vLLM 0.32+): say which limit, and whether the batch cap, the KV
    cache or the limit itself is the change that would serve them."""
    t, flags = ctx.thresholds, ctx.flags
    scrapes = [s for s, _ in ctx.ok]
    by_reason = labelled_increase(scrapes, "admission_rejections") or {}
    total = sum(by_reason.values())
    if total <= 0:
        return []
    rising = [(a, b) for a, b, inc in counter_steps(scrapes, labels_total("admission_rejections")) if inc > 0]
    start, end = rising[0][0], rising[-1][1]
    drained = _drained(ctx, end)
    around = [(s, snap) for s, snap in ctx.ok if start - t.admission_lead_seconds <= s.ts <= drained]
    near = [snap for _, snap in around]
    cap = flags.max_num_seqs or max_gauge(ctx, "num_requests_running")
    usage = max((snap.value("kv_cache_usage_perc") or 0.0) for snap in near)
    # vLLM 0.32's gauges can read 0 through a burst that lasts a second on a busy host: the requests
    # that finished around it say the same thing when they queued for a good part of a decode.
    queued = mean_from(histogram_delta([s for s, _ in around], "request_queue_time_seconds"))
    decode = mean_from(histogram_delta([s for s, _ in around], "request_decode_time_seconds"))
    queued_behind = (queued is not None and decode is not None and decode > 0
                     and queued >= t.admission_queued_share * decode)
    gauge_at_cap = any((snap.value("num_requests_running") or 0) >= cap > 0 for snap in near)
    at_cap = gauge_at_cap or queued_behind
    peak_waiting = max((snap.value("num_requests_waiting") or 0.0) for snap in near)
    reasons = sorted((r for r, n in by_reason.items() if n > 0), key=lambda r: -by_reason[r])
    limits = " and ".join(f"--{r.replace('_', '-')}" for r in reasons)
    if usage >= t.kv_full_perc:
        suggestions = suggest_more_kv(flags, t, None)
        fix = "the KV cache is full, so the queue cannot drain: more KV capacity serves these requests"
    elif at_cap:
        held = (f"Running sat at the cap of {cap:.0f}" if gauge_at_cap or queued is None or decode is None else
                f"Requests queued {fmt_seconds_as_ms(queued)} on average (against {fmt_seconds_as_ms(decode)} "
                "of decode) for a running one to finish")
        # A batch as large as what ran plus what waited; where the gauges missed the queue, one larger by
        # the share of a decode the requests queued (half a decode queued: half again as many running).
        target = cap + peak_waiting
        if queued_behind and queued is not None and decode:
            target = max(target, math.ceil(cap * (1 + queued / decode)))
        # No waiting counted at any scrape and no queue time to scale by: how many more seats is unknown
        # (cap + 0 would be the current cap, a change that changes nothing), so no value.
        suggestions = [Suggestion("--max-num-seqs", "increase", int(target) if cap and target > cap else None,
                                  f"{held} with the KV cache ≤ {usage * 100:.0f} % full: "
                                  "a larger batch drains the queue the limit protects.")]
        fix = "running sat at the --max-num-seqs cap with memory to spare: a larger batch serves these requests"
    else:
        suggestions = [Suggestion(f"--{reasons[0].replace('_', '-')}", "increase", None,
                                  "Neither the batch cap nor the KV cache was full: the limit itself turned bursts "
                                  "away. Raise it if clients would rather wait than get a 503.")]
        fix = "neither the batch nor the KV cache was full: the limit itself is what turned them away"
    o = outcomes(ctx)
    errors = o.finished.get("error", 0.0)
    beside = max(0.0, o.failed - errors)
    shed = differential("failed", (
        Ruling("admission_limit", "fits", f"{total:,.0f} rejections counted by {limits} "
                                          "(vllm:request_admission_rejections)"),
        Ruling("engine_error", "fits" if errors else "ruled_out", f"{errors:,.0f} requests finished 'error'"),
        Ruling("server_error", "fits" if beside else "ruled_out",
               f"{beside:,.0f} answered 5xx beside the limits' 503s"),
    ))
    return [Finding(
        id="admission_rejected",
        severity="warning",
        title=f"{total:,.0f} request{'' if total == 1 else 's'} turned away (HTTP 503) by {limits}; {fix}",
        evidence={"admission_rejections": {r: by_reason[r] for r in reasons},
                  "admission_rejections_total": total, "num_requests_running_cap": cap, "running_at_cap": at_cap,
                  "max_kv_cache_usage_perc": usage, "max_num_requests_waiting": peak_waiting,
                  "mean_queue_seconds": queued, "mean_decode_seconds": decode, **shed.evidence()},
        suggestions=tuple(suggestions),
        checks=(
            "The queue limit sheds load by design: raise it only if clients would rather wait than retry a 503.",
            "Clients that retry at once turn one burst into several: check their back-off.",
            *shed.checks(),
        ),
        time_range=(start, end),
    )]
