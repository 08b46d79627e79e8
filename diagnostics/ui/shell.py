"""The page shell every page starts with: wide layout, the sidebar (page links, the target picker,
the view settings), the title, and the simulated engine's note.

Every string that came from a server goes through :func:`md_escape` before a Markdown-capable
element renders it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from diagnostics.core.simulator.scenarios import SCENARIOS
from diagnostics.core.targets import TargetsConfig, normalize_url
from diagnostics.core.text import fmt_when, md_escape
from diagnostics.sources.store import HistoryStore, StoreError
from diagnostics.ui import fleet_view, resources, state
from diagnostics.ui.targets import Selected, options, resolve

PAGES = (
    ("app.py", "Overview", ":material/monitor_heart:"),
    ("pages/1_Live.py", "Live", ":material/show_chart:"),
    ("pages/2_Replay.py", "Replay a recording", ":material/history:"),
    ("pages/3_Diagnose.py", "Diagnose", ":material/troubleshoot:"),
    ("pages/4_PagedAttention.py", "PagedAttention", ":material/grid_view:"),
    ("pages/5_Capacity.py", "Capacity", ":material/calculate:"),
    ("pages/6_Fleet.py", "Fleet", ":material/lan:"),
    ("pages/7_Probe.py", "Probe (verify under load)", ":material/speed:"),
)


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
    choices = options(config)
    if not choices:
        sb.error("No target configured and custom URLs are not allowed here.")
    elif len(choices) > 1:
        if state.get(state.TARGET_NAME) not in choices:
            st.session_state[state.TARGET_NAME] = choices[0]
        _persisted(sb.selectbox, state.TARGET_NAME, "Server", choices)
    if state.get(state.TARGET_NAME) == state.SIMULATED and state.SIMULATED in choices:
        scenario_picker(sb)
    if state.CUSTOM in choices and (len(choices) == 1 or state.get(state.TARGET_NAME) == state.CUSTOM):
        _persisted(sb.text_input, state.CUSTOM_URL, "vLLM URL", placeholder="http://127.0.0.1:8000")
        _persisted(
            sb.text_input,
            state.API_KEY,
            "API key (optional)",
            type="password",
            help="Sent as a bearer token to this URL only; never shown or saved. A key configured for a "
            "listed target ($VLLM_API_KEY, secrets) is never sent to a URL typed here.",
        )
        _persisted(
            sb.text_input,
            state.GPU_METRICS_URL,
            "GPU metrics URL (dcgm-exporter, optional)",
            placeholder="http://gpu-node:9400/metrics",
            help="NVIDIA dcgm-exporter's /metrics for this server's GPUs: utilisation, temperature, power, clocks, "
            "throttle reasons and memory when the dashboard is not on the GPU host (NVML is read otherwise).",
        )
    try:
        selected = resolve(config, lambda: resources.simulator().url)
    except ValueError as exc:
        sb.error(md_escape(exc))
        selected = None
    sb.header("View")
    _persisted(sb.select_slider, state.REFRESH_SECONDS, "Refresh every (s)", options=state.REFRESH_CHOICES)
    store = resources.store(selected.url if selected is not None and selected.prometheus is None else None)
    if selected is not None and selected.prometheus is not None:
        store = None
    stored = list(state.STORED_WINDOW_CHOICES) if store is not None else []
    _persisted(sb.radio, state.WINDOW_SECONDS, "Time window", list(state.WINDOW_CHOICES) + stored, horizontal=True,
               help="Past 1 h the pages read the history store (aggregates: each point the last value, "
               "counters' increases kept)." if stored else None)
    if store is not None:
        history_note(store, selected)
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
    for key, label in ((state.TTFT_BUDGET_MS, "TTFT budget, p95 (ms; 0 = none)"),
                       (state.ITL_BUDGET_MS, "ITL budget, p95 (ms; 0 = none)")):
        _persisted(sb.number_input, key, label, min_value=0.0, step=10.0,
                   help="The share of requests within it (goodput) is shown on Overview, Live and Fleet.")
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
    """Say plainly that the simulated engine is not a real server, and which scenario it plays."""
    if selected is not None and selected.simulated:
        scenario = resources.simulator().sim.scenario
        st.info(
            f"**Simulated engine** — not a real server. Scenario: {md_escape(scenario.title)} "
            f"({md_escape(scenario.symptom)}). Point the sidebar at a real `vllm serve` to triage it."
        )


def history_note(store: HistoryStore, selected: Selected | None) -> None:
    """How far back the history store reaches for this target, or why it is read-only."""
    if store.state.message:
        st.sidebar.warning(md_escape(store.state.message))
        return
    extent = None
    if selected is not None and selected.prometheus is None:
        try:
            extent = store.extent(normalize_url(selected.url))
        except (StoreError, ValueError):
            extent = None
    since = f"from {fmt_when(extent[0])}" if extent else "nothing of this target yet"
    st.sidebar.caption(md_escape(f"History store: {since} ({store.path})"))


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
