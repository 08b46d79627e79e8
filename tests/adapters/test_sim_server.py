"""The simulated server's HTTP surface, over real sockets on loopback: the dashboard's collector
attaches to it exactly as to vLLM; completions (also streaming), chat, scenario switching, bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from diagnostics.collector import Collector
from diagnostics.core.probe import ProbeSpec
from diagnostics.sim.server import SimServer
from diagnostics.sources.probe_http import Probe
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import wait_for


@pytest.fixture
def server() -> Iterator[SimServer]:
    s = SimServer("healthy", speed=20.0).start()
    yield s
    s.stop()


def test_the_collector_attaches_with_no_special_path(server: SimServer) -> None:
    collector = Collector(VllmClient(server.url), interval_seconds=0.25)
    for _ in range(3):
        collector.scrape_once()
        time.sleep(0.3)
    status = collector.status()
    assert status.state == "up" and status.info is not None
    assert (status.info.version, status.info.model, status.info.max_model_len) == ("0.32.0", "sim-llama-3.1-8b", 8192)
    snap = collector.history()[-1].snapshot
    assert snap is not None and snap.cache_config is not None and snap.cache_config.block_size == 16


def test_completions_chat_and_streaming(server: SimServer) -> None:
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 5}, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "length"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3, "n": 4}, timeout=30)
    assert len(r.json()["choices"]) == 4
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).json()
    assert r["choices"][0]["message"]["role"] == "assistant"
    with httpx.stream("POST", server.url + "/v1/completions", timeout=30,
                      json={"prompt": "x", "max_tokens": 4, "stream": True}) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) == 5
    assert json.loads(events[0][6:])["choices"][0]["text"]


def test_scenarios_switch_at_runtime_and_bad_input_gets_a_clear_answer(server: SimServer) -> None:
    assert httpx.get(server.url + "/sim/scenario").json()["scenario"] == "healthy"
    assert httpx.post(server.url + "/sim/scenario", json={"scenario": "kv_pressure"}).json()["scenario"] == "kv_pressure"
    assert server.sim.scenario.name == "kv_pressure"
    bad = httpx.post(server.url + "/sim/scenario", json={"scenario": "nope"})
    assert bad.status_code == 400 and "unknown scenario" in bad.json()["error"]
    garbage = httpx.post(server.url + "/v1/completions", content=b"{not json")
    assert garbage.status_code == 400
    assert httpx.get(server.url + "/nope").status_code == 404


def test_a_scenario_switch_answers_the_requests_in_flight(server: SimServer) -> None:
    import threading

    answers: list[dict] = []  # type: ignore[type-arg]
    thread = threading.Thread(target=lambda: answers.append(httpx.post(
        server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 8000}, timeout=30).json()))
    thread.start()

    def in_flight() -> bool:  # this request, not the scenario's own traffic
        with server.sim.lock:
            return any(r.max_tokens == 8000 for r in (*server.sim.engine.running, *server.sim.engine.waiting))

    assert wait_for(in_flight), "the request never reached the engine"
    httpx.post(server.url + "/sim/scenario", json={"scenario": "queue_at_cap"})
    thread.join(60)
    assert answers and answers[0]["choices"][0]["finish_reason"] == "abort"


def test_the_probe_times_every_streamed_token(server: SimServer) -> None:
    """The simulated server streams one event per token, however fast the machine: the probe's
    client sees 16 tokens and times the 15 gaps between them (a real server may merge tokens into
    one event when its frontend falls behind; tests/integration/test_probe.py allows for that)."""
    summary = Probe(server.url, ProbeSpec(concurrency=4, requests=8, prompt_tokens=32, max_tokens=16)).start().wait(120)
    assert summary is not None and len(summary.ok) == 8
    for r in summary.ok:
        assert r.output_tokens == 16 and r.ttft is not None
        assert len(r.gaps) == 15 and all(g >= 0 for g in r.gaps)
        assert r.ttft + sum(r.gaps) <= r.end - r.start + 1e-6
