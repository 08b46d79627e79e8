"""Attach to a real vllm serve: catalog, collector, recordings and the CLI, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diagnostics.collector import Collector
from diagnostics.core.metrics.catalog import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    LABELLED_COUNTERS,
    LABELLED_GAUGES,
    NEEDS_A_FLAG,
)
from diagnostics.core.metrics.derive import counter_steps, derive_state, labels_total, prefix_cache_hit_rate, window
from diagnostics.recording import RecordingWriter, read_recording
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import wait_for
from tests.integration import load
from tests.integration.pool import API_KEY
from tests.integration.vllm_server import VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
V0_ONLY = {"num_requests_swapped", "cpu_cache_usage_perc", "gpu_prefix_cache_hit_rate"}


def collector_for(server: VllmServer, interval: float = 0.25) -> Collector:
    return Collector(VllmClient(server.url), interval_seconds=interval).start()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnostics", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_every_concept_is_present_on_032(vllm_main: VllmServer) -> None:
    collector = collector_for(vllm_main)
    load.completions(vllm_main.url, 4, max_tokens=8)
    # Judged on scrapes taken after the answers went out: a series the API server creates with a
    # request's first observation (http_request_size_bytes by handler) is not there before it.
    done = time.time()
    assert wait_for(lambda: sum(1 for s in collector.history() if s.ts > done) >= 2)
    collector.stop()
    snap = collector.history()[-1].snapshot
    assert snap is not None
    for concept in (*GAUGES, *COUNTERS, *HISTOGRAMS, *LABELLED_GAUGES, *LABELLED_COUNTERS):
        assert snap.has(concept) == (concept not in V0_ONLY | NEEDS_A_FLAG), concept
    config = snap.cache_config
    assert config is not None and config.block_size == 128 and config.num_gpu_blocks == 1024
    assert config.kv_cache_memory_bytes == 64 * 1024 * 1024
    status = collector.status()
    assert status.state == "up" and status.info is not None
    assert (status.info.version, status.info.model, status.info.max_model_len) == ("0.32.0", "tiny", 2048)


def test_running_moves_under_a_30_request_burst(vllm_main: VllmServer) -> None:
    """30 clients in a closed loop until a scrape shows at least 10 running (a single burst of 30
    drained in under a second on a fast host, between two scrapes; on a busy one the API server let
    only 6 in at a time for the first 5 s), then until a scrape shows nothing running."""
    collector = collector_for(vllm_main)
    clients = load.Clients()
    stop = threading.Event()
    loop = load.closed_loop(vllm_main.url, clients, 30, 180.0,
                            lambda: {"prompt": "block cache token", "max_tokens": 256}, stop)
    seen = wait_for(lambda: any(s.snapshot is not None and (s.snapshot.value("num_requests_running") or 0) >= 10
                                for s in collector.history()), timeout=180)
    stop.set()
    loop.join(300)
    done = len(collector.history())
    assert wait_for(lambda: any(s.snapshot is not None and s.snapshot.value("num_requests_running") == 0
                                for s in collector.history()[done:]))
    collector.stop()
    running = [s.snapshot.value("num_requests_running") for s in collector.history() if s.snapshot]
    assert clients.statuses and set(clients.statuses) == {200}, clients.summary()
    assert seen and max(running) >= 10 and running[-1] == 0, running
    state = derive_state(collector.history())
    assert state.generation_tokens_rate and state.generation_tokens_rate > 0
    assert state.quantile("inter_token_latency_seconds", 0.95) is not None


def test_waiting_moves_when_the_kv_budget_is_tiny(tiny_burst: Path) -> None:
    """The shared recording of a 60-request burst on the 12-block server (tests/conftest.py)."""
    history = read_recording(tiny_burst).scrapes()
    snaps = [s.snapshot for s in history if s.snapshot]
    assert max(s.value("num_requests_waiting") or 0 for s in snaps) > 0
    assert max(s.value("kv_cache_usage_perc") or 0 for s in snaps) >= 0.99
    preempted = [s.value("num_preemptions") or 0 for s in snaps]
    assert preempted[-1] > preempted[0]
    assert derive_state(history, history[-1].ts - history[0].ts).num_preemptions_rate > 0  # the whole burst


def test_windowed_prefix_hit_rate_rises_when_a_long_prompt_repeats(vllm_main: VllmServer) -> None:
    rng = load.seeded_rng()
    prompt = " ".join(f"w{rng.randint(0, 10**6)}" for _ in range(150))
    collector = collector_for(vllm_main)
    assert wait_for(lambda: len(collector.history()) >= 2)
    finished = labels_total("request_success")

    def done() -> float:  # requests the collector has seen finish (the server is shared: counted from here)
        snap = collector.history()[-1].snapshot
        return (finished(snap) or 0.0) if snap is not None else -1.0

    assert wait_for(lambda: done() >= 0), "the collector never read the server"
    start = done()
    load.completions(vllm_main.url, 1, prompt=prompt, max_tokens=4)
    # Judged on what the collector recorded, not on the clock (a busy host scraped late and the last
    # 2 s of a fixed window held no request): the scrape that counted the first request (its miss).
    assert wait_for(lambda: done() >= start + 1), "the collector never saw the first request finish"
    seen = collector.history()[-1].ts
    first = prefix_cache_hit_rate(collector.history())
    for _ in range(5):
        load.completions(vllm_main.url, 1, prompt=prompt, max_tokens=4)
    assert wait_for(lambda: done() >= start + 6), "the collector never saw the five repeats finish"
    collector.stop()
    after = prefix_cache_hit_rate(collector.history())
    # A window that begins at that scrape holds only the repeats' increases: it forgets the miss.
    recent = prefix_cache_hit_rate(window(collector.history(), collector.history()[-1].ts - seen))
    assert first is not None and first < 0.05
    assert after is not None and after > 0.5
    assert recent is not None and recent > after  # the window forgets the first miss


def test_kill9_then_restart_keeps_history_and_gives_no_negative_rate(vllm_tiny: VllmServer, tmp_path: Path) -> None:
    collector = collector_for(vllm_tiny, 0.5)
    load.completions(vllm_tiny.url, 4, max_tokens=16)
    assert wait_for(lambda: collector.status().state == "up")
    time.sleep(1.0)
    before = len(collector.history())
    vllm_tiny.kill9()
    assert wait_for(lambda: collector.status().state == "down")
    # Down since its first failed scrape (how soon that came after the kill is the machine's
    # business: the collector's pacing is tests/unit/test_collector.py's, on a fake clock).
    status, history = collector.status(), collector.history()
    first_failed = next(s for s in history[before:] if s.snapshot is None)
    assert status.since == first_failed.ts and all(s.snapshot is not None for s in history[:before])
    vllm_tiny.start().wait_ready()
    load.completions(vllm_tiny.url, 2, max_tokens=16)
    assert wait_for(lambda: collector.status().state == "up")
    time.sleep(1.5)
    collector.stop()
    history = collector.history()
    assert any(s.snapshot is None for s in history)
    assert history[0].snapshot is not None and history[-1].snapshot is not None
    for concept in ("generation_tokens", "prompt_tokens", "num_preemptions"):
        assert all(inc >= 0 for _, _, inc in counter_steps(history, lambda s, c=concept: s.value(c))), concept
    assert derive_state(history, 3600).generation_tokens_rate >= 0


def test_replay_of_a_live_recording_gives_the_live_derived_state(vllm_main: VllmServer, tmp_path: Path) -> None:
    collector = Collector(VllmClient(vllm_main.url), interval_seconds=0.25)
    path = tmp_path / "live.jsonl.gz"
    with RecordingWriter(path) as writer:
        collector.add_sink(writer.write)
        collector.start()
        load.completions(vllm_main.url, 10, max_tokens=32)
        time.sleep(0.6)
        collector.stop()
    replay = read_recording(path)
    assert len(replay.records) == len(collector.history())
    assert derive_state(replay.scrapes()) == derive_state(collector.history())


def test_cli_record_then_status_as_a_user_types_them(vllm_main: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "incident.jsonl.gz"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "diagnostics", "record", "--url", vllm_main.url, "--seconds", "6",
         "--interval", "0.5", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert wait_for(lambda: out.exists() and out.stat().st_size > 0)
    load.completions(vllm_main.url, 20, max_tokens=128)
    _, stderr = recorder.communicate(timeout=60)
    rec = subprocess.CompletedProcess(recorder.args, recorder.returncode, "", stderr)
    assert rec.returncode == 0, rec.stderr
    assert "recorded" in rec.stderr and out.exists()
    status = cli("status", "--replay", str(out), "--json")
    assert status.returncode == 0, status.stderr
    obj = json.loads(status.stdout)
    for key in (
        "version", "model", "up", "kv_cache_usage_perc", "num_requests_running", "num_requests_waiting",
        "prefix_cache_hit_rate", "num_preemptions_rate", "ttft_p95_seconds", "itl_p95_seconds",
        "block_size", "num_gpu_blocks",
    ):
        assert key in obj, key
    assert obj["version"] == "0.32.0" and obj["model"] == "tiny" and obj["up"] is True
    assert obj["block_size"] == 128 and obj["num_gpu_blocks"] == 1024
    assert obj["generation_tokens_rate"] > 0
    live = cli("status", "--url", vllm_main.url, "--json")
    assert live.returncode == 0, live.stderr
    assert json.loads(live.stdout)["state"] == "up"
    human = cli("status", "--url", vllm_main.url)
    assert "KV cache" in human.stdout and "0.32.0" in human.stdout


def test_cli_errors_are_one_line_with_a_non_zero_exit(tmp_path: Path) -> None:
    from tests.integration.vllm_server import free_port

    down = cli("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 3 and down.stderr.count("\n") == 1 and "cannot reach" in down.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("this is not a recording\n")
    replay = cli("status", "--replay", str(bad))
    assert replay.returncode == 5 and "line 1" in replay.stderr


def test_cli_refuses_a_prometheus_endpoint_that_is_not_vllm(tmp_path: Path) -> None:
    from tests.integration.vllm_server import free_port

    port = free_port()
    (tmp_path / "metrics").write_text("# TYPE node_load1 gauge\nnode_load1 0.5\n")
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: cli("status", "--url", f"http://127.0.0.1:{port}").returncode != 3)
        result = cli("status", "--url", f"http://127.0.0.1:{port}")
        assert result.returncode == 4 and "no vllm: metrics" in result.stderr
    finally:
        server.terminate()


def test_a_server_with_an_api_key(keyed_server: VllmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM guards /v1 with --api-key while /metrics stays open: without the key the state is up and
    the missing info says why; with it, /v1/models answers; the key is never written anywhere."""
    secret, server = API_KEY, keyed_server
    anonymous = Collector(VllmClient(server.url), interval_seconds=0.5)
    anonymous.scrape_once()
    status = anonymous.status()
    assert status.state == "up" and status.info is None
    assert status.info_error is not None and "401" in status.info_error and "API key" in status.info_error
    monkeypatch.setenv("TRIAGE_TEST_KEY", secret)
    out = tmp_path / "keyed.jsonl"
    rec = cli("record", "--url", server.url, "--api-key-env", "TRIAGE_TEST_KEY", "--seconds", "1.5",
              "--interval", "0.5", "--out", str(out))
    assert rec.returncode == 0, rec.stderr
    assert secret not in rec.stderr and secret not in rec.stdout and secret not in out.read_text()
    status_out = cli("status", "--replay", str(out), "--json")
    assert json.loads(status_out.stdout)["model"] == "tiny"
