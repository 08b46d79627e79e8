"""The rules: observed symptoms → findings with evidence and concrete `vllm serve` changes.

Every rule has one signature, ``run(ctx) -> list[Finding]``, and reads only the
:class:`~diagnostics.core.diagnosis.context.Context`; how rules combine (order, suppression) and
what each points to (knobs, charts, alerts, scenarios) is the table in
:mod:`diagnostics.core.diagnosis.table`. A rule that cannot run because a metric is absent says so
in an ``info`` finding; a symptom that came and went inside the window is still reported, with its
time range.
"""

from __future__ import annotations

import math
from typing import Any

from diagnostics.core.diagnosis.context import Context, episodes
from diagnostics.core.diagnosis.data_parallel import LoadSkew, engine_name, load_skews, silent_ranks, slow_ranks
from diagnostics.core.diagnosis.latency import IntervalItl, defended_batch
from diagnostics.core.diagnosis.logs import log_time
from diagnostics.core.diagnosis.types import Finding, KnownFlags, Suggestion, Thresholds
from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import (
    Quantile,
    count_above,
    counter_steps,
    histogram_delta,
    histogram_quantile,
    labelled_increase,
    labels_total,
    merge_histograms,
    quantile_estimate,
    spec_decode,
)
from diagnostics.core.text import SLEEP_LEVELS, fmt_latency, fmt_seconds_as_ms

# -- helpers ---------------------------------------------------------------------------------------


def _span(ctx: Context) -> dict[str, float]:
    first, last = ctx.history[0].ts, ctx.history[-1].ts
    return {"start": first, "end": last, "seconds": round(last - first, 3)}


def _whole(ctx: Context) -> tuple[float, float]:
    return ctx.history[0].ts, ctx.history[-1].ts


def _ms_or_bound(seconds: float, first_bound: float) -> str:
    """A median of interval medians, shown as "< bound" when it lies in the histogram's first bucket."""
    return f"< {fmt_seconds_as_ms(first_bound)}" if seconds <= first_bound else fmt_seconds_as_ms(seconds)


def quantile_evidence(key: str, q: Quantile) -> dict[str, Any]:
    """A quantile for a finding's evidence: the number, or the bucket edge it is bounded by."""
    value, bound = q.reported()
    return {f"{key}_seconds": value, f"{key}_bound": bound}


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _absent(concept: str, rule: str, why: str) -> Finding:
    return Finding(
        id=f"absent:{rule}",
        severity="info",
        title=f"Cannot check {rule.replace('_', ' ')}: this server does not expose {concept}",
        evidence={"missing": concept},
        checks=(why,),
    )


def _exposes(ctx: Context, concept: str) -> bool:
    return any(snap.has(concept) for _, snap in ctx.ok)


def _mean_from(hist: Histogram | None) -> float | None:
    if hist is None or hist.count <= 0 or math.isnan(hist.sum):
        return None
    return hist.sum / hist.count


def _max_gauge(ctx: Context, concept: str) -> float:
    return max((snap.value(concept) or 0) for _, snap in ctx.ok)


# -- rules over the scrapes ------------------------------------------------------------------------


def _before(ctx: Context, ts: float, seconds: float = 60.0) -> dict[str, Any]:
    """What the last minute of good scrapes before ``ts`` showed, as ``before_*`` evidence ({} with
    none): the state the server was in when it went down or restarted."""
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


def outage(ctx: Context) -> list[Finding]:
    """Failed scrapes: the server was unreachable, timed out, answered errors, or its engine died."""
    history = ctx.history
    findings = []
    slow: list[tuple[float, float]] = []
    for start, end in episodes([(s.ts, s.snapshot is None) for s in history]):
        errors = sorted({s.error or "failed" for s in history if s.snapshot is None and start <= s.ts <= end})
        ongoing = history[-1].snapshot is None and history[-1].ts == end
        engine_dead = any("503" in e or "unhealthy" in e for e in errors)
        if not ongoing and end - start < ctx.thresholds.slow_scrape_max_seconds \
                and all(SLOW_SCRAPE in e for e in errors):
            slow.append((start, end))
            continue
        title = ("Engine dead (/health 503)" if engine_dead else "Server unreachable") + (
            f" since {_fmt_s(end - start)} ago" if ongoing else f" for {_fmt_s(end - start)}, then recovered"
        )
        findings.append(
            Finding(
                id="server_down",
                severity="critical",
                title=title,
                evidence={"failed_scrapes": sum(1 for s in history if s.snapshot is None and start <= s.ts <= end),
                          "errors": errors[:5], "ongoing": ongoing, **_before(ctx, start), "window": _span(ctx)},
                checks=(
                    "Is the process alive? Read the last lines of its log: an OOM, EngineDeadError or a traceback "
                    "names the cause (python -m diagnostics diagnose --log FILE parses it).",
                    "After a restart, compare the flags with the last good run before changing anything.",
                ),
                time_range=(start, end),
                knobs=("down",),
                chart="generation_tokens",
            )
        )
    if slow:
        findings.append(_slow_scrapes(ctx, slow))
    for iv, (_, snap) in zip(ctx.intervals, ctx.ok[1:]):
        if iv.restarted:
            findings.append(
                Finding(
                    id="server_restarted",
                    severity="warning",
                    title="The server restarted inside the window: requests in flight were lost",
                    evidence={"started_at": snap.process_start_time_seconds, "seen_at": iv.end,
                              **_before(ctx, iv.start + 1e-6)},
                    checks=(
                        "Was it restarted on purpose (a deploy, an autoscaler)? If not, read the log of the run that "
                        "ended: an OOM, EngineDeadError or a traceback names the cause (diagnose --log FILE).",
                        "The 'before' values are the last minute of the run that ended.",
                    ),
                    time_range=(iv.start, iv.end),
                    knobs=("down",),
                    chart="generation_tokens",
                )
            )
    return findings


SLOW_SCRAPE = "did not answer within"  # the HTTP adapter's timeout message


def _slow_scrapes(ctx: Context, episodes_: list[tuple[float, float]]) -> Finding:
    """Scrapes that timed out and were answered again within seconds: a busy API process, not an
    outage (a server whose frontend shares two cores with its engines answers late under load)."""
    failed = sum(1 for s in ctx.history if s.snapshot is None and any(a <= s.ts <= b for a, b in episodes_))
    return Finding(
        id="scrapes_slow",
        # One or two late answers as a burst lands are worth knowing, not worth a warning.
        severity="warning" if failed >= ctx.thresholds.slow_scrape_warning_count else "info",
        title=f"/metrics answered late: {failed} scrape{'s' if failed > 1 else ''} timed out"
        f"{f' in {len(episodes_)} episodes' if len(episodes_) > 1 else ''}; the next scrape answered"
        + (" each time" if len(episodes_) > 1 else ""),
        evidence={"failed_scrapes": failed, "episodes": len(episodes_),
                  "first_timeout_at": episodes_[0][0], "last_timeout_at": episodes_[-1][1], "window": _span(ctx)},
        checks=(
            "The API process was too busy to answer in time: watch it (CPU, event-loop lag) under this load; a "
            "frontend that falls behind delays tokens too (--api-server-count, or fewer clients per server).",
            "If timeouts keep coming, raise the scrape timeout or interval rather than read them as an outage.",
        ),
        time_range=(episodes_[0][0], episodes_[-1][1]),
    )


def stall(ctx: Context) -> list[Finding]:
    """Requests running, no token produced for several intervals, while the server still answers."""
    if not _exposes(ctx, "generation_tokens"):
        return [_absent("vllm:generation_tokens_total", "silent_stall", "Token production cannot be followed.")]
    findings = []
    for episode in ctx.stalls:
        seconds = episode.end - episode.start
        ongoing = ctx.ok[-1][0].ts == episode.end
        findings.append(
            Finding(
                id="silent_stall",
                severity="critical",
                title=f"Silent stall: {episode.num_requests_running:.0f} requests running, no token for "
                f"{_fmt_s(seconds)}" + (" (ongoing)" if ongoing else ", then tokens resumed"),
                evidence={"num_requests_running": episode.num_requests_running,
                          "seconds_without_tokens": round(seconds, 3), "scrapes": episode.num_scrapes,
                          "ongoing": ongoing, "window": _span(ctx)},
                checks=(
                    "The frontend still answers /metrics (and /health), but the engine produces nothing: dump the "
                    "EngineCore stacks (py-spy dump --pid <EngineCore pid>) before restarting.",
                    "Look for a stopped or swapping process, a hung GPU (nvidia-smi), or a stuck collective (TP/PP).",
                ),
                time_range=(episode.start, episode.end),
                knobs=("stall",),
                chart="generation_tokens",
            )
        )
    return findings


def hung_rank(ctx: Context) -> list[Finding]:
    """One data-parallel engine silent while its peers serve (see :mod:`.engines`): critical, naming
    the engine, since when, and what it last reported holding."""
    t = ctx.thresholds
    findings = []
    skews = _skews(ctx)
    for rank in silent_ranks(ctx.ok, t.hung_rank_min_seconds, t.hung_rank_peer_batch):
        if not (rank.last_running or rank.last_waiting) and any(
                skew.peer == rank.engine and skew.since <= rank.since for skew in skews):
            # Requests were routed away from this rank while it answered, and it last reported holding
            # none: idle, not hung. One that reported requests of its own is hung whatever the routing.
            continue
        name = engine_name(rank.engine)
        held = [f"{v:.0f} {what}" for v, what in ((rank.last_running, "running"), (rank.last_waiting, "waiting"))
                if v]
        findings.append(Finding(
            id="hung_rank",
            severity="critical",
            title=f"Hung rank: {name} produced no token for {_fmt_s(rank.seconds)} while its peers generated "
            f"{rank.peer_generation_tokens:,.0f}" + (" (ongoing)" if rank.ongoing else "; then it resumed"),
            evidence={
                "engine": rank.engine[1], "model_name": rank.engine[0], "silent_since_at": rank.since,
                "seconds_without_tokens": round(rank.seconds, 3), "ongoing": rank.ongoing,
                "peer_generation_tokens": rank.peer_generation_tokens,
                "peer_max_sequences_per_step": None if rank.peer_max_batch is None else round(rank.peer_max_batch, 2),
                # Its gauges froze with it; under DP they often read 0 while work ran, so only a
                # non-zero value says something.
                **({"last_num_requests_running": rank.last_running, "last_num_requests_waiting": rank.last_waiting,
                    "last_kv_cache_usage_perc": rank.last_kv_cache_usage_perc} if held else {}),
                "window": _span(ctx),
            },
            checks=(
                f"Dump the stacks of the EngineCore_DP{rank.engine[1] or '0'} process (py-spy dump --pid <pid>) "
                "before restarting: a stopped or swapping process, a hung device or a stuck RPC is not a tuning "
                "problem.",
                "Requests the load balancer already sent to this rank get no answer until it resumes or restarts"
                + (f"; it last reported {' and '.join(held)}." if held else "."),
                "The server's totals only drop by this rank's share: whole-server charts look merely slower.",
            ),
            time_range=(rank.since, rank.until),
            knobs=("hung-rank",),
            chart="generation_tokens",
        ))
    return findings




def engine_asleep(ctx: Context) -> list[Finding]:
    """An engine put to sleep (``POST /sleep``, ``--enable-sleep-mode``): it serves nothing until
    woken. Critical, with how to wake it; the stall rules stay quiet meanwhile (not a hang)."""
    points = [(s.ts, bool(snap.asleep())) for s, snap in ctx.ok]
    findings = []
    for start, end in episodes(points):
        snaps = [snap for s, snap in ctx.ok if start <= s.ts <= end]
        engines: dict[str, str] = {}
        for snap in snaps:
            engines.update({key[1] or "0": level for key, level in snap.asleep().items()})
        levels = sorted(set(engines.values()))
        ongoing = ctx.ok[-1][0].ts == end
        waiting = max((snap.value("num_requests_waiting") or 0.0) for snap in snaps)
        names = ", ".join(f"engine {e}" for e in sorted(engines))
        findings.append(Finding(
            id="engine_asleep",
            severity="critical",
            title=f"{names.capitalize()} asleep ({'; '.join(SLEEP_LEVELS.get(lv, lv) for lv in levels)})"
            + (f" for at least {_fmt_s(end - start)}, still asleep" if ongoing else f" for {_fmt_s(end - start)}, then "
               "woken") + ": it serves nothing until woken",
            evidence={"engines": sorted(engines), "sleep_states": levels, "asleep_since_at": start,
                      "seconds_asleep": round(end - start, 3), "ongoing": ongoing,
                      "max_num_requests_waiting": waiting, "window": _span(ctx)},
            checks=(
                "Wake it with POST /wake_up (the endpoint exists when the server runs with VLLM_SERVER_DEV_MODE=1); "
                "after level 2 the weights must be reloaded before it serves again.",
                "Find out who put it to sleep (an RL trainer sharing the GPU, an autoscaler): it is not a hang, and "
                "restarting it loses whatever that owner expected to resume.",
            ),
            time_range=(start, end),
            knobs=("asleep",),
            chart="generation_tokens",
        ))
    return findings


def _skews(ctx: Context) -> list[LoadSkew]:
    t = ctx.thresholds
    return load_skews(ctx.ok, t.skew_min_seconds, t.kv_full_perc, t.skew_kv_gap)


def engine_imbalance(ctx: Context) -> list[Finding]:
    """Engines of one server out of balance, two ways:

    - one engine queues (or fills its KV cache) while a peer has room: requests routed around vLLM's
      balancer (which sends each to the engine with the fewest in flight), so fix the routing; raising
      --max-num-seqs would only deepen the busy engine's batch;
    - one engine generates a small share of its peers' tokens while serving all along (a slow rank:
      the balancer evens out requests in flight, not speed): a device or host to look at, not a flag."""
    t = ctx.thresholds
    # A hung rank's gauges freeze at whatever it last reported, which can look like room: the queue
    # on its peer is then the hang's (hung_rank names it), not the routing's.
    silent = silent_ranks(ctx.ok, t.hung_rank_min_seconds, t.hung_rank_peer_batch)
    findings = [_skew_finding(ctx, skew) for skew in _skews(ctx)
                if not any(r.engine == skew.peer and r.since < skew.until and skew.since < r.until
                           and (r.last_running or r.last_waiting) for r in silent)]
    for rank in slow_ranks(ctx.ok, t.slow_rank_window_seconds, t.slow_rank_max_ratio):
        name = engine_name(rank.engine)
        steps = (f"; {rank.steps_per_second:,.0f} engine steps a second against {rank.peer_steps_per_second:,.0f}"
                 if rank.steps_per_second is not None and rank.peer_steps_per_second is not None else "")
        findings.append(Finding(
            id="engine_imbalance",
            severity="warning",
            title=f"Engines out of balance: {name} generated {rank.ratio * 100:.0f} % of its peers' tokens for "
            f"{_fmt_s(rank.until - rank.since)} ({rank.tokens_per_second:,.0f} against {rank.peer_tokens_per_second:,.0f} "
            f"tokens/s){steps}: a slow rank",
            evidence={"engine": rank.engine[1], "model_name": rank.engine[0],
                      "share_of_peer_tokens_perc": round(rank.ratio, 3),
                      "generation_tokens_per_second": round(rank.tokens_per_second, 1),
                      "peer_generation_tokens_per_second": round(rank.peer_tokens_per_second, 1),
                      "engine_steps_per_second": None if rank.steps_per_second is None
                      else round(rank.steps_per_second, 1),
                      "peer_engine_steps_per_second": None if rank.peer_steps_per_second is None
                      else round(rank.peer_steps_per_second, 1), "window": _span(ctx)},
            checks=(
                f"Look at the device and host behind EngineCore_DP{rank.engine[1] or '0'}: clocks and throttling "
                "(nvidia-smi -q -d PERFORMANCE,CLOCK), ECC or Xid errors, a noisy neighbour on its CPU cores.",
                "vLLM's balancer evens out requests in flight, so the slow rank's requests just take longer: their "
                "users see the slow tail of TTFT and ITL.",
                "If one rank keeps lagging, take it out of service (fewer --data-parallel-size on healthy devices) "
                "rather than tune flags.",
            ),
            time_range=(rank.since, rank.until),
            knobs=("slow-rank",),
            chart="generation_tokens",
        ))
    return findings


def _skew_finding(ctx: Context, skew: LoadSkew) -> Finding:
    name, peer = engine_name(skew.engine), engine_name(skew.peer)
    if skew.kind == "waiting":
        what = (f"{name} held up to {skew.max_waiting:.0f} waiting at {skew.running:.0f} running while {peer} had room "
                f"({skew.peer_running:.0f} running at most, none waiting)")
    else:
        what = (f"{name}'s KV cache reached {(skew.max_kv_usage or 0) * 100:.0f} % while {peer}'s stayed at "
                f"{(skew.peer_kv_usage or 0) * 100:.0f} % or less")
    return Finding(
        id="engine_imbalance",
        severity="warning",
        title=f"Requests not spread across engines: {what} for {_fmt_s(skew.seconds)}",
        evidence={"engine": skew.engine[1], "model_name": skew.engine[0], "peer_engine": skew.peer[1],
                  "skew": skew.kind, "max_num_requests_waiting": skew.max_waiting,
                  "num_requests_running": skew.running, "peer_max_num_requests_running": skew.peer_running,
                  "peer_max_num_requests_waiting": skew.peer_waiting, "max_kv_cache_usage_perc": skew.max_kv_usage,
                  "peer_max_kv_cache_usage_perc": skew.peer_kv_usage, "seconds": round(skew.seconds, 3),
                  "window": _span(ctx)},
        checks=(
            "vLLM's own balancer sends each request to the engine with the fewest in flight, so a queue on one "
            "rank beside room on another means something routes around it: a router setting the "
            "X-data-parallel-rank header, session affinity or prefix-aware routing in an external load balancer "
            "(--data-parallel-external-lb / --data-parallel-hybrid-lb).",
            f"Raising --max-num-seqs would only deepen the batch (and the ITL) on {name} while {peer} idles: spread the "
            "requests first.",
            "If the routing is deliberate (prefix affinity), size that rank for the load it really gets.",
        ),
        time_range=(skew.since, skew.until),
        knobs=("dp-balance",),
        chart="num_requests_waiting",
    )


def more_kv_capacity(flags: KnownFlags, t: Thresholds) -> Suggestion | None:
    """The change that gives the KV cache more room on *this* server: raise the pin when the KV size
    is pinned (vLLM then ignores --gpu-memory-utilization for it), else the utilization."""
    if flags.num_gpu_blocks_override:
        blocks = flags.num_gpu_blocks_override
        return Suggestion("--num-gpu-blocks-override", "increase", int(math.ceil(blocks * 1.5)),
                          f"The KV cache is pinned at {blocks:,} blocks by --num-gpu-blocks-override: neither "
                          "--gpu-memory-utilization nor --kv-cache-dtype changes it while the override is set "
                          "(raise it within the device's memory, or drop it).")
    if flags.kv_cache_memory_bytes:
        size = flags.kv_cache_memory_bytes
        value = int(math.ceil(size * 1.5 / 2**20)) * 2**20
        return Suggestion("--kv-cache-memory-bytes", "increase", value,
                          f"The KV cache is pinned at {size / 2**30:.2f} GiB by --kv-cache-memory-bytes, so "
                          "--gpu-memory-utilization is ignored for its size (raise it within the device's "
                          "memory, or drop it; on the CPU backend VLLM_CPU_KVCACHE_SPACE sets it too).")
    util = flags.gpu_memory_utilization
    if util is not None and util >= t.max_gpu_memory_utilization:
        return None
    return Suggestion("--gpu-memory-utilization", "increase",
                      min(t.max_gpu_memory_utilization, round((util or 0.9) + 0.05, 2)),
                      "More of the device for the KV cache, if nothing else shares it.")


def _suggest_more_kv(flags: KnownFlags, t: Thresholds, demand_tokens: float | None) -> list[Suggestion]:
    out = [s for s in (more_kv_capacity(flags, t),) if s is not None]
    if flags.cache_dtype in (None, "auto", "bfloat16", "float16", "half"):
        out.append(Suggestion("--kv-cache-dtype", "set", "fp8",
                              "Halves KV bytes per token, so twice the tokens fit; check accuracy on your evals."))
    if not flags.num_gpu_blocks_override:
        out.append(Suggestion("--tensor-parallel-size", "increase", None,
                              "With more GPUs, each holds a slice of the weights and KV heads: more room for KV."))
    value = int(math.ceil(demand_tokens * 1.25 / 256) * 256) if demand_tokens else None
    if flags.max_model_len and value and value < flags.max_model_len:
        out.append(Suggestion("--max-model-len", "decrease", value,
                              f"A trade-off, not more room: V1 allocates KV blocks as tokens arrive, so a shorter "
                              f"maximum frees nothing for the requests it still admits; it only turns away those "
                              f"longer than {value:,} tokens (p99 prompt + output here: {demand_tokens:,.0f})."))
    return out


def kv_pressure(ctx: Context) -> list[Finding]:
    """Preemptions while the KV cache is near full: more KV capacity or fewer sequences, never more."""
    t, ok = ctx.thresholds, ctx.ok
    if not _exposes(ctx, "num_preemptions"):
        if _exposes(ctx, "num_requests_swapped"):
            return []  # V0: swapped requests; not judged here
        return [_absent("vllm:num_preemptions_total", "kv_pressure", "Preemption cannot be counted (vLLM < 0.8.5).")]
    found = episodes([(iv.end, (iv.num_preemptions or 0) > 0) for iv in ctx.intervals], t.episode_merge_seconds)
    if not found:
        return []
    total = sum(iv.num_preemptions or 0 for iv in ctx.intervals)
    usage = [snap.value("kv_cache_usage_perc") for _, snap in ok]
    max_usage = max((u for u in usage if u is not None), default=None)
    waiting = _max_gauge(ctx, "num_requests_waiting")
    first_ts = found[0][0]
    running_at_onset = next(
        ((snap.value("num_requests_running") or 0) for s, snap in ok if s.ts >= first_ts), None
    )
    seconds = max(ctx.history[-1].ts - ctx.history[0].ts, 1e-9)
    prompt_p99 = histogram_quantile(0.99, histogram_delta(ctx.history, "request_prompt_tokens"))
    gen_p99 = histogram_quantile(0.99, histogram_delta(ctx.history, "request_generation_tokens"))
    demand = (prompt_p99 or 0) + (gen_p99 or 0) or None
    suggestions = _suggest_more_kv(ctx.flags, t, demand)
    if running_at_onset:
        suggestions.append(
            Suggestion("--max-num-seqs", "decrease", max(1, int(running_at_onset * 0.75)),
                       f"Preemption began with {running_at_onset:.0f} running; fewer concurrent sequences need "
                       "fewer blocks (the opposite of raising it).")
        )
    near_full = max_usage is not None and max_usage >= t.kv_full_perc
    severe = near_full and waiting > 0 and total / seconds >= 1.0
    return [
        Finding(
            id="kv_pressure",
            severity="critical" if severe else "warning",
            title=f"KV-cache pressure: {total:.0f} preemptions"
            + (f", KV usage up to {max_usage * 100:.0f} %" if max_usage is not None else "")
            + (f", up to {waiting:.0f} waiting" if waiting else ""),
            evidence={"preemptions": total, "preemptions_per_second": round(total / seconds, 4),
                      "max_kv_cache_usage_perc": max_usage, "max_num_requests_waiting": waiting,
                      "num_requests_running_at_onset": running_at_onset, "episodes": len(found),
                      "window": _span(ctx)},
            suggestions=tuple(suggestions),
            checks=(
                "Confirm preemptions line up with KV usage near 100 % on the chart (not a one-off burst).",
                "Do not raise --max-num-seqs for this: more sequences need more blocks and preempt more.",
                "Check the KV capacity against the workload (tokens per request × concurrency) before and after.",
            ),
            time_range=(found[0][0], found[-1][1]),
            knobs=("preemption",),
            chart="kv_cache_usage_perc",
        )
    ]


def queue_at_cap(ctx: Context) -> list[Finding]:
    """Waiting requests while running sits at its cap and the KV cache has room: raise --max-num-seqs.

    Scrapes inside a stall, or inside a long prefill step (head-of-line blocking), are left out:
    while no token moves, or one long step holds the engine, the cap is not what queues."""
    t, ok = ctx.thresholds, ctx.ok
    if not _exposes(ctx, "num_requests_waiting"):
        return [_absent("vllm:num_requests_waiting", "queueing", "Queueing cannot be seen.")]
    cap = ctx.flags.max_num_seqs or _max_gauge(ctx, "num_requests_running")
    if cap <= 0:
        return []
    points = []
    # Scrapes where another engine had room for as long as a queue takes to count here: routing,
    # which engine_imbalance judges (room that flickers is no way around the cap).
    skews = [(skew.since, skew.until) for skew in load_skews(ctx.ok, t.queue_min_seconds, t.kv_full_perc, t.skew_kv_gap)
             if skew.kind == "waiting"]
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
    found = [e for e in episodes(points, 2.0) if e[1] - e[0] >= t.queue_min_seconds]
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
                      "seconds_queued_at_cap": round(seconds, 3), "window": _span(ctx)},
            suggestions=(
                Suggestion("--max-num-seqs", "increase", target,
                           f"Running sat at {cap:.0f} for {_fmt_s(seconds)} with up to {peak_waiting:.0f} waiting while "
                           f"the KV cache stayed ≤ {max_usage * 100:.0f} % full: the cap, not memory, is what queues."),
            ),
            checks=(
                "Confirm KV usage stays below ~90 % after raising the cap; if it fills, this turns into preemption.",
                "A larger batch raises ITL: keep the new cap within your ITL budget (the defended batch size).",
                "If waiting is 'deferred' rather than 'capacity', the cause is LoRA or KV-transfer limits instead.",
            ),
            time_range=(found[0][0], found[-1][1]),
            knobs=("queue-at-cap",),
            chart="num_requests_waiting",
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
    found = [e for e in episodes(points, 2.0) if e[1] - e[0] >= t.queue_min_seconds]
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
        title=f"Requests wait {why}: up to {peak:.0f} deferred for {_fmt_s(seconds)}"
        + (f" ({capacity:.0f} waiting for capacity)" if capacity else ""),
        evidence={"max_num_requests_waiting_deferred": peak, "max_num_requests_waiting_capacity": capacity,
                  "seconds_deferred": round(seconds, 3), "max_lora": max_lora,
                  "adapters_waiting": sorted(waiting_adapters)[:10], "window": _span(ctx)},
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
        knobs=("deferred",),
        chart="num_requests_waiting",
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
    around = [(s, snap) for s, snap in ctx.ok if start - 5.0 <= s.ts <= end + t.admission_drain_seconds]
    near = [snap for _, snap in around]
    cap = flags.max_num_seqs or _max_gauge(ctx, "num_requests_running")
    usage = max((snap.value("kv_cache_usage_perc") or 0.0) for snap in near)
    # vLLM 0.32's gauges can read 0 through a burst that lasts a second on a busy host: the requests
    # that finished around it say the same thing when they queued for a good part of a decode.
    queued = _mean_from(histogram_delta([s for s, _ in around], "request_queue_time_seconds"))
    decode = _mean_from(histogram_delta([s for s, _ in around], "request_decode_time_seconds"))
    queued_behind = (queued is not None and decode is not None and decode > 0
                     and queued >= t.admission_queued_share * decode)
    gauge_at_cap = any((snap.value("num_requests_running") or 0) >= cap > 0 for snap in near)
    at_cap = gauge_at_cap or queued_behind
    peak_waiting = max((snap.value("num_requests_waiting") or 0.0) for snap in near)
    reasons = sorted((r for r, n in by_reason.items() if n > 0), key=lambda r: -by_reason[r])
    limits = " and ".join(f"--{r.replace('_', '-')}" for r in reasons)
    if usage >= t.kv_full_perc:
        suggestions = _suggest_more_kv(flags, t, None)
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
                  "mean_queue_seconds": queued, "mean_decode_seconds": decode, "window": _span(ctx)},
        suggestions=tuple(suggestions),
        checks=(
            "The queue limit sheds load by design: raise it only if clients would rather wait than retry a 503.",
            "Clients that retry at once turn one burst into several: check their back-off.",
        ),
        time_range=(start, end),
        knobs=("admission",),
        chart="num_requests_waiting",
    )]


def speculative_decoding(ctx: Context) -> list[Finding]:
    """Speculation that is mostly rejected: fewer ``num_speculative_tokens`` (the positions that
    are accepted often enough), or none when even the first is mostly rejected and each verify step
    emits under ``spec_min_gain`` tokens — then it costs more than it gains."""
    t = ctx.thresholds
    spec = spec_decode([s for s, _ in ctx.ok])
    if spec is None or spec.draft_tokens < t.spec_min_draft_tokens:
        return []
    rate, length, k = spec.acceptance_rate, spec.mean_accepted_length, spec.num_speculative_tokens
    if rate is None or length is None or k is None or rate >= t.spec_low_acceptance:
        return []
    per_pos = spec.per_position_rate
    keep = next((i for i, r in enumerate(per_pos) if r < t.spec_keep_position), len(per_pos))
    off = keep == 0 and length < t.spec_min_gain
    if off:
        suggestion = Suggestion("--speculative-config", "set", None,
                                f"Drop --speculative-config: each verify step emits {length:.2f} tokens on average "
                                f"while checking {k + 1}, so speculation costs more compute than it saves.")
    else:
        value = max(1, keep)
        why = (f"Draft positions past {value} are accepted under {t.spec_keep_position * 100:.0f} % of the time: "
               "drafting them wastes verify work." if keep else
               f"Even the first draft token is accepted under {t.spec_keep_position * 100:.0f} % of the time, but "
               f"each verify step still emits {length:.2f} tokens: keep one draft token, not {k}.")
        suggestion = Suggestion("--speculative-config", "decrease", f"'{{\"num_speculative_tokens\": {value}, …}}'",
                                why)
    start, end = ctx.ok[0][0].ts, ctx.ok[-1][0].ts
    return [Finding(
        id="spec_low_acceptance",
        severity="warning",
        title=f"Speculative decoding mostly rejected: {rate * 100:.0f} % of draft tokens accepted, "
        f"{length:.2f} tokens per verify step with {k} drafted" + ("; it costs more than it gains" if off else ""),
        evidence={"acceptance_rate_perc": rate, "mean_accepted_length": round(length, 3), "num_speculative_tokens": k,
                  "per_position_acceptance": [f"{i}: {r * 100:.0f} %" for i, r in enumerate(per_pos)],
                  "drafts": spec.drafts, "draft_tokens": spec.draft_tokens, "window": _span(ctx)},
        suggestions=(suggestion,),
        checks=(
            "Acceptance depends on the traffic: n-gram lookup needs outputs that repeat the prompt (code edits, "
            "extraction); a draft model needs one trained like the target. Compare ITL with speculation off.",
            "Keep the change only if ITL p50 and throughput improve at the same load (the Probe page measures it).",
        ),
        time_range=(start, end),
        knobs=("spec-decode",),
        chart="spec_decode_acceptance",
    )]


def head_of_line(ctx: Context) -> list[Finding]:
    """A tail of ITL spikes next to large prefill steps, with long individual prompts and a flat
    median: lower the chunked-prefill budget, not the batch (see :mod:`.latency`)."""
    t, prof = ctx.thresholds, ctx.itl
    if not prof.head_of_line or prof.baseline_p50_seconds is None:
        return []
    blocking = prof.blocking
    worst_p99 = max(iv.p99_seconds or 0.0 for iv in blocking)
    share = max(prof.tail_share(iv) for iv in blocking)
    window = merge_histograms([iv.itl for iv in prof.intervals])
    p50, p99 = histogram_quantile(0.5, window), histogram_quantile(0.99, window)
    big = [count_above(iv.steps, t.hol_big_step_tokens) for iv in prof.intervals if iv.steps is not None]
    value, step_tokens = _chunk_budget(ctx)
    why = (f"Steps of about {step_tokens:,.0f} tokens stretched decode gaps from "
           f"{prof.baseline_p50_seconds * 1000:.0f} to {worst_p99 * 1000:.0f} ms; at that cost per token, chunks of "
           f"{value:,} keep a step under {prof.spike_threshold_seconds * 1000:.0f} ms. A smaller chunked-prefill "
           "budget splits a long prompt over several steps (vLLM docs: 'Smaller values (e.g., 2048) achieve "
           "better ITL').")
    return [
        Finding(
            id="head_of_line_blocking",
            severity="warning",
            title=f"Head-of-line blocking: ITL p99 up to {worst_p99 * 1000:.0f} ms next to long prefills "
            f"(median {prof.baseline_p50_seconds * 1000:.0f} ms stays flat)",
            evidence={
                "itl_baseline_p50_seconds": prof.baseline_p50_seconds,
                "itl_window_p50_seconds": p50,
                "itl_window_p99_seconds": p99,
                "itl_worst_interval_p99_seconds": worst_p99,
                "spike_threshold_seconds": prof.spike_threshold_seconds,
                "max_share_of_gaps_above_threshold_perc": round(share, 4),
                "spike_intervals": len(prof.spikes),
                "spike_intervals_next_to_large_prefill": len(blocking),
                "large_engine_steps": sum(big) if big else None,
                "large_step_tokens_over": t.hol_big_step_tokens,
                "long_prompts": prof.long_prompts,
                "long_prompt_tokens_over": t.hol_long_prompt_tokens,
                "window": _span(ctx),
            },
            suggestions=(Suggestion("--max-num-batched-tokens", "decrease", value, why),),
            checks=(
                "This is the chunk size, not the batch size: do not lower --max-num-seqs for it.",
                "Chunked prefill is on by default in V1; make sure it was not disabled.",
                "A smaller chunk raises TTFT of the long prompts: check the TTFT budget after the change.",
            ),
            time_range=(blocking[0].start, blocking[-1].end),
            knobs=("head-of-line",),
            chart="inter_token_latency_seconds",
        )
    ]


def _chunk_budget(ctx: Context) -> tuple[int, float]:
    """The --max-num-batched-tokens that keeps a prefill-carrying step under the spike threshold,
    and the step size it is scaled from: a step of S tokens stretched the gap from the baseline B to
    the worst interval p99 W, so a chunk of S·(T−B)/(W−B) tokens gives about T. A power of two, at
    most half of the current budget when that is known (rounded down to a power of two as well),
    and at least 512 and --max-num-seqs (vLLM requires the budget to hold one token per sequence)."""
    prof = ctx.itl
    base = prof.baseline_p50_seconds or 0.0
    worst = max(iv.p99_seconds or 0.0 for iv in prof.blocking)
    steps = [_largest_step(iv) for iv in prof.blocking]
    step_tokens = max(steps) if steps else ctx.thresholds.hol_big_step_tokens
    current = ctx.flags.max_num_batched_tokens
    if current:
        step_tokens = min(step_tokens, current)
    scaled = step_tokens * (prof.spike_threshold_seconds - base) / max(worst - base, 1e-9)
    value = _pow2_floor(scaled)
    if current:
        value = min(value, _pow2_floor(current / 2))
    # vLLM refuses a budget below --max-num-seqs; 512 keeps clear of small defaults when it is unknown.
    floor = max(512, ctx.flags.max_num_seqs or 0)
    return max(floor, value), step_tokens


def _pow2_floor(x: float) -> int:
    return int(2 ** int(math.log2(max(1.0, x))))


def _largest_step(iv: IntervalItl) -> float:
    """The largest engine step of the interval in tokens: the upper bound of the highest populated
    iteration_tokens bucket (its lower bound when that is +Inf), else the computed prefill tokens."""
    hist = iv.steps
    if hist is None:
        return iv.computed_prefill_tokens
    populated = [i for i, (c, prev) in enumerate(zip(hist.cumulative, (0.0, *hist.cumulative))) if c > prev]
    if not populated:
        return iv.computed_prefill_tokens
    k = populated[-1]
    return hist.bounds[k] if k < len(hist.bounds) - 1 else hist.bounds[max(0, k - 1)]


def slow_decode(ctx: Context) -> list[Finding]:
    """ITL over the budget once the head-of-line tail is set aside: the batch is larger than the
    budget defends (when the median rises with the running count), else the model is slow per step."""
    budget_ms = ctx.budgets.itl_ms
    if not _exposes(ctx, "inter_token_latency_seconds"):
        return [_absent("vllm:inter_token_latency_seconds", "decode_speed", "Decode latency cannot be measured.")]
    prof = ctx.itl
    whole = quantile_estimate(0.95, merge_histograms([iv.itl for iv in prof.intervals]))
    if whole is None:
        return []
    if budget_ms is None:
        return [Finding(id="itl_budget_unset", severity="info",
                        title=f"ITL p95 is {fmt_latency(whole)}; no ITL budget given, so decode speed is not judged",
                        evidence={**quantile_evidence("itl_p95", whole), "window": _span(ctx)},
                        checks=("Pass --itl-budget-ms (CLI) or set the budget on the Diagnose page.",))]
    rest = quantile_estimate(0.95, prof.outside_blocking())
    if rest is None or not rest.over(budget_ms / 1000):
        return []
    defended = defended_batch(prof.intervals, budget_ms / 1000)
    peak = max((iv.num_requests_running for iv in prof.intervals), default=0.0)
    fewer = Suggestion(
        "--max-num-seqs", "decrease", defended,
        f"ITL p95 stayed within {budget_ms:g} ms up to {defended} running; it peaked at {peak:.0f}." if defended
        else "Fewer sequences per step make each decode step shorter.")
    quantize = Suggestion("--quantization", "set", None,
                          "Smaller weights are read faster each step, if measured accuracy allows (a quantized "
                          "checkpoint).")
    batch_bound = prof.median_rises_with_batch or defended is not None
    suggestions = [fewer, quantize] if batch_bound else [quantize, fewer]
    if ctx.flags.cache_dtype in (None, "auto", "bfloat16", "float16", "half"):
        suggestions.append(Suggestion("--kv-cache-dtype", "set", "fp8",
                                      "Fewer KV bytes read per decode step, if accuracy allows."))
    low, high = prof.p50_at_low_running_seconds, prof.p50_at_high_running_seconds
    first_bound = prof.intervals[0].itl.bounds[0] if prof.intervals else 0.0
    rise = (f"; median ITL {_ms_or_bound(low, first_bound)} → {_ms_or_bound(high, first_bound)} as the batch grew"
            if low and high else "")
    return [
        Finding(
            id="slow_decode",
            severity="warning",
            title=f"Decode slower than the budget: ITL p95 {fmt_latency(rest)} > {budget_ms:g} ms{rise}",
            evidence={**quantile_evidence("itl_p95", rest), **quantile_evidence("itl_p95_with_head_of_line", whole),
                      "itl_budget_ms": budget_ms, "peak_num_requests_running": peak,
                      "defended_num_requests_running": defended,
                      "itl_p50_at_low_running_seconds": low, "itl_p50_at_high_running_seconds": high,
                      "median_rises_with_batch": prof.median_rises_with_batch, "window": _span(ctx)},
            suggestions=tuple(suggestions),
            checks=(
                "First --max-num-seqs against the batch size your ITL budget defends; only then weigh "
                "quantization or fp8 KV, on measured numbers." if batch_bound else
                "ITL is over budget even at the smallest batch seen: the model is slow per step on this "
                "hardware, so fewer sequences alone will not meet the budget.",
                "Rule out a CPU-bound host (GPU utilisation low while ITL is high).",
            ),
            time_range=_whole(ctx),
            knobs=("decode-slow",),
            chart="inter_token_latency_seconds",
        )
    ]


def tokens_stopped(ctx: Context) -> list[Finding]:
    """Requests running and no token for a few seconds at the end of the window, not yet a stall:
    say so, and (the table's ``while_tokens_stopped``) give no queue or capacity advice meanwhile."""
    stopped = ctx.tokens_stopped
    if stopped is None or any(s.end >= stopped.since + stopped.seconds for s in ctx.stalls):
        return []
    at_least = "at least " if stopped.began_before_window else ""
    return [Finding(
        id="tokens_stopped", severity="info",
        title=f"No token for {at_least}{_fmt_s(stopped.seconds)} with {stopped.num_requests_running:.0f} running: "
        f"watching (a stall is called after {_fmt_s(ctx.thresholds.stall_min_seconds)}); no queue or capacity "
        "advice until tokens move",
        evidence={"seconds_without_tokens": round(stopped.seconds, 3), "num_requests_running":
                  stopped.num_requests_running, "began_before_window": stopped.began_before_window,
                  "window": _span(ctx)},
        time_range=(stopped.since, stopped.since + stopped.seconds), knobs=("stall",), chart="generation_tokens",
    )]


def ttft(ctx: Context) -> list[Finding]:
    """TTFT over budget, split into queue-dominated and prefill-dominated (different knobs)."""
    t, flags, budget_ms = ctx.thresholds, ctx.flags, ctx.budgets.ttft_ms
    if not _exposes(ctx, "time_to_first_token_seconds"):
        return [_absent("vllm:time_to_first_token_seconds", "ttft", "TTFT cannot be measured.")]
    est = quantile_estimate(0.95, histogram_delta(ctx.history, "time_to_first_token_seconds"))
    if est is None or budget_ms is None or not est.over(budget_ms / 1000):
        return []  # a p95 in the first bucket is only "< its bound": never over budget by interpolation
    queue = _mean_from(histogram_delta(ctx.history, "request_queue_time_seconds"))
    prefill = _mean_from(histogram_delta(ctx.history, "request_prefill_time_seconds"))
    usage = _max_gauge(ctx, "kv_cache_usage_perc")
    evidence = {**quantile_evidence("ttft_p95", est), "ttft_budget_ms": budget_ms, "mean_queue_seconds": queue,
                "mean_prefill_seconds": prefill, "max_kv_cache_usage_perc": usage, "window": _span(ctx)}
    if queue is not None and prefill is not None and queue >= prefill:
        if usage < t.kv_low_perc:
            cap = flags.max_num_seqs or _max_gauge(ctx, "num_requests_running")
            waiting = _max_gauge(ctx, "num_requests_waiting")
            suggestion = Suggestion("--max-num-seqs", "increase", int(cap + waiting) if cap else None,
                                    "Requests wait for a slot while the KV cache has room.")
        else:
            suggestion = _suggest_more_kv(flags, t, None)[0]
        return [Finding(
            id="ttft_queue_dominated", severity="warning",
            title=f"TTFT p95 {fmt_latency(est)} > {budget_ms:g} ms, mostly queue time "
            f"({queue * 1000:.0f} ms queued vs {prefill * 1000:.0f} ms prefill on average)",
            evidence=evidence, suggestions=(suggestion,),
            checks=("A capacity problem: see the queueing and KV-pressure findings for which resource is short.",),
            time_range=_whole(ctx), knobs=("ttft-queue",), chart="time_to_first_token_seconds",
        )]
    current = flags.max_num_batched_tokens
    suggestions = [Suggestion("--max-num-batched-tokens", "increase", current * 2 if current else None,
                              "More prefill tokens per step shorten long prompts' prefill (at some ITL cost).")]
    if flags.enable_prefix_caching is False:
        suggestions.append(Suggestion("--enable-prefix-caching", "set", None,
                                      "Repeated prefixes are then served from cache instead of recomputed."))
    return [Finding(
        id="ttft_prefill_dominated", severity="warning",
        title=f"TTFT p95 {fmt_latency(est)} > {budget_ms:g} ms, mostly prefill time",
        evidence=evidence, suggestions=tuple(suggestions),
        checks=("Check the prefix-cache hit rate: shared system prompts should hit.",
                "A larger prefill budget can raise ITL for running sequences (head-of-line blocking)."),
        time_range=_whole(ctx), knobs=("ttft-prefill",), chart="time_to_first_token_seconds",
    )]


_SHARING_CHECKS = (
    "Verify sharing is actually happening before touching batch size or memory utilization.",
    "vLLM V1 shares the prompt's full blocks across the n samples through the prefix cache; the partial last "
    "block is each sample's own.",
)


def _parallel_samples(ctx: Context) -> dict[str, Any] | None:
    """The evidence about requests sampled with n > 1 in the window; None when there were none."""
    n_hist = histogram_delta(ctx.history, "request_params_n")
    if n_hist is None:
        return None
    le1 = next((c for b, c in zip(n_hist.bounds, n_hist.cumulative) if b >= 1.0), 0.0)
    parallel = n_hist.cumulative[-1] - le1
    if parallel <= 0:
        return None
    return {"requests_with_n_gt_1": parallel, "mean_n": _mean_from(n_hist),
            "enable_prefix_caching": ctx.flags.enable_prefix_caching, "window": _span(ctx)}


def sharing_disabled(ctx: Context) -> list[Finding]:
    """Parallel samples (n > 1) with prefix caching off: each sample holds its own prompt blocks."""
    evidence = _parallel_samples(ctx) if ctx.flags.enable_prefix_caching is False else None
    if evidence is None:
        return []
    return [Finding(
        id="sharing_disabled", severity="warning",
        title=f"{evidence['requests_with_n_gt_1']:.0f} requests sampled n > 1 (mean n {evidence['mean_n']:.1f}) "
        "with prefix caching off: each sample holds its own copy of the prompt's blocks",
        evidence=evidence,
        suggestions=(Suggestion("--enable-prefix-caching", "set", None,
                                "The n samples of one prompt then share its full blocks instead of n copies."),),
        checks=_SHARING_CHECKS, time_range=_whole(ctx), knobs=("sharing-wasted",), chart="kv_cache_usage_perc",
    )]


def sharing_not_happening(ctx: Context) -> list[Finding]:
    """Parallel samples (n > 1) with prefix caching on (or unknown) but hardly any cache hits."""
    evidence = _parallel_samples(ctx) if ctx.flags.enable_prefix_caching is not False else None
    if evidence is None:
        return []
    hits = sum(iv.prefix_cache_hits or 0 for iv in ctx.intervals)
    queries = sum(iv.prefix_cache_queries or 0 for iv in ctx.intervals)
    prompt_p50 = histogram_quantile(0.5, histogram_delta(ctx.history, "request_prompt_tokens"))
    block = ctx.flags.block_size or 16
    if not (queries > 0 and hits / queries < ctx.thresholds.sharing_hit_rate_low and prompt_p50 is not None
            and prompt_p50 >= 2 * block):
        return []
    evidence.update({"prefix_cache_hit_rate": hits / queries, "prompt_tokens_p50": prompt_p50})
    return [Finding(
        id="sharing_not_happening", severity="warning",
        title=f"n > 1 sampling but the prefix-cache hit rate is {hits / queries * 100:.1f} %: samples are not "
        "sharing prompt blocks",
        evidence=evidence, checks=_SHARING_CHECKS, time_range=_whole(ctx),
        knobs=("sharing-wasted",), chart="prefix_cache_hit_rate",
    )]


# -- the startup log -------------------------------------------------------------------------------

STARTUP_ERRORS: dict[str, tuple[str, str]] = {
    "kv_too_small": ("KV cache too small for --max-model-len: the server cannot start", "kv-too-small-for-context"),
    "no_kv_memory": ("No memory left for the KV cache: the server cannot start", "wont-start"),
    "autofit_impossible": ("Not enough memory to auto-fit any context length", "wont-start"),
    "free_memory_low": ("Less free device memory than --gpu-memory-utilization asks for", "wont-start"),
    "profiling_changed": ("GPU memory changed during profiling (another process on the GPU)", "wont-start"),
    "oom_model_load": ("Out of memory while loading the weights", "wont-start"),
    "oom_sampler": ("Out of memory warming up the sampler", "wont-start"),
    "cuda_oom": ("CUDA out of memory", "wont-start"),
    "engine_dead": ("Engine core died at startup", "down"),
}
"""Per error kind the log parser knows: the finding's title and the knob-table row it rests on."""


DEATH_CAUSES: dict[str, tuple[str, str]] = {
    # kind: (what it says in a title, what to check first)
    "host_oom_killed": ("killed by the host's out-of-memory killer",
                        "Host memory: the kernel killed the engine (dmesg / journalctl -k: 'Out of memory: Killed "
                        "process'). Lower --max-num-seqs or the CPU-side caches (--swap-space, --max-cpu-loras), or "
                        "give the container more memory."),
    "cuda_oom": ("out of device memory while serving",
                 "Activation memory ran out at runtime: lower --gpu-memory-utilization a little (headroom for "
                 "activations) or --max-num-seqs / --max-num-batched-tokens."),
    "nccl": ("a collective (NCCL) error or timeout between ranks",
             "A rank hung or the interconnect failed: check every TP/PP/DP rank's log for the first error, run with "
             "NCCL_DEBUG=INFO, and look for a stopped or slow worker."),
    "rpc_timeout": ("a worker that stopped answering (RPC timeout)",
                    "A worker hung: dump its stacks (py-spy dump) if it is still there, check the device (nvidia-smi) "
                    "and the host for a stopped process."),
    "engine_exception": ("an exception inside the engine",
                         "The engine's own traceback (the EngineCore lines above EngineDeadError) names the failing "
                         "code: look for a known vLLM issue with that message, or a request that triggers it."),
    "engine_exited": ("its process exiting without an error of its own (killed by a signal?)",
                      "No traceback from the engine: something killed it — the OOM killer (dmesg), an operator, a "
                      "container memory limit or a node drain."),
}


def engine_died(ctx: Context) -> list[Finding]:
    """An engine that died after the server had come up (EngineDeadError in the log): when, the log
    lines that say why, the last minute before it from the recorded history, and what to check."""
    log = ctx.log
    dead = log.died_serving() if log is not None else None
    if log is None or dead is None:
        return []
    lines = log.death_lines()
    kinds = [c.kind for c in lines]
    cause = next((k for k in DEATH_CAUSES if k in kinds), None)
    when = log_time(dead.text)
    down = next((s.ts for s in ctx.history if s.snapshot is None), None)
    before = _before(ctx, down if down is not None else (ctx.history[-1].ts + 1 if ctx.history else 0.0))
    what, check = DEATH_CAUSES[cause] if cause else ("no cause the log names", DEATH_CAUSES["engine_exited"][1])
    return [Finding(
        id="engine_died",
        severity="critical",
        title=f"Engine core died while serving{f' at {when}' if when else ''}: {what}",
        evidence={"died_at_log_time": when, "log_lines": [f"line {c.line_no}: {c.text[-240:]}" for c in lines][:6],
                  **before},
        checks=(
            check,
            "The requests in flight got HTTP 500 and the server shut down: restart it, and keep this log "
            "(and a recording of the minute before) with the incident.",
        ),
        time_range=(down, down) if down is not None else None,
        knobs=("down",),
        chart="generation_tokens" if before else None,
    )]


def startup_log(ctx: Context) -> list[Finding]:
    """The errors a startup log states, each with the flag changes vLLM's message points to."""
    if ctx.log is None:
        return []
    t, log = ctx.thresholds, ctx.log
    findings = []
    for error in log.errors:
        title, knob = STARTUP_ERRORS[error.kind]
        n = error.numbers
        more = more_kv_capacity(ctx.flags, t)
        up = [more] if more is not None else []
        suggestions: list[Suggestion]
        if error.kind == "kv_too_small":
            estimated = int(n["estimated_max_model_len"]) if "estimated_max_model_len" in n else None
            suggestions = [
                Suggestion("--max-model-len", "decrease", estimated,
                           f"vLLM estimates {estimated:,} tokens fit in the KV memory it has." if estimated
                           else "A shorter context needs fewer KV blocks per request."),
                *up,
                Suggestion("--kv-cache-dtype", "set", "fp8", "Twice the tokens in the same KV memory."),
            ]
        elif error.kind in ("no_kv_memory", "autofit_impossible"):
            suggestions = [*up, Suggestion("--quantization", "set", None, "Smaller weights leave room for KV."),
                           Suggestion("--tensor-parallel-size", "increase", None, "Spread the weights over GPUs.")]
        elif error.kind == "free_memory_low":
            free, total = n.get("free_gib"), n.get("total_gib")
            value = round(max(0.05, free / total - 0.02), 2) if free and total else None
            suggestions = [Suggestion("--gpu-memory-utilization", "decrease", value,
                                      f"Only {free} of {total} GiB is free on the device (another process holds "
                                      "the rest)." if free else "Ask for no more than is free.")]
        elif error.kind == "oom_model_load":
            suggestions = [
                Suggestion("--gpu-memory-utilization", "decrease", None, "vLLM: free memory for the weights."),
                Suggestion("--tensor-parallel-size", "increase", None, "Each GPU holds a slice of the weights."),
                Suggestion("--quantization", "set", None, "Smaller weights."),
            ]
        elif error.kind == "oom_sampler":
            reqs = int(n.get("num_reqs", 0)) or None
            suggestions = [Suggestion("--max-num-seqs", "decrease", reqs // 2 if reqs else None,
                                      "The sampler warm-up runs max-num-seqs dummy requests."),
                           Suggestion("--gpu-memory-utilization", "decrease", None, "Leave activation headroom.")]
        elif error.kind == "cuda_oom":
            suggestions = [*up, Suggestion("--quantization", "set", None, "If it still does not fit at ~0.95."),
                           Suggestion("--tensor-parallel-size", "increase", None, "Or spread the model.")]
        else:
            suggestions = []
        findings.append(Finding(
            id=f"startup_{error.kind}", severity="critical", title=title,
            evidence={"log_line": error.line_no, "message": error.text, **{k: v for k, v in n.items()},
                      **({"vllm_version": log.version} if log.version else {})},
            suggestions=tuple(suggestions),
            checks=("Apply one change at a time and re-read the startup log's 'KV cache size' line.",),
            knobs=(knob,),
        ))
    return findings
