"""The Probe page's pieces: the running probe and past results in the session, the latency table
(client beside server), the distributions and the engine's charts over the probe's window."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd
import streamlit as st

from diagnostics.core.figures.live import kv_usage_figure, queue_figure, throughput_figure
from diagnostics.core.figures.probe import distribution_figure, mark_span
from diagnostics.core.metrics.derive import Quantile, Scrape
from diagnostics.core.metrics.history import HistorySource
from diagnostics.core.probe import SETTLE_SECONDS, ProbeSpec, ProbeSummary, with_server
from diagnostics.core.text import fmt_seconds_as_ms
from diagnostics.sources.probe_http import Probe

RUNNING = "probe_running"
RESULTS = "probe_results"  # the session's runs (ProbeRun), oldest first
RUN_COUNTER = "probe_run_counter"  # runs are numbered for the session: #3 stays #3 when #1 is dropped
KEEP = 10


@dataclass(frozen=True, slots=True)
class ProbeRun:
    """One finished probe of this session, numbered."""

    number: int
    summary: ProbeSummary

    def to_json(self) -> dict[str, Any]:
        """The downloaded result: the ``probe --json`` object and the run's number."""
        return {**self.summary.to_json(), "run": self.number}


def running() -> Probe | None:
    probe = st.session_state.get(RUNNING)
    return probe if isinstance(probe, Probe) else None


def results() -> list[ProbeRun]:
    return list(st.session_state.get(RESULTS, []))


def start(url: str, spec: ProbeSpec, api_key: str | None, source: HistorySource) -> Probe:
    """Start a probe (the target's collector is already scraping: ``source``)."""
    source.history()  # the collector runs from before the first request
    probe = Probe(url, spec, api_key).start()
    st.session_state[RUNNING] = probe
    return probe


def finish(source: HistorySource) -> None:
    """A probe that ended: its summary, with the server's side, joins the session's results. The
    last scrape after the probe may be a moment away; the window ends at the newest one there is."""
    probe = running()
    if probe is None:
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not _scraped_after(source.history(), (probe.ended or 0) + SETTLE_SECONDS):
        time.sleep(0.25)
    number = st.session_state[RUN_COUNTER] = int(st.session_state.get(RUN_COUNTER, 0)) + 1
    run = ProbeRun(number, with_server(probe.summary(), source.history()))
    st.session_state[RESULTS] = (results() + [run])[-KEEP:]
    del st.session_state[RUNNING]


def _scraped_after(history: Sequence[Scrape], ts: float) -> bool:
    return any(s.ts >= ts and s.snapshot is not None for s in history[-5:])


def label(run: ProbeRun) -> str:
    summary = run.summary
    # Stable across reruns (a selectbox's options must not change under it): the clock time only.
    clock = datetime.fromtimestamp(summary.started).strftime("%H:%M:%S")
    return f"#{run.number} · {clock} · {summary.spec.concurrency} clients × {len(summary.results)} requests"


def _ms(value: float | None) -> str:
    return "—" if value is None else fmt_seconds_as_ms(value)


def _server(bucket: Quantile | None) -> str:
    if bucket is None:
        return "—"
    if bucket.bound == "below":
        return f"< {_ms(bucket.upper)}"
    if bucket.bound == "above":
        return f"> {_ms(bucket.lower)}"
    return f"{_ms(bucket.value)} ({_ms(bucket.lower)}–{_ms(bucket.upper)})"


def latency_table(summary: ProbeSummary) -> pd.DataFrame:
    """Client-side percentiles beside the server histograms' (with their bucket)."""
    return pd.DataFrame([{"metric": row.name, "clients": _ms(row.client), "server": _server(row.server)}
                         for row in summary.latency_rows()])


def distributions(summary: ProbeSummary) -> None:
    """Each latency's samples as the clients measured them."""
    cols = st.columns(3)
    for col, (key, title, samples) in zip(cols, (
        ("ttft", "Time to first token", summary.ttft_samples()),
        ("itl", "Inter-token gaps", summary.itl_samples()),
        ("e2e", "End-to-end latency", summary.e2e_samples()),
    ), strict=True):
        fig = distribution_figure(f"{title} (clients)", {title: samples})
        with col:
            if fig is None:
                st.caption(f"{title}: no samples.")
            else:
                st.plotly_chart(fig, use_container_width=True, key=f"probe-dist-{key}")


def charts_over(source: HistorySource, start: float, end: float | None, key: str) -> None:
    """KV usage, queue depth and throughput from 30 s before the probe to 15 s after it, the probe's
    run shaded."""
    history = source.history()
    stop = (end or time.time()) + 15
    window = [s for s in history if start - 30 <= s.ts <= stop]
    builders = (
        ("kv", lambda: kv_usage_figure(window, _config(window))),
        ("queue", lambda: queue_figure(window, None)),
        ("throughput", lambda: throughput_figure(window)),
    )
    cols = st.columns(3)
    for col, (name, build) in zip(cols, builders, strict=True):
        fig = build()
        with col:
            if fig is None:
                st.caption("no data yet")
                continue
            mark_span(fig, start, end or time.time(), "probe")
            st.plotly_chart(fig, use_container_width=True, key=f"probe-{key}-{name}")


def _config(window: Sequence[Scrape]) -> Any:
    last = next((s.snapshot for s in reversed(window) if s.snapshot is not None), None)
    return None if last is None else last.cache_config


def comparison_frame(rows: list[tuple[str, float | None, float | None, str]]) -> pd.DataFrame:
    def show(name: str, v: float | None) -> str:
        if v is None:
            return "—"
        return _ms(v) if name.endswith("(s)") else f"{v:.2f}"

    return pd.DataFrame(
        [{"metric": n.replace(" (s)", ""), "before": show(n, a), "after": show(n, b), "change": c} for n, a, b, c in rows]
    )
