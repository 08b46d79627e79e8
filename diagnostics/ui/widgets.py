"""Reusable Streamlit widgets: the sidebar target picker, the status card, the chart panels.

Every string that came from a server goes through :func:`md_escape` before a Markdown-capable
element renders it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from diagnostics.core.figures.engines import ENGINE_PANELS, engine_names, engines_figure
from diagnostics.core.figures.live import (
    LATENCY_NAMES,
    gpu_memory_figure,
    kv_usage_figure,
    latency_figure,
    outcomes_figure,
    prefix_hit_figure,
    queue_figure,
    roofline_figure,
    spec_decode_figure,
    throughput_figure,
)
from diagnostics.core.hardware import peak_for
from diagnostics.core.metrics.catalog import CacheConfig
from diagnostics.core.metrics.derive import (
    DerivedState,
    Scrape,
    hit_rate_source,
    last_snapshot,
    prompt_sources,
    roofline,
    since_start,
    window,
)
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import ServerInfo, TargetStatus
from diagnostics.core.simulator.scenarios import SCENARIOS
from diagnostics.core.targets import PrometheusInstance, TargetsConfig, normalize_url
from diagnostics.core.text import (
    SLEEP_LEVELS,
    fmt_bytes,
    fmt_latency,
    fmt_optional,
    fmt_when,
    md_escape,
    prompt_sources_text,
    roofline_text,
)
from diagnostics.ui import fleet_view, resources, state


@dataclass(frozen=True, slots=True)
class Selected:
    url: str
    label: str
    api_key: str | None = field(default=None, repr=False)
    simulated: bool = False
    prometheus: PrometheusInstance | None = None


def _options(config: TargetsConfig) -> list[str]:
    """Configured targets first; the built-in simulation and a custom URL unless the deployment is
    locked to its list (``allow_custom_targets = false``)."""
    extra = [state.SIMULATED, state.CUSTOM] if config.allow_custom else []
    opened = _opened()
    return ([opened.label] if opened is not None else []) + [t.name for t in config.targets] + extra


def _opened() -> PrometheusInstance | None:
    """The instance last opened from the Fleet page, if any."""
    value = state.get(state.PROM_INSTANCE)
    return value if isinstance(value, PrometheusInstance) else None


PAGES = (
    ("app.py", "Overview", ":material/monitor_heart:"),
    ("pages/1_Live.py", "Live", ":material/show_chart:"),
    ("pages/2_Replay.py", "Replay a recording", ":material/history:"),
    ("pages/3_Diagnose.py", "Diagnose", ":material/troubleshoot:"),
    ("pages/4_PagedAttention.py", "PagedAttention", ":material/grid_view:"),
    ("pages/5_Capacity.py", "Capacity", ":material/calculate:"),
    ("pages/6_Fleet.py", "Fleet (Prometheus)", ":material/lan:"),
    ("pages/7_Probe.py", "Probe (verify under load)", ":material/speed:"),
)


def resolve(config: TargetsConfig) -> Selected | None:
    """The chosen target from session state, without drawing anything.

    Raises ``ValueError`` for a URL that cannot be used.
    """
    options = _options(config)
    if not options:
        return None
    choice = state.get(state.TARGET_NAME)
    if choice not in options:
        choice = options[0]
    if choice == state.SIMULATED:
        return Selected(resources.simulator().url, "simulated engine", None, simulated=True)
    opened = _opened()
    if opened is not None and choice == opened.label:
        return Selected(opened.instance, opened.label, None, prometheus=opened)
    if choice == state.CUSTOM:
        url = str(state.get(state.CUSTOM_URL) or "")
        if not url.strip():
            return None
        normal = normalize_url(url)
        typed = str(state.get(state.API_KEY) or "") or None
        # Only a key typed for this URL, or the configured key of a target at this very URL.
        return Selected(normal, normal, typed or config.key_for(normal))
    target = next(t for t in config.targets if t.name == choice)
    return Selected(normalize_url(target.url), target.name, target.api_key)


def _persisted(widget: Callable[..., Any], key: str, *args: Any, **kwargs: Any) -> Any:
    return widget(*args, key=state.widget_key(key), on_change=state.save, args=(key,), **kwargs)


def sidebar(config: TargetsConfig) -> Selected | None:
    """The target picker and view settings (drawn by every page); returns the chosen target."""
    sb = st.sidebar
    for path, label, icon in PAGES:
        sb.page_link(path, label=label, icon=icon)
    sb.header("Target")
    for problem in config.problems:
        sb.warning(md_escape(problem))
    options = _options(config)
    if not options:
        sb.error("No target configured and custom URLs are not allowed here.")
    elif len(options) > 1:
        if state.get(state.TARGET_NAME) not in options:
            st.session_state[state.TARGET_NAME] = options[0]
        _persisted(sb.selectbox, state.TARGET_NAME, "Server", options)
    if state.get(state.TARGET_NAME) == state.SIMULATED and state.SIMULATED in options:
        scenario_picker(sb)
    if state.CUSTOM in options and (len(options) == 1 or state.get(state.TARGET_NAME) == state.CUSTOM):
        _persisted(sb.text_input, state.CUSTOM_URL, "vLLM URL", placeholder="http://127.0.0.1:8000")
        _persisted(
            sb.text_input,
            state.API_KEY,
            "API key (optional)",
            type="password",
            help="Sent as a bearer token to this URL only; never shown or saved. A key configured for a "
            "listed target ($VLLM_API_KEY, secrets) is never sent to a URL typed here.",
        )
    try:
        selected = resolve(config)
    except ValueError as exc:
        sb.error(md_escape(exc))
        selected = None
    sb.header("View")
    _persisted(sb.select_slider, state.REFRESH_SECONDS, "Refresh every (s)", options=state.REFRESH_CHOICES)
    _persisted(sb.radio, state.WINDOW_SECONDS, "Time window", list(state.WINDOW_CHOICES), horizontal=True)
    _persisted(
        sb.radio,
        state.QUANTILE_WINDOW_SECONDS,
        "Percentile / rate window",
        list(state.QUANTILE_WINDOW_CHOICES),
        horizontal=True,
    )
    _persisted(
        sb.number_input,
        state.MAX_NUM_SEQS,
        "--max-num-seqs (to draw the cap)",
        min_value=0,
        max_value=100000,
        step=1,
        help="vLLM does not export it; 0 = unknown.",
    )
    return selected


def scenario_title(name: str) -> str:
    """A scenario's display name (module level: widget functions must pickle under AppTest)."""
    return SCENARIOS[name].title


def scenario_picker(container: Any) -> None:
    """Switch the simulated engine's scenario (it is shared by every viewer of this process)."""
    sim = resources.simulator().sim
    names = list(SCENARIOS)
    if st.session_state.get(state.SCENARIO) not in names:
        st.session_state[state.SCENARIO] = sim.scenario.name

    def switch() -> None:
        sim.set_scenario(st.session_state[state.SCENARIO])

    container.selectbox(
        "Scenario",
        names,
        key=state.SCENARIO,
        on_change=switch,
        format_func=scenario_title,
        help="Each scenario shows one symptom within a minute; the Diagnose page names its knob.",
    )
    container.caption(md_escape(SCENARIOS[sim.scenario.name].symptom))


def simulation_note(selected: Selected | None) -> None:
    if selected is not None and selected.simulated:
        scenario = resources.simulator().sim.scenario
        st.info(
            f"**Simulated engine** — not a real server. Scenario: {md_escape(scenario.title)} "
            f"({md_escape(scenario.symptom)}). Point the sidebar at a real `vllm serve` to triage it."
        )


def page(title: str, *, target_note: bool = True) -> Selected | None:
    """Every page starts here: wide layout, the sidebar, the title; returns the chosen target."""
    st.set_page_config(page_title=f"{title} · vLLM triage", page_icon="🩺", layout="wide")
    config = resources.targets_config()
    problem = fleet_view.adopt_link(config)
    if problem:
        st.error(md_escape(problem))
    selected = sidebar(config)
    st.title(title)
    if target_note:
        simulation_note(selected)
    return selected


STATE_TEXT = {
    "starting": ("info", "Connecting…"),
    "up": ("success", "Up"),
    "down": ("error", "Down"),
    "stale": ("warning", "Stale"),
    "not_vllm": ("error", "Not a vLLM server"),
}


def status_banner(status: TargetStatus) -> None:
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


def chart(build: Callable[[], go.Figure | None], key: str, empty: str) -> None:
    """A chart with a stable key, or its empty state; a chart that fails to build says so and
    leaves the rest of the page standing."""
    try:
        fig = build()
    except Exception as exc:  # noqa: BLE001 - one broken chart must not take the panel down
        st.error(f"This chart could not be drawn: {md_escape(type(exc).__name__)}: {md_escape(exc)}")
        return
    if fig is None:
        st.info(empty)
    else:
        st.plotly_chart(fig, key=key, config={"displaylogo": False})


def panels(
    history: Sequence[Scrape],
    *,
    window_seconds: float,
    quantile_window_seconds: float,
    max_num_seqs: int | None,
    gpus: GpuReading | None,
    nvml_note: str | None,
    key: str,
    end: float | None = None,
) -> None:
    """The live charts over ``window_seconds`` of history (``end`` defaults to the newest scrape)."""
    shown = window(history, window_seconds, end)
    last = last_snapshot(shown)
    config = last.snapshot.cache_config if last is not None and last.snapshot is not None else None
    if not shown:
        st.info("No scrape yet in this window.")
        return
    left, right = st.columns(2)
    with left:
        chart(lambda: kv_usage_figure(shown, config), f"{key}-kv", "This server exposes no KV-cache usage.")
    with right:
        chart(lambda: queue_figure(shown, max_num_seqs), f"{key}-queue", "No running/waiting gauges exposed.")
    left, right = st.columns(2)
    with left:
        chart(
            lambda: prefix_hit_figure(shown, quantile_window_seconds),
            f"{key}-prefix",
            "This server exposes no prefix-cache counters (V0, or prefix caching metrics absent).",
        )
        sources = prompt_sources_text(prompt_sources(window(shown, quantile_window_seconds)))
        st.caption(f"Hit rate: {md_escape(hit_rate_source(last.snapshot if last else None))}."
                   + (f" Prompt tokens over the last {quantile_window_seconds:g} s, at each request's first prefill: "
                      f"{md_escape(sources)}." if sources else ""))
    with right:
        chart(
            lambda: throughput_figure(shown), f"{key}-throughput", "No token counters yet (needs two scrapes)."
        )
    if last is not None and last.snapshot is not None and last.snapshot.has("spec_decode_num_drafts"):
        chart(partial(spec_decode_figure, shown, quantile_window_seconds), f"{key}-spec",
              "No draft token in this window.")
    roofline_panel(shown, quantile_window_seconds, gpus, key)
    engines_panel(shown, key)
    st.subheader("Latency")
    cols = st.columns(2)
    for i, concept in enumerate(LATENCY_NAMES):
        with cols[i % 2]:
            chart(
                partial(latency_figure, shown, concept, quantile_window_seconds),
                f"{key}-{concept}",
                f"No {LATENCY_NAMES[concept]} observed in this window (no request reached that point).",
            )
    left, right = st.columns(2)
    with left:
        chart(lambda: outcomes_figure(shown), f"{key}-outcomes", "No request finished in this window.")
    with right:
        if gpus is not None and gpus.devices:
            devices = gpus.devices
            chart(
                lambda: gpu_memory_figure(devices, config, last.snapshot if last else None),
                f"{key}-gpu",
                "No GPU reading.",
            )
        else:
            why = gpus.unavailable if gpus is not None and gpus.unavailable else nvml_note
            st.info(
                "GPU memory: not available here"
                + (f" ({md_escape(why)})" if why else "")
                + ". It is read with NVML when the dashboard runs on the GPU host; vLLM's /metrics has no "
                "GPU-memory metric."
            )


def roofline_panel(shown: Sequence[Scrape], window_seconds: float, gpus: GpuReading | None, key: str) -> None:
    """vLLM's estimate of the work per GPU, against the device's peaks when NVML names it."""
    last = last_snapshot(shown)
    if last is None or last.snapshot is None or not last.snapshot.has("estimated_flops_per_gpu"):
        return
    roof = roofline(window(shown, window_seconds))
    if roof is None:
        st.caption("Live roofline: off. vLLM estimates FLOP/s and memory traffic per GPU when the server runs with "
                   "`--enable-mfu-metrics` (its estimated_*_per_gpu counters stay 0 without it).")
        return
    peak = peak_for(gpus.devices[0].name) if gpus is not None and gpus.devices else None
    chart(partial(roofline_figure, shown, peak), f"{key}-roofline", "No work estimate in this window.")
    text = roofline_text(roof, peak)
    if text:
        st.caption(md_escape(text))


def engines_panel(shown: Sequence[Scrape], key: str) -> None:
    """Engines side by side, when the server runs more than one (``--data-parallel-size``)."""
    if len(engine_names(shown)) < 2:
        return
    st.subheader("Engines side by side")
    st.caption("One line per data-parallel engine. Judge an engine by its tokens: a rank whose tokens stop while "
               "its peers serve is hung (Diagnose names it), and the server totals above only drop by its share. "
               "Its gauges are what it last reported: they freeze when it stops. One rank queueing while another has "
               "room means requests are routed around vLLM's balancer (a sticky router); Diagnose names that too.")
    cols = st.columns(2)
    for i, (concept, title, unit, kind) in enumerate(ENGINE_PANELS):
        with cols[i % 2]:
            chart(partial(engines_figure, shown, concept, title, unit, kind), f"{key}-engines-{concept}",
                  f"No {title.lower()} in this window.")


def age_caption(history: Sequence[Scrape]) -> None:
    if history:
        st.caption(f"{len(history)} scrapes kept · newest {fmt_when(history[-1].ts, time.time())}")
