"""vLLM triage dashboard, the landing page: is the target up, what is it, the numbers to read first.

Run with ``streamlit run app.py``; the other views are in pages/ and share the sidebar.
"""

import streamlit as st

from diagnostics.core.metrics.derive import derive_state
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
    derived = derive_state(history, state.quantile_window_seconds())
    st.subheader("Server")
    cards.config_card(status.info, derived.cache_config)
    st.subheader("Now")
    cards.headline(derived, status, history)
    cards.age_caption(history)


overview()
