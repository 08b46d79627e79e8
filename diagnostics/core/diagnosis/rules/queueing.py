"""Requests that wait or are turned away: at the concurrency cap while memory has room, for a LoRA
slot or a KV transfer, or at the frontend's queue limits."""

from __future__ import annotations

from diagnostics.core.diagnosis.context import Context, episodes
from diagnostics.core.diagnosis.rules.common import absent, exposes, max_gauge, mean_from
from diagnostics.core.diagnosis.rules.memory import suggest_more_kv
from diagnostics.core.diagnosis.types import Finding, Suggestion
from diagnostics.core.metrics.derive import counter_steps, histogram_delta, labelled_increase, labels_total
from diagnostics.core.text import fmt_duration, fmt_seconds_as_ms


def queue_at_cap(ctx: Context) -> list[Finding]:
    """Waiting requests while running sits at its cap and the KV cache has room: raise --max-num-seqs.

    Scrapes inside a stall, or inside a long prefill step (head-of-line blocking), are left out:
    while no token moves, or one long step holds the engine, the cap is not what queues."""
    t, ok = ctx.thresholds, ctx.ok
    if not exposes(ctx, "num_requests_waiting"):
        return [absent("vllm:num_requests_waiting", "queueing", "Queueing cannot be seen.")]
    cap = ctx.flags.max_num_seqs or max_gauge(ctx, "num_requests_running")
    if cap <= 0:
        return []
    points = []
    # Scrapes where another engine had room for as long as a queue takes to count here: routing,
    # which engine_imbalance judges (room that flickers is no way around the cap).
    skews = [(skew.since, skew.until) for skew in ctx.skews_lasting(t.queue_min_seconds) if skew.kind == "waiting"]
    for scrape, snap in ok:
        if any(a <= scrape.ts <= b for a, b in skews):
            points.append((scrape.ts, False))  # another engine had room: routing (engine_imbalance), not the cap
            continue
        by_reason = snap.by_label("num_requests_waiting_by_reason") or {}
        waiting = by_reason.get("capacity", snap.value("num_requests_waiting") or 0)
        usage = snap.value("kv_cache_usage_perc")
        at_cap = (snap.value("num_requests_running") or 0) >= cap
        stalled = any(s.start <= scrape.ts <= s.end for s in ctx.stalls) or ctx.itl.blocked(scrape.ts)
        points.append((scrape.ts, waiting > 0 and at_cap and not stalled and (usage is None or usage < t.kv_low_perc)))
    found = [e for e in episodes(points, t.queue_merge_seconds) if e[1] - e[0] >= t.queue_min_seconds]
    if not found:
        return []
    in_ep = [(s, snap) for s, snap in ok if any(a <= s.ts <= b for a, b in found)]
    peak_waiting = max(snap.value("num_requests_waiting") or 0 for _, snap in in_ep)
    max_usage = max((snap.value("kv_cache_usage_perc") or 0) for _, snap in in_ep)
    seconds = sum(b - a for a, b in found)
    target = int(cap + peak_waiting)
    return [
        Finding(
            id="queue_at_cap",
            severity="warning",
            title=f"Queueing at the concurrency cap: {cap:.0f} running, up to {peak_waiting:.0f} waiting, "
            f"KV usage ≤ {max_usage * 100:.0f} %",
            evidence={"num_requests_running_cap": cap, "cap_known_from_flags": ctx.flags.max_num_seqs is not None,
                      "max_num_requests_waiting": peak_waiting, "max_kv_cache_usage_perc": max_usage,
                      "seconds_queued_at_cap": round(seconds, 3)},
            suggestions=(
                Suggestion("--max-num-seqs", "increase", target,
                           f"Running sat at {cap:.0f} for {fmt_duration(seconds)} with up to {peak_waiting:.0f} "
                           f"waiting while the KV cache stayed ≤ {max_usage * 100:.0f} % full: the cap, not memory, "
                           "is what queues."),
            ),
            checks=(
                "Confirm KV usage stays below ~90 % after raising the cap; if it fills, this turns into preemption.",
                "A larger batch raises ITL: keep the new cap within your ITL budget (the defended batch size).",
                "If waiting is 'deferred' rather than 'capacity', the cause is LoRA or KV-transfer limits instead.",
            ),
            time_range=(found[0][0], found[-1][1]),
        )
    ]


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
    found = [e for e in episodes(points, t.queue_merge_seconds) if e[1] - e[0] >= t.queue_min_seconds]
    if not found:
        return []
    in_ep = [snap for s, snap in ctx.ok if any(a <= s.ts <= b for a, b in found)]
    peak = max((snap.by_label("num_requests_waiting_by_reason") or {}).get("deferred", 0.0) for snap in in_ep)
    capacity = max((snap.by_label("num_requests_waiting_by_reason") or {}).get("capacity", 0.0) for snap in in_ep)
    seconds = sum(b - a for a, b in found)
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
    around = [(s, snap) for s, snap in ctx.ok
              if start - t.admission_lead_seconds <= s.ts <= end + t.admission_drain_seconds]
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
        suggestions = [Suggestion("--max-num-seqs", "increase", int(cap + peak_waiting) if cap else None,
                                  f"{held} with the KV cache ≤ {usage * 100:.0f} % full: "
                                  "a larger batch drains the queue the limit protects.")]
        fix = "running sat at the --max-num-seqs cap with memory to spare: a larger batch serves these requests"
    else:
        suggestions = [Suggestion(f"--{reasons[0].replace('_', '-')}", "increase", None,
                                  "Neither the batch cap nor the KV cache was full: the limit itself turned bursts "
                                  "away. Raise it if clients would rather wait than get a 503.")]
        fix = "neither the batch nor the KV cache was full: the limit itself is what turned them away"
    return [Finding(
        id="admission_rejected",
        severity="warning",
        title=f"{total:,.0f} requests turned away (HTTP 503) by {limits}; {fix}",
        evidence={"admission_rejections": {r: by_reason[r] for r in reasons},
                  "admission_rejections_total": total, "num_requests_running_cap": cap, "running_at_cap": at_cap,
                  "max_kv_cache_usage_perc": usage, "max_num_requests_waiting": peak_waiting,
                  "mean_queue_seconds": queued, "mean_decode_seconds": decode},
        suggestions=tuple(suggestions),
        checks=(
            "The queue limit sheds load by design: raise it only if clients would rather wait than retry a 503.",
            "Clients that retry at once turn one burst into several: check their back-off.",
        ),
        time_range=(start, end),
    )]
