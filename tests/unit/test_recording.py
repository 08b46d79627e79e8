from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from diagnostics.collector import Collector
from diagnostics.core.metrics.derive import derive_state
from diagnostics.errors import BadRecording
from diagnostics.recording import Record, RecordingWriter, read_recording
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import fixture_text
from tests.unit.test_collector import Clock, FakeServer

SECRET = "sk-never-in-a-file"


@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_collector_recording_replays_to_the_same_derived_state(tmp_path: Path, name: str) -> None:
    server, clock = FakeServer(), Clock()
    client = VllmClient("http://fake:8000", SECRET, transport=httpx.MockTransport(server))
    collector = Collector(client, clock=clock)
    path = tmp_path / name
    with RecordingWriter(path) as writer:
        collector.add_sink(writer.write)
        for mode in ("up", "up", "down", "up", "up"):
            server.mode = mode
            collector.scrape_once()
            clock.now += 1.0
    replay = read_recording(path)
    assert replay.problems == []
    assert derive_state(replay.scrapes()) == derive_state(collector.history())
    assert [s.error for s in replay.scrapes()] == [s.error for s in collector.history()]
    assert replay.info() is not None and replay.info().model == "tiny"
    raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
    assert SECRET.encode() not in raw


def test_a_broken_line_is_reported_with_its_number_and_the_rest_kept(tmp_path: Path) -> None:
    good = Record(1.0, "http://h:1", metrics=fixture_text("metrics-0.32.0-idle.txt")).to_json()
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([good, '{"ts": 2, "target": "http://h:1", "metr', good.replace('"ts":1.0', '"ts":3.0')]))
    recording = read_recording(path)
    assert len(recording.records) == 2
    assert recording.problems == ["line 2: not JSON (skipped)"]


def test_unknown_keys_are_ignored() -> None:
    line = json.dumps({"ts": 1, "target": "t", "error": "x", "future_key": {"a": 1}})
    rec = read_recording(line.encode())
    assert rec.records[0].error == "x"


@pytest.mark.parametrize(
    "content",
    [b"", b"hello\nworld\n", b'{"ts": "yesterday", "target": "t", "metrics": ""}', b"\x89PNG\r\n\x1a\n\x00\xff"],
)
def test_files_that_are_not_recordings_raise_bad_recording(content: bytes) -> None:
    with pytest.raises(BadRecording):
        read_recording(content)


def test_a_missing_file_is_a_bad_recording(tmp_path: Path) -> None:
    with pytest.raises(BadRecording, match="cannot read"):
        read_recording(tmp_path / "nope.jsonl")


def test_a_recorded_payload_that_no_longer_parses_becomes_an_error_scrape() -> None:
    line = json.dumps({"ts": 1, "target": "t", "metrics": 'vllm:x{engine="0"'})
    scrape = read_recording(line.encode()).scrapes()[0]
    assert scrape.snapshot is None and "bad payload" in (scrape.error or "")


def test_save_snapshot_roundtrip_keeps_the_last_minutes() -> None:
    from diagnostics.recording import encode_recording

    server, clock = FakeServer(), Clock()
    client = VllmClient("http://fake:8000", SECRET, transport=httpx.MockTransport(server))
    collector = Collector(client, clock=clock, raw_retention_seconds=60)
    for mode in ["up"] * 100 + ["down", "up"]:
        server.mode = mode
        collector.scrape_once()
        clock.now += 1.0
    data = encode_recording(collector.recent_records(30))
    assert data[:2] == b"\x1f\x8b" and SECRET.encode() not in gzip.decompress(data)
    replay = read_recording(data)
    assert len(replay.records) == 31 and replay.records[0].info is not None
    assert [s.error is not None for s in replay.scrapes()][-2:] == [True, False]
    live = [s for s in collector.history() if s.ts >= replay.records[0].ts]
    assert derive_state(replay.scrapes()) == derive_state(live)
