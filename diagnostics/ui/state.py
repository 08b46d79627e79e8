"""Typed session-state accessors: every key is spelled here and nowhere else."""

from __future__ import annotations

import streamlit as st

from diagnostics.core.diagnosis.types import Budgets

TARGET_NAME = "target_name"
CUSTOM_URL = "custom_url"
API_KEY = "api_key_input"
GPU_METRICS_URL = "gpu_metrics_url"
REFRESH_SECONDS = "refresh_seconds"
WINDOW_SECONDS = "window_seconds"
QUANTILE_WINDOW_SECONDS = "quantile_window_seconds"
MAX_NUM_SEQS = "max_num_seqs"
TTFT_BUDGET_MS = "ttft_budget_ms"  # the latency budgets goodput is judged against (0 = none)
ITL_BUDGET_MS = "itl_budget_ms"
SNAPSHOT_MINUTES = "snapshot_minutes"
PROM_URL = "prometheus_url"
PROM_SELECTOR = "prometheus_selector"
PROM_RANGE = "prometheus_range"
PROM_STEP = "prometheus_step"
PROM_INSTANCE = "prometheus_instance"  # (url, selector, instance, model) opened from the Fleet page
FLEET_LAST = "fleet_last_report"  # the last report that came back: kept while Prometheus is away
FLEET_SOURCE = "fleet_source"  # the Fleet page reads the configured targets directly, or a Prometheus
DIRECT_RANGE = "direct_range"  # the Fleet page's range over the direct targets' collectors

CUSTOM = "custom URL…"
SIMULATED = "simulated engine (demo)"
SCENARIO = "sim_scenario"
REFRESH_CHOICES = (1, 2, 5, 10)
WINDOW_CHOICES = {"5 min": 300, "15 min": 900, "1 h": 3600}
# Past the collector's hour, read from the history store (when serve opened one).
STORED_WINDOW_CHOICES = {"6 h": 21600, "1 day": 86400, "7 days": 604800, "30 days": 2592000}
QUANTILE_WINDOW_CHOICES = {"30 s": 30, "60 s": 60, "5 min": 300}
PROM_RANGE_CHOICES = {"15 min": 900, "1 h": 3600, "6 h": 21600, "1 day": 86400, "7 days": 604800}
PROM_STEP_CHOICES = {"auto": 0, "15 s": 15, "1 min": 60, "5 min": 300}
DIRECT_RANGE_CHOICES = {"1 min": 60, "5 min": 300, "15 min": 900, "1 h": 3600}  # a collector keeps the last hour


DEFAULTS: dict[str, object] = {
    TARGET_NAME: None,
    CUSTOM_URL: "",
    API_KEY: "",
    GPU_METRICS_URL: "",
    REFRESH_SECONDS: 2,
    WINDOW_SECONDS: "15 min",
    QUANTILE_WINDOW_SECONDS: "60 s",
    MAX_NUM_SEQS: 0,
    TTFT_BUDGET_MS: 0.0,
    ITL_BUDGET_MS: 0.0,
    PROM_URL: "",
    PROM_SELECTOR: "",
    PROM_RANGE: "15 min",
    PROM_STEP: "auto",
    DIRECT_RANGE: "5 min",
}


def widget_key(key: str) -> str:
    """The widget's own key for a setting that must survive page switches.

    Streamlit drops a widget's state when a page without it runs; the value lives under ``key``
    and is copied into the widget before it is drawn (and back by :func:`save`).
    """
    wkey = "_w_" + key
    if key not in st.session_state:
        st.session_state[key] = DEFAULTS.get(key)
    if st.session_state[key] is not None:
        st.session_state[wkey] = st.session_state[key]
    return wkey


def save(key: str) -> None:
    st.session_state[key] = st.session_state.get("_w_" + key)


def get(key: str) -> object:
    return st.session_state.get(key, DEFAULTS.get(key))


def refresh_seconds() -> int:
    return int(get(REFRESH_SECONDS) or 2)  # type: ignore[call-overload]


def window_seconds() -> int:
    chosen = str(get(WINDOW_SECONDS))
    return WINDOW_CHOICES.get(chosen) or STORED_WINDOW_CHOICES.get(chosen, 900)


def quantile_window_seconds() -> int:
    return QUANTILE_WINDOW_CHOICES.get(str(get(QUANTILE_WINDOW_SECONDS)), 60)


def max_num_seqs() -> int | None:
    value = get(MAX_NUM_SEQS)
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def prom_range_seconds() -> int:
    return PROM_RANGE_CHOICES.get(str(get(PROM_RANGE)), 900)


def direct_range_seconds() -> int:
    return DIRECT_RANGE_CHOICES.get(str(get(DIRECT_RANGE)), 300)


def prom_step_seconds() -> int:
    return PROM_STEP_CHOICES.get(str(get(PROM_STEP)), 0)


def budgets() -> Budgets:
    """The sidebar's latency budgets (0 = not judged)."""
    def ms(key: str) -> float | None:
        value = get(key)
        return float(value) if isinstance(value, (int, float)) and value > 0 else None
    return Budgets(ttft_ms=ms(TTFT_BUDGET_MS), itl_ms=ms(ITL_BUDGET_MS))
