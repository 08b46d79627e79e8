"""Replay: a recording (an incident snapshot) shown with the same panels as the live page."""

import math
from datetime import datetime, timedelta

import streamlit as st

from diagnostics.core.metrics.derive import derive_state
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import TargetStatus
from diagnostics.core.text import md_escape
from diagnostics.errors import BadRecording
from diagnostics.ui import resources, state, widgets

widgets.page("Replay a recording")
upload = st.file_uploader(
    "Recording (.jsonl or .jsonl.gz, from `python -m diagnostics record` or Save snapshot)",
    type=["jsonl", "gz", "json"],
    key="replay_upload",
)
if upload is None:
    st.info("Upload a recording to see its time range with the live page's panels.")
    st.stop()
try:
    recording, scrapes = resources.parsed_recording(upload.getvalue())
except BadRecording as exc:
    st.error(f"This file is not a usable recording: {md_escape(exc)}")
    st.stop()
for problem in recording.problems[:5]:
    st.warning(f"Skipped {md_escape(problem)}")

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
shown = [s for s in scrapes if start - 0.5 <= s.ts <= end + 0.5]
ok = [s for s in shown if s.snapshot is not None]
failed = [s for s in shown if s.snapshot is None]
widgets.status_banner(
    TargetStatus(
        target=recording.target or "?",
        state="up" if shown and shown[-1].snapshot else "down",
        since=None,
        error=shown[-1].error if shown else None,
        last_ok_ts=ok[-1].ts if ok else None,
        last_attempt_ts=end,
        info=recording.info(),
        num_scrapes=len(shown),
        num_failures=len(failed),
    )
)
st.caption(
    f"{len(shown)} scrapes from {datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} to "
    f"{datetime.fromtimestamp(end):%H:%M:%S} · {len(failed)} failed"
)
derived = derive_state(shown, state.quantile_window_seconds())
widgets.config_card(recording.info(), derived.cache_config)
widgets.headline(derived)
widgets.panels(
    shown,
    window_seconds=end - start + 1,
    quantile_window_seconds=state.quantile_window_seconds(),
    max_num_seqs=state.max_num_seqs(),
    gpus=GpuReading.from_json(recording.records[-1].gpus),
    nvml_note="not in this recording",
    key="replay",
)
