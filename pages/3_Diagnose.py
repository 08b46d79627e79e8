"""Diagnose: observed symptoms → the knob table → concrete `vllm serve` changes, with evidence."""

import streamlit as st

from diagnostics.core.diagnosis import Budgets, diagnose, exit_code, prepare
from diagnostics.core.diagnosis.outcomes import outcomes
from diagnostics.core.metrics.derive import window
from diagnostics.core.text import md_escape
from diagnostics.errors import BadRecording
from diagnostics.ui import findings as cards
from diagnostics.ui import resources, shell, state

target = shell.page("Diagnose")
source = st.radio(
    "Diagnose", ["the live target", "a recording", "a startup log only"], horizontal=True, key="diagnose_source"
)
c1, c2, c3 = st.columns(3)
itl = c1.number_input("ITL budget, p95 (ms; 0 = none)", min_value=0.0, value=0.0, step=5.0, key="diag_itl")
ttft = c2.number_input("TTFT budget, p95 (ms; 0 = none)", min_value=0.0, value=0.0, step=50.0, key="diag_ttft")
minutes = c3.select_slider("Window (live)", options=[1, 5, 15, 60], value=5, key="diag_minutes")
with st.expander("Startup log (optional): paste the server's log to diagnose a failed start"):
    log_text = st.text_area("Log text", key="diag_log", height=150) or None

history, info, gpus = [], None, []
if source == "the live target":
    if target is None:
        st.info("Pick a target in the sidebar first.")
        st.stop()
    collector = resources.source(target, ranged=True)
    if target.prometheus is not None or resources.is_stored(collector):
        # Read through Prometheus or the history store: the window is the range chosen (hours back).
        history, info, gpus = collector.history(), collector.status().info, collector.gpu_history()
        st.caption(f"Window: the sidebar's {state.get(state.WINDOW_SECONDS)} read from the history store."
                   if target.prometheus is None else
                   f"Window: the Fleet page's range ({state.get(state.PROM_RANGE)}) read from Prometheus.")
    else:
        history, info = window(collector.history(), minutes * 60), collector.status().info
        gpus = [g for g in collector.gpu_history() if history and g[0] >= history[0].ts]
elif source == "a recording":
    upload = st.file_uploader("Recording (.jsonl / .jsonl.gz)", type=["jsonl", "gz", "json"], key="diag_upload")
    if upload is not None:
        try:
            _, replay = resources.parsed_recording(upload.getvalue())
            history, info, gpus = replay.history(), replay.status().info, replay.gpu_history()
        except BadRecording as exc:
            st.error(f"This file is not a usable recording: {md_escape(exc)}")
elif not log_text:
    st.info("Paste a startup log above.")

ctx = prepare(history, info=info, budgets=Budgets(ttft_ms=ttft or None, itl_ms=itl or None), log_text=log_text,
              gpus=gpus, max_num_seqs=state.max_num_seqs())
found = diagnose(ctx)
replay_error = None
if history and st.toggle("Predict the effect of each change (the simulated engine replays this window)", value=True,
                         key="diag_predict"):
    found_predicted, replay_error, why = cards.with_predictions(found, history, ctx.flags,
                                                                live=source == "the live target")
    found = list(found_predicted)
verdict = {0: ("success", "No warning"), 1: ("warning", "Warnings"), 2: ("error", "Critical")}[exit_code(found)]
getattr(st, verdict[0])(f"**{verdict[1]}** · {len(found)} findings over {len(history)} scrapes")
if history and exit_code(found) == 0:
    st.caption(f"Outcomes: {outcomes(ctx).says()}")  # what the quiet verdict looked at
if history:
    with st.expander("Find a change that meets the budget (the simulated engine searches the modelled flags)",
                     expanded=bool(st.session_state.get("diag_goal_asked"))):
        keep = st.checkbox("Keep throughput (output tokens/s within 5 %)", value=True, key="diag_goal_keep")
        if st.button("Find a change that meets the budget", key="diag_goal") or st.session_state.get("diag_goal_asked"):
            st.session_state["diag_goal_asked"] = True
            cards.goal_seek(history, ctx.flags, cards.budget_goals(itl, ttft), keep)
for i, finding in enumerate(found):
    cards.finding_card(finding, history, ctx.flags, key=f"finding-{i}", replay_error=replay_error)
st.subheader("Knob table")
cards.knob_table(found, key="knobs")
