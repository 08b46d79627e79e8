"""The data-access seam: the only place pages get collectors and parsed recordings from.

Collectors come from :func:`diagnostics.collector.shared_collector`, the process-wide registry
(one per target, restarted if stopped), so ten browser tabs share one scrape per interval.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any, Protocol

import streamlit as st

from diagnostics.collector import Collector, history_store, shared_collector
from diagnostics.core.fleet.promql import Scope
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.history import HistorySource, Replay
from diagnostics.core.targets import TargetsConfig, targets_from
from diagnostics.prometheus_fleet import PrometheusTarget
from diagnostics.recording import Record, Recording, read_recording
from diagnostics.sim.server import SimServer
from diagnostics.sources import nvml
from diagnostics.sources.prometheus import PrometheusClient
from diagnostics.sources.store import HistoryStore, StoredTarget
from diagnostics.ui import state
from diagnostics.ui.targets import Selected


class TargetSource(HistorySource, Protocol):
    """A target's history that can also be saved: its last seconds as recording records (the
    shared collector, or an instance read through Prometheus)."""

    def recent_records(self, seconds: float | None = None) -> list[Record]:
        """The scrapes of the last ``seconds`` (all kept when None), as a recording's records."""
        ...


@st.cache_resource(show_spinner=False)
def simulator() -> SimServer:
    """The embedded simulated vLLM server: started once per process on a free loopback port."""
    return SimServer("healthy").start()


@st.cache_resource(show_spinner=False)
def _nvml_reader() -> tuple[Callable[[], GpuReading] | None, str | None]:
    return nvml.probe()


def nvml_note() -> str | None:
    """Why GPU memory cannot be shown here (None when NVML works)."""
    return _nvml_reader()[1]


def collector(url: str, api_key: str | None, gpu_metrics_url: str | None = None) -> Collector:
    """The shared collector for a target (started on first use, restarted if it was stopped); GPU
    health from the dcgm-exporter at ``gpu_metrics_url`` when given, NVML otherwise."""
    return shared_collector(url, api_key, gpu_reader=_nvml_reader()[0], gpu_metrics_url=gpu_metrics_url)


def source(target: Selected, *, ranged: bool = False) -> TargetSource:
    """Where a page reads a target's history: its shared collector, or Prometheus for an instance
    opened from the Fleet page (re-read at most once per refresh; a failed read keeps the last).
    ``ranged`` (Live, Diagnose): a sidebar window past the collector's hour reads the history store."""
    if target.prometheus is None:
        live = collector(target.url, target.api_key, target.gpu_metrics_url)
        seconds = state.window_seconds()
        store = history_store(live.target)
        if ranged and store is not None and seconds > live.retention_seconds:
            return _stored_target(live.target, seconds, max(1.0, state.refresh_seconds() - 0.5), str(store.path), store)
        return live
    ref = target.prometheus
    prom = _prometheus_target(ref.url, ref.selector, ref.instance, ref.model, state.prom_range_seconds())
    prom.refresh_if_older(max(1.0, state.refresh_seconds() - 0.5))
    return prom


@st.cache_resource(show_spinner=False, max_entries=16)
def _stored_target(url: str, range_s: int, refresh_s: float, path: str, _store: HistoryStore) -> StoredTarget:
    """One per target, range and store file (``_store`` is not hashed: the path names it)."""
    return StoredTarget(_store, url, range_s=range_s, refresh_seconds=refresh_s)


def is_stored(source: object) -> bool:
    """Whether a page's source is a range read from the history store."""
    return isinstance(source, StoredTarget)


def store(url: str | None = None) -> HistoryStore | None:
    """The history store serve opened (None: history is off, this is not serve, or — given ``url`` —
    it does not keep that target)."""
    return history_store(url)


@st.cache_resource(show_spinner=False, max_entries=16)
def _prometheus_target(url: str, selector: str, instance: str, model: str | None, range_s: int) -> PrometheusTarget:
    return PrometheusTarget(prometheus_client(url), Scope(selector, instance), range_s=range_s, model=model)


@st.cache_resource(show_spinner=False, max_entries=8)
def prometheus_client(url: str) -> PrometheusClient:
    """One client per Prometheus per process (it caches the scrape interval)."""
    return PrometheusClient(url, timeout_seconds=10.0)


def targets_config() -> TargetsConfig:
    try:
        secrets: Any = dict(st.secrets)
    except Exception:  # noqa: BLE001 - no secrets.toml is the normal case
        secrets = {}
    return targets_from(secrets, os.environ)


@st.cache_resource(show_spinner=False, max_entries=4)
def _parsed(digest: str, _data: bytes) -> tuple[Recording, Replay]:
    recording = read_recording(_data)
    return recording, recording.replay()


def parsed_recording(data: bytes) -> tuple[Recording, Replay]:
    """An uploaded recording (for what was skipped in it) and its replay, parsed once per distinct
    file (raises ``BadRecording``)."""
    return _parsed(hashlib.sha256(data).hexdigest(), data)
