"""Data-parallel ranks of one server judged side by side (the per-engine analyses live in the
context, see :mod:`~diagnostics.core.diagnosis.data_parallel`): a rank that went silent while its
peers served, requests routed around vLLM's balancer, and a rank that serves slowly."""

from __future__ import annotations

from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.data_parallel import LoadSkew, engine_name
from diagnostics.core.diagnosis.types import Finding
from diagnostics.core.text import fmt_duration


def hung_rank(ctx: Context) -> list[Finding]:
    """One data-parallel engine silent while its peers serve: critical, naming the engine, since
    when, and what it last reported holding."""
    findings = []
    skews = ctx.skews_lasting(ctx.thresholds.skew_min_seconds)
    for rank in ctx.silent_ranks:
        if not rank.holds_requests and any(skew.peer == rank.engine and skew.since <= rank.since for skew in skews):
            # Requests were routed away from this rank while it answered, and nothing says it held
            # any: idle, not hung. One that held requests of its own is hung whatever the routing.
            continue
        name = engine_name(rank.engine)
        held = [f"{v:.0f} {what}" for v, what in ((rank.last_running, "running"), (rank.last_waiting, "waiting"))
                if v]
        findings.append(Finding(
            id="hung_rank",
            severity="critical",
            title=f"Hung rank: {name} produced no token for {fmt_duration(rank.seconds)} while its peers generated "
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
                **({"requests_held_through_silence": rank.held_through} if rank.held_through else {}),
            },
            checks=(
                f"Dump the stacks of the EngineCore_DP{rank.engine[1] or '0'} process (py-spy dump --pid <pid>) "
                "before restarting: a stopped or swapping process, a hung device or a stuck RPC is not a tuning "
                "problem.",
                "Requests the load balancer already sent to this rank get no answer until it resumes or restarts"
                + (f"; it last reported {' and '.join(held)}" if held else "")
                + (f"; the {rank.held_through:.0f} it finished when it resumed had waited through the silence."
                   if rank.held_through else "."),
                "The server's totals only drop by this rank's share: whole-server charts look merely slower.",
            ),
            time_range=(rank.since, rank.until),
        ))
    return findings


def load_skew(ctx: Context) -> list[Finding]:
    """One engine queues (or fills its KV cache) while a peer has room: requests routed around vLLM's
    balancer (which sends each to the engine with the fewest in flight), so fix the routing; raising
    --max-num-seqs would only deepen the busy engine's batch."""
    # A hung rank's gauges freeze at whatever it last reported, which can look like room: the queue
    # on its peer is then the hang's (hung_rank names it), not the routing's.
    return [_skew_finding(skew) for skew in ctx.skews_lasting(ctx.thresholds.skew_min_seconds)
            if not any(r.engine == skew.peer and r.since < skew.until and skew.since < r.until
                       and (r.last_running or r.last_waiting) for r in ctx.silent_ranks)]


def _skew_finding(skew: LoadSkew) -> Finding:
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
        title=f"Requests not spread across engines: {what} for {fmt_duration(skew.seconds)}",
        evidence={"engine": skew.engine[1], "model_name": skew.engine[0], "peer_engine": skew.peer[1],
                  "skew": skew.kind, "max_num_requests_waiting": skew.max_waiting,
                  "num_requests_running": skew.running, "peer_max_num_requests_running": skew.peer_running,
                  "peer_max_num_requests_waiting": skew.peer_waiting, "max_kv_cache_usage_perc": skew.max_kv_usage,
                  "peer_max_kv_cache_usage_perc": skew.peer_kv_usage, "seconds": round(skew.seconds, 3)},
        checks=(
            "vLLM's own balancer sends each request to the engine with the fewest in flight, so a queue on one "
            "rank beside room on another means something routes around it: a router setting the "
            "X-data-parallel-rank header, session affinity or prefix-aware routing in an external load balancer "
            "(--data-parallel-external-lb / --data-parallel-hybrid-lb).",
            f"Raising --max-num-seqs would only deepen the batch (and the ITL) on {name} while {peer} idles: spread "
            "the requests first.",
            "If the routing is deliberate (prefix affinity), size that rank for the load it really gets.",
        ),
        time_range=(skew.since, skew.until),
    )


def slow_rank(ctx: Context) -> list[Finding]:
    """One engine generates a small share of its peers' tokens while serving all along (a slow rank:
    the balancer evens out requests in flight, not speed): a device or host to look at, not a flag."""
    findings = []
    for rank in ctx.slow_ranks:
        name = engine_name(rank.engine)
        steps = (f"; {rank.steps_per_second:,.0f} engine steps a second against {rank.peer_steps_per_second:,.0f}"
                 if rank.steps_per_second is not None and rank.peer_steps_per_second is not None else "")
        findings.append(Finding(
            id="engine_imbalance",
            severity="warning",
            title=f"Engines out of balance: {name} generated {rank.ratio * 100:.0f} % of its peers' tokens for "
            f"{fmt_duration(rank.until - rank.since)} ({rank.tokens_per_second:,.0f} against "
            f"{rank.peer_tokens_per_second:,.0f} tokens/s){steps}: a slow rank",
            evidence={"engine": rank.engine[1], "model_name": rank.engine[0],
                      "share_of_peer_tokens_perc": round(rank.ratio, 3),
                      "generation_tokens_per_second": round(rank.tokens_per_second, 1),
                      "peer_generation_tokens_per_second": round(rank.peer_tokens_per_second, 1),
                      "engine_steps_per_second": None if rank.steps_per_second is None
                      else round(rank.steps_per_second, 1),
                      "peer_engine_steps_per_second": None if rank.peer_steps_per_second is None
                      else round(rank.peer_steps_per_second, 1)},
            checks=(
                f"Look at the device and host behind EngineCore_DP{rank.engine[1] or '0'}: clocks and throttling "
                "(nvidia-smi -q -d PERFORMANCE,CLOCK), ECC or Xid errors, a noisy neighbour on its CPU cores.",
                "vLLM's balancer evens out requests in flight, so the slow rank's requests just take longer: their "
                "users see the slow tail of TTFT and ITL.",
                "If one rank keeps lagging, take it out of service (fewer --data-parallel-size on healthy devices) "
                "rather than tune flags.",
            ),
            time_range=(rank.since, rank.until),
        ))
    return findings
