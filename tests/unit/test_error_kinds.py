"""A failed scrape carries the kind of the adapter's typed error (rules read it, never the
message), through the collector, into a recording and back; an old recording that stored only the
message is read with the kind its wording meant."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from diagnostics.collector import Collector
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.recording import RecordingWriter, read_recording
from diagnostics.sources.vllm_http import VllmClient
from tests.unit.test_collector import Clock


def _answer(mode: str, request: httpx.Request) -> httpx.Response:
    if mode == "refused":
        raise httpx.ConnectError("refused", request=request)
    if mode == "timeout":
        raise httpx.ReadTimeout("slow", request=request)
    if mode == "503":
        return httpx.Response(503)
    if mode == "401":
        return httpx.Response(401)
    if mode == "not_vllm":
        return httpx.Response(200, text="node_load1 1\n")
    return httpx.Response(200, text='vllm:num_requests_running{engine="0",mod')  # truncated


@pytest.mark.parametrize(("mode", "kind"), [
    ("refused", ErrorKind.UNREACHABLE),
    ("timeout", ErrorKind.TIMEOUT),
    ("503", ErrorKind.ENGINE_UNAVAILABLE),
    ("401", ErrorKind.HTTP_STATUS),
    ("not_vllm", ErrorKind.NOT_VLLM),
    ("truncated", ErrorKind.BAD_PAYLOAD),
])
def test_a_failed_scrape_keeps_the_kind_of_the_adapters_error_and_a_recording_keeps_both(
    mode: str, kind: ErrorKind, tmp_path: Path
) -> None:
    client = VllmClient("http://fake:8000", transport=httpx.MockTransport(lambda r: _answer(mode, r)))
    collector = Collector(client, clock=Clock())
    path = tmp_path / "rec.jsonl"
    with RecordingWriter(path) as writer:
        collector.add_sink(writer.write)
        scrape = collector.scrape_once()
    assert scrape.snapshot is None and scrape.error_kind is kind and scrape.error
    replayed = read_recording(path).scrapes()
    assert [(s.error, s.error_kind) for s in replayed] == [(scrape.error, kind)]
    assert [(r.error, r.error_kind) for r in collector.recent_records()] == [(scrape.error, kind)]


@pytest.mark.parametrize(("message", "kind"), [
    # What the adapters wrote into the recordings under tests/fixtures before kinds were stored.
    ("/metrics did not answer within 2 s", ErrorKind.TIMEOUT),
    ("cannot reach http://127.0.0.1:41669: [Errno 111] Connection refused", ErrorKind.UNREACHABLE),
    ("/metrics answered HTTP 503 Service Unavailable", ErrorKind.ENGINE_UNAVAILABLE),
    ("/metrics answered HTTP 401 Unauthorized (check the API key)", ErrorKind.HTTP_STATUS),
    ("http://h:1/metrics has no vllm: metrics (not a vLLM server, or one started with --disable-log-stats)",
     ErrorKind.NOT_VLLM),
    # The collector's /health check: any HTTP error there meant "Engine dead" to the old outage rule.
    ("engine unhealthy: /health answered HTTP 500 Internal Server Error", ErrorKind.ENGINE_UNAVAILABLE),
    ("/metrics failed: Server disconnected without sending a response.", ErrorKind.UNREACHABLE),
    ("/metrics response exceeds 8192 KiB; refused", ErrorKind.BAD_PAYLOAD),
    ("/metrics is not UTF-8 text", ErrorKind.BAD_PAYLOAD),
    ("bad payload: line 3: expected a value, got 'x'", ErrorKind.BAD_PAYLOAD),
    ("/version did not answer JSON", ErrorKind.BAD_PAYLOAD),
    ("http://h:1/metrics answered an HTML page, not Prometheus metrics", ErrorKind.NOT_VLLM),
    ("Prometheus: h:1 down at this instant", ErrorKind.UNKNOWN),
])
def test_an_old_recording_with_only_a_message_is_read_with_the_kind_its_wording_meant(
    message: str, kind: ErrorKind
) -> None:
    scrape = read_recording(json.dumps({"ts": 1, "target": "t", "error": message}).encode()).scrapes()[0]
    assert (scrape.error, scrape.error_kind) == (message, kind)


def test_a_stored_kind_wins_over_the_wording() -> None:
    line = {"ts": 1, "target": "t", "error": "/metrics did not answer within 2 s", "error_kind": "unreachable"}
    assert read_recording(json.dumps(line).encode()).scrapes()[0].error_kind is ErrorKind.UNREACHABLE


def test_the_recorded_timeouts_of_the_corpus_are_read_as_timeouts() -> None:
    recording = read_recording(Path(__file__).resolve().parents[1] / "fixtures/incidents/hung_rank_dp2.jsonl.gz")
    failed = [s for s in recording.scrapes() if s.snapshot is None]
    assert failed and {s.error_kind for s in failed} == {ErrorKind.TIMEOUT}
