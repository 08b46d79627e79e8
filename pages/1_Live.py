"""Live: the engine's state over time, refreshed from the shared collector (never one scrape per tab)."""

import time

import streamlit as st

from diagnostics.core.diagnosis.outcomes import window_outcomes
from diagnostics.core.metrics.derive import derive_state, window
from diagnostics.core.metrics.slo import slo_attainment
from diagnostics.recording import encode_recording
from diagnostics.ui import cards, charts, resources, shell, state

target = shell.page("Live")
if target is None:
    st.info("Pick a target in the sidebar first.")
    st.stop()


@st.fragment(run_every=state.refresh_seconds())
def live() -> None:
    collector = resources.source(target, ranged=True)
    status, history, gpus = collector.status(), collector.history(), collector.gpu_history()
    cards.status_banner(status)
    cards.headline(derive_state(history, state.quantile_window_seconds()), status, history)
    budgets, recent = state.budgets(), window(history, state.quantile_window_seconds())
    cards.slo_line(slo_attainment(recent, budgets.ttft_ms, budgets.itl_ms),
                   window_outcomes(recent, status.info.max_model_len if status.info else None))
    charts.panels(
        history,
        window_seconds=state.prom_range_seconds() if target.prometheus else state.window_seconds(),
        quantile_window_seconds=state.quantile_window_seconds(),
        max_num_seqs=state.max_num_seqs(),
        gpus=gpus[-1][1] if gpus else None,
        nvml_note=resources.nvml_note(),
        key="live",
        gpu_history=gpus,
    )
    cards.age_caption(history)


live()

st.divider()
minutes = st.select_slider("Save the last … minutes", options=[1, 5, 15], value=5, key=state.SNAPSHOT_MINUTES)
collector = resources.source(target)
st.download_button(
    "Save snapshot (.jsonl.gz)",
    data=lambda: encode_recording(collector.recent_records(minutes * 60)),
    file_name=f"vllm-snapshot-{time.strftime('%Y%m%d-%H%M%S')}.jsonl.gz",
    mime="application/gzip",
    on_click="ignore",
    help="A recording of the raw /metrics text: open it on the Replay page or with `python -m diagnostics`.",
)
