"""A collector process killed with SIGKILL while it writes the history store (a real subprocess
scraping the simulated engine) loses at most its last batch; a second process reading the same
store all the while never sees an error and never corrupts it; the store reopens for writing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnostics.core.store import DEFAULT_POLICY
from diagnostics.sim.server import SimServer
from diagnostics.sources.store import FILE_NAME, HistoryStore
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 0.25

READER = """
import sys, time
from diagnostics.sources.store import HistoryStore, StoreError
store = HistoryStore(sys.argv[1], write=False)
reads = errors = 0
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        for url in store.targets():
            store.read(url, 0, time.time() + 60)
        reads += 1
    except StoreError as exc:
        if "does not exist yet" not in str(exc):
            errors += 1
            print(exc, file=sys.stderr)
    time.sleep(0.05)
print(reads, errors)
"""


def _lines_flushed(path: Path) -> int:
    return zlib.decompressobj(wbits=31).decompress(path.read_bytes()).count(b"\n") if path.exists() else 0


def _stored_rows(data_dir: Path) -> int:
    path = data_dir / FILE_NAME
    if not path.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        (n,) = conn.execute("SELECT coalesce(sum(num_rows), 0) FROM chunks WHERE tier = 0").fetchone()
        conn.close()
        return int(n)
    except sqlite3.Error:
        return 0


@pytest.fixture
def server() -> Iterator[SimServer]:
    s = SimServer("healthy", speed=5.0).start()
    yield s
    s.stop()


def test_a_collector_killed_with_sigkill_loses_at_most_its_last_batch(server: SimServer, tmp_path: Path) -> None:
    data = tmp_path / "store"
    out = tmp_path / "same.jsonl.gz"
    writer = subprocess.Popen([sys.executable, "-m", "diagnostics", "record", "--url", server.url, "--seconds", "300",
                               "--interval", str(INTERVAL), "--data-dir", str(data), "--out", str(out)], cwd=ROOT)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(data), "25"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        # Three batches committed (a batch is 5 s: 20 scrapes at 0.25 s).
        assert wait_for(lambda: _stored_rows(data) >= 50, timeout=120, step=0.25), "the store got nothing"
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
    assert writer.returncode == -signal.SIGKILL
    taken = _lines_flushed(out)  # the recording beside it flushes every scrape: what the collector took
    said, complaints = reader.communicate(timeout=120)
    reads, errors = (int(x) for x in said.split())
    assert reader.returncode == 0 and errors == 0 and reads > 10, complaints[-2000:]

    assert sqlite3.connect(data / FILE_NAME).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store = HistoryStore(data)  # the kill let go of the directory: this process writes it now
    assert store.state.writable, store.state.message
    url = store.targets()[0]
    rows = store.read(url, 0, 2e9, max_rows=100_000).rows
    per_batch = DEFAULT_POLICY.batch_seconds / INTERVAL
    assert taken - per_batch - 2 <= len(rows) <= taken, (len(rows), taken)
    assert [r.ts for r in rows] == sorted({r.ts for r in rows})  # in order, none twice
    store.close()
