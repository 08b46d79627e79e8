"""The cards a page reads first: the target's state, what the server is, the headline numbers.

Every string that came from a server goes through :func:`md_escape` before a Markdown-capable
element renders it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import streamlit as st

from diagnostics.core.diagnosis.outcomes import Outcomes
from diagnostics.core.diagnosis.verdict import Verdict
from diagnostics.core.metrics.catalog import CacheConfig
from diagnostics.core.metrics.derive import DerivedState, Scrape, last_snapshot, since_start
from diagnostics.core.metrics.info import ServerInfo, TargetStatus
from diagnostics.core.metrics.slo import SloAttainment
from diagnostics.core.text import (
    SLEEP_LEVELS,
    fmt_bytes,
    fmt_latency,
    fmt_optional,
    fmt_share_perc,
    fmt_when,
    md_escape,
    outcome_shares_text,
)

STATE_TEXT = {
    "starting": ("info", "Connecting…"),
    "up": ("success", "Up"),
    "down": ("error", "Down"),
    "stale": ("warning", "Stale"),
    "not_vllm": ("error", "Not a vLLM server"),
}


def status_banner(status: TargetStatus) -> None:
    """Up, down, stale or not vLLM, since when, the last good scrape and the error."""
    kind, text = STATE_TEXT[status.state]
    line = f"**{text}** · `{status.target.replace('`', '')}`"
    if status.state in ("down", "stale", "not_vllm") and status.since is not None:
        line += f" · since {fmt_when(status.since)}"
    if status.state in ("down", "stale", "not_vllm") and status.last_ok_ts is not None:
        line += f" · last good scrape {fmt_when(status.last_ok_ts)}"
    if status.error:
        line += f"  \n{md_escape(status.error)}"
    getattr(st, kind)(line)
    if status.info_error:
        st.warning(f"Server info unavailable: {md_escape(status.info_error)}")


def verdict_banner(v: Verdict, window_seconds: float) -> None:
    """The verdict before any number: the worst finding's title, or healthy."""
    more = f" (+{v.num_findings - 1} more on Diagnose)" if v.num_findings > 1 else ""
    line = f"**{md_escape(v.title)}**{more} · last {window_seconds:g} s"
    {"critical": st.error, "warning": st.warning}.get(v.severity or "", st.success)(line)


def slo_line(slo: SloAttainment | None, outcomes: Outcomes) -> None:
    """Goodput against the sidebar's budgets, with the buckets' honesty; beside it the shares of
    requests that failed, were refused with a 4xx or were given up (the outcome rules' own reading),
    their counts in the caption under them."""
    cols = st.columns(6 if slo is not None else 3)
    if slo is not None:
        good = slo.goodput_at_least
        cols[0].metric("Goodput (within budgets)", "—" if good is None else f"≥ {good * 100:.1f} %")
        cols[1].metric("Within TTFT budget", _share(slo.ttft.share_at_least if slo.ttft else None, slo.ttft is not None))
        cols[2].metric("Within ITL budget", _share(slo.itl.share_at_least if slo.itl else None, slo.itl is not None))
    first = 3 if slo is not None else 0
    cols[first].metric("Failed", fmt_share_perc(outcomes.failed_share),
                       help="Finished with an engine error or answered HTTP 5xx (not the admission limits' 503s), of "
                       "every request answered")
    cols[first + 1].metric("Rejected (4xx)", fmt_share_perc(outcomes.rejected_share),
                           help="Refused with HTTP 4xx before the engine saw them (http_requests_total), of every "
                           "request answered")
    cols[first + 2].metric("Given up", fmt_share_perc(outcomes.gave_up_share),
                           help="2xx answers the engine never finished (clients that disconnected), of the 2xx answers")
    if slo is None:
        st.caption("Set a TTFT or ITL budget in the sidebar to see the share of requests within it (goodput).")
    else:
        st.caption(md_escape(slo.text()))
    st.caption(md_escape(outcome_shares_text(outcomes)))


def _share(value: float | None, judged: bool) -> str:
    return "no budget" if not judged else "—" if value is None else f"≥ {value * 100:.1f} %"


def config_card(info: ServerInfo | None, config: CacheConfig | None) -> None:
    """What this server is: version, model and cache configuration."""
    cols = st.columns(4)
    cols[0].metric("vLLM version", md_escape(fmt_optional(info.version if info else None)))
    cols[1].metric("Model", md_escape(fmt_optional(info.model if info else None)))
    cols[2].metric("max_model_len", fmt_optional(info.max_model_len if info else None))
    cols[3].metric("Block size", fmt_optional(config.block_size if config else None, " tokens"))
    cols = st.columns(4)
    cols[0].metric("num_gpu_blocks", f"{config.num_gpu_blocks:,}" if config and config.num_gpu_blocks else "—")
    cols[1].metric("Prefix caching", fmt_optional(config.enable_prefix_caching if config else None))
    cols[2].metric("Cache dtype", md_escape(fmt_optional(config.cache_dtype if config else None)))
    cols[3].metric("gpu_memory_utilization", fmt_optional(config.gpu_memory_utilization if config else None))
    if config is not None and (config.kv_cache_memory_bytes or config.kv_cache_size_tokens):
        st.caption(
            f"KV pool {fmt_bytes(config.kv_cache_memory_bytes)} · "
            f"{config.kv_cache_size_tokens or 0:,} tokens · "
            f"max concurrency at max_model_len {fmt_optional(config.kv_cache_max_concurrency, '×')}"
        )


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _num(value: float | None, suffix: str = "") -> str:
    return "—" if value is None else f"{value:,.0f}{suffix}"


def headline(derived: DerivedState, status: TargetStatus | None = None, history: Sequence[Scrape] = ()) -> None:
    """The numbers an on-call engineer reads first (the last known ones while the target is down).

    Until the dashboard has watched a whole rate window, the latest scrape (in ``history``) also
    shows the server's counters since it started, labelled as such."""
    if status is not None and status.state in ("down", "stale", "not_vllm") and derived.ts is not None:
        st.caption(f"Last known values, from the scrape at {fmt_when(derived.ts)}.")
    if derived.asleep:
        engines = ", ".join(f"engine {md_escape(e)} ({md_escape(SLEEP_LEVELS.get(level, level))})"
                            for e, level in sorted(derived.asleep.items()))
        st.error(f"**Asleep:** {engines}. It serves nothing until woken (POST /wake_up); see Diagnose.")
    cols = st.columns(6)
    cols[0].metric("KV cache used", _pct(derived.kv_cache_usage_perc))
    cols[1].metric("Running", _num(derived.num_requests_running))
    cols[2].metric("Waiting", _num(derived.num_requests_waiting))
    cols[3].metric(f"Prefix hit rate ({derived.window_seconds:g} s)", _pct(derived.prefix_cache_hit_rate))
    cols[4].metric("TTFT p95", fmt_latency(derived.quantile("time_to_first_token_seconds", 0.95)))
    cols[5].metric("ITL p95", fmt_latency(derived.quantile("inter_token_latency_seconds", 0.95)))
    cols = st.columns(6)
    cols[0].metric("Generation tok/s", _num(derived.generation_tokens_rate))
    cols[1].metric("Prompt tok/s", _num(derived.prompt_tokens_rate))
    rate = derived.num_preemptions_rate
    cols[2].metric("Preemptions /min", "—" if rate is None else f"{rate * 60:,.1f}")
    cols[3].metric("e2e p95", fmt_latency(derived.quantile("e2e_request_latency_seconds", 0.95)))
    cols[4].metric("Queue time p95", fmt_latency(derived.quantile("request_queue_time_seconds", 0.95)))
    blocks = derived.kv_cache_used_blocks
    cols[5].metric("KV blocks used", _num(blocks))
    latest = last_snapshot(history)
    watched = history[-1].ts - history[0].ts if history else 0.0
    if latest is not None and latest.snapshot is not None and watched < derived.window_seconds:
        lifetime = since_start(latest.snapshot)
        started = f"started {fmt_when(lifetime.started_at)}" if lifetime.started_at else "start time not exported"
        st.caption(f"Since the server started ({started}), from its own counters — this dashboard has watched "
                   f"for {watched:.0f} s of the {derived.window_seconds:g} s window:")
        cols = st.columns(6)
        cols[0].metric("Preemptions (since start)", _num(lifetime.num_preemptions))
        cols[1].metric("Prefix hit rate (since start)", _pct(lifetime.prefix_cache_hit_rate))
        reasons = sorted(((r, c) for r, c in (lifetime.requests_finished or {}).items() if c > 0),
                         key=lambda rc: -rc[1])  # the most common first: usually "stop"
        for i, (reason, count) in enumerate(reasons[:4]):
            cols[2 + i].metric(f"Finished: {reason} (since start)", _num(count))


def age_caption(history: Sequence[Scrape]) -> None:
    """How many scrapes are kept and how old the newest is."""
    if history:
        st.caption(f"{len(history)} scrapes kept · newest {fmt_when(history[-1].ts, time.time())}")
