"""vLLM triage dashboard, the landing page: is the target up, the verdict (the worst finding, or
healthy), goodput against the budgets, what it is, the numbers to read first.

Run with ``streamlit run app.py``; the other views are in pages/ and share the sidebar.
"""

import streamlit as st

from diagnostics.core.diagnosis import diagnose, prepare
from diagnostics.core.diagnosis.outcomes import outcomes
from diagnostics.core.diagnosis.verdict import verdict
from diagnostics.core.metrics.derive import derive_state, window
from diagnostics.core.metrics.slo import slo_attainment
from diagnostics.ui import cards, resources, shell, state

target = shell.page("vLLM triage")
if target is None:
    st.info("Enter the URL of a running `vllm serve` in the sidebar (for example http://127.0.0.1:8000).")
    st.stop()


@st.fragment(run_every=state.refresh_seconds())
def overview() -> None:
    collector = resources.source(target)
    status, history = collector.status(), collector.history()
    cards.status_banner(status)
    seconds, budgets = state.quantile_window_seconds(), state.budgets()
    recent = window(history, seconds)
    # The verdict before any number: the worst finding of the recent window, or healthy; then goodput
    # and, beside it, the outcome shares the same diagnosis read.
    ctx = prepare(recent, info=status.info, budgets=budgets, max_num_seqs=state.max_num_seqs())
    cards.verdict_banner(verdict(diagnose(ctx)), seconds)
    derived = derive_state(history, seconds)
    cards.slo_line(slo_attainment(recent, budgets.ttft_ms, budgets.itl_ms), outcomes(ctx))
    st.subheader("Server")
    cards.config_card(status.info, derived.cache_config)
    st.subheader("Now")
    cards.headline(derived, status, history)
    cards.age_caption(history)


overview()
