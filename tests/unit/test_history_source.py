"""Pages and the CLI read a target through :class:`HistorySource`: the live collector, an instance
read through Prometheus and a recording's replay all are one (mypy checks the signatures where
``diagnostics.cli.window.source`` returns each as a ``HistorySource``; this checks it at run time),
and a replay's status is what its last scrape says."""

from __future__ import annotations

import json

from diagnostics.collector import Collector
from diagnostics.core.fleet.promql import Scope
from diagnostics.core.metrics.history import HistorySource, Replay
from diagnostics.prometheus_fleet import PrometheusTarget
from diagnostics.recording import Record, read_lines, read_recording
from diagnostics.sources.prometheus import PrometheusClient
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import FIXTURES, fixture_text

GPU = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_used_bytes": 70_000_000_000,
       "memory_total_bytes": 80_000_000_000}


def test_the_collector_prometheus_and_a_replay_are_history_sources() -> None:
    collector = Collector(VllmClient("http://127.0.0.1:1"))
    prometheus = PrometheusTarget(PrometheusClient("http://127.0.0.1:1"), Scope("", "vllm-0:8000"), range_s=900)
    replay = read_recording(FIXTURES / "recording-tiny-burst-0.32.0.jsonl.gz").replay()
    for source in (collector, prometheus, replay):
        assert isinstance(source, HistorySource), type(source).__name__


def test_a_value_without_gpu_history_is_not_one() -> None:
    class HistoryOnly:
        def history(self) -> list[object]:
            return []

        def status(self) -> None:
            return None

    assert not isinstance(HistoryOnly(), HistorySource)


def _recording_ending_down() -> Replay:
    info = {"version": {"version": "0.32.0"}, "models": json.loads(fixture_text("models-0.32.0.json"))}
    lines = [
        Record(10.0, "http://h:8000", metrics=fixture_text("metrics-0.32.0-idle.txt"), info=info, gpus=[GPU]),
        Record(11.0, "http://h:8000", metrics=fixture_text("metrics-0.32.0-idle.txt"), gpus=[GPU]),
        Record(12.0, "http://h:8000", error="cannot reach http://h:8000: connection refused"),
    ]
    return read_lines(r.to_json() for r in lines).replay()


def test_a_replay_is_down_when_its_last_scrape_failed() -> None:
    status = _recording_ending_down().status()
    assert (status.target, status.state, status.error) == ("http://h:8000", "down",
                                                           "cannot reach http://h:8000: connection refused")
    assert (status.last_ok_ts, status.last_attempt_ts, status.num_scrapes, status.num_failures) == (11.0, 12.0, 3, 1)
    assert status.info is not None and (status.info.version, status.info.model) == ("0.32.0", "tiny")


def test_a_slice_of_a_replay_keeps_its_scrapes_and_gpu_readings_only() -> None:
    replay = _recording_ending_down()
    assert [ts for ts, _ in replay.gpu_history()] == [10.0, 11.0]
    first = replay.between(10.0, 10.5)
    assert [s.ts for s in first.history()] == [10.0] and [ts for ts, _ in first.gpu_history()] == [10.0]
    assert first.status().state == "up" and first.status().error is None
    assert first.gpu_history()[0][1].devices[0].memory_total_bytes == 80_000_000_000
