"""Replay: a recording (an incident snapshot) shown with the same panels as the live page."""

import math
from datetime import datetime, timedelta

import streamlit as st

from diagnostics.core.metrics.derive import derive_state
from diagnostics.core.text import md_escape
from diagnostics.errors import BadRecording
from diagnostics.ui import cards, charts, resources, shell, state

shell.page("Replay a recording")
upload = st.file_uploader(
    "Recording (.jsonl or .jsonl.gz, from `python -m diagnostics record` or Save snapshot)",
    type=["jsonl", "gz", "json"],
    key="replay_upload",
)
if upload is None:
    st.info("Upload a recording to see its time range with the live page's panels.")
    st.stop()
try:
    recording, replay = resources.parsed_recording(upload.getvalue())
except BadRecording as exc:
    st.error(f"This file is not a usable recording: {md_escape(exc)}")
    st.stop()
for problem in recording.problems[:5]:
    st.warning(f"Skipped {md_escape(problem)}")

scrapes = replay.history()
first, last = math.floor(scrapes[0].ts), math.ceil(scrapes[-1].ts)  # whole seconds: the slider steps by 1 s
start, end = first, last
if last - first >= 2:
    start_dt, end_dt = st.slider(
        "Time range",
        min_value=datetime.fromtimestamp(first),
        max_value=datetime.fromtimestamp(last),
        value=(datetime.fromtimestamp(first), datetime.fromtimestamp(last)),
        step=timedelta(seconds=1),
        format="HH:mm:ss",
        key="replay_range",
    )
    start, end = start_dt.timestamp(), end_dt.timestamp()
shown = replay.between(start - 0.5, end + 0.5)
status = shown.status()
cards.status_banner(status)
st.caption(
    f"{status.num_scrapes} scrapes from {datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} to "
    f"{datetime.fromtimestamp(end):%H:%M:%S} · {status.num_failures} failed"
)
derived = derive_state(shown.history(), state.quantile_window_seconds())
cards.config_card(status.info, derived.cache_config)
cards.headline(derived)
gpus = shown.gpu_history()
charts.panels(
    shown.history(),
    window_seconds=end - start + 1,
    quantile_window_seconds=state.quantile_window_seconds(),
    max_num_seqs=state.max_num_seqs(),
    gpus=gpus[-1][1] if gpus else None,
    nvml_note="not in this recording",
    key="replay",
    gpu_history=gpus,
)
