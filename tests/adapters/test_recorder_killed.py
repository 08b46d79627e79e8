"""A recorder killed mid-incident (SIGKILL, a real subprocess) keeps what it collected: the cut
``.jsonl.gz`` replays up to its last flushed line, with a note that it was cut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnostics.recording import read_recording
from diagnostics.sim.server import SimServer
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _lines_flushed(path: Path) -> int:
    """Every complete line the writer has flushed, counted without the reader under test."""
    return zlib.decompressobj(wbits=31).decompress(path.read_bytes()).count(b"\n") if path.exists() else 0


@pytest.fixture
def server() -> Iterator[SimServer]:
    s = SimServer("healthy", speed=5.0).start()
    yield s
    s.stop()


def test_a_recorder_killed_with_sigkill_leaves_a_replayable_recording(server: SimServer, tmp_path: Path) -> None:
    out = tmp_path / "incident.jsonl.gz"
    recorder = subprocess.Popen([sys.executable, "-m", "diagnostics", "record", "--url", server.url, "--seconds",
                                 "120", "--interval", "0.25", "--out", str(out)], cwd=ROOT)
    try:
        assert wait_for(lambda: _lines_flushed(out) >= 5, timeout=120, step=0.25), "the recorder wrote nothing"
    finally:
        os.kill(recorder.pid, signal.SIGKILL)
        recorder.wait(10)
    assert recorder.returncode == -signal.SIGKILL

    flushed = _lines_flushed(out)
    recording = read_recording(out)
    assert flushed >= 4 and len(recording.records) == flushed
    assert any("cut off" in p for p in recording.problems)
    assert recording.scrapes()[-1].snapshot is not None  # the last complete line is a whole scrape

    status = subprocess.run([sys.executable, "-m", "diagnostics", "status", "--replay", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "cut off" in status.stderr
