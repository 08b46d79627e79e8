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


def test_the_gpu_metrics_url_is_read_beside_the_scrapes_and_a_scenario_throttles_it(server: SimServer) -> None:
    """The simulated engine's /dcgm/metrics is read by the dcgm-exporter adapter into the collector's
    GPU history and recorded with its source; the thermal scenario holds the SM clock at 64 % of
    1,980 MHz with NVML's thermal reasons set."""
    from diagnostics.core.metrics.gpu import ClockEvent
    from diagnostics.sim.server import SIM_DCGM_PATH
    from diagnostics.sources.dcgm_http import DcgmReader

    reader = DcgmReader(server.url + SIM_DCGM_PATH)
    collector = Collector(VllmClient(server.url), interval_seconds=0.25, gpu_reader=reader, gpu_source=reader.url)
    collector.scrape_once()
    [(_, healthy)] = collector.gpu_history()
    [device] = healthy.devices
    assert (device.name, device.host, device.sm_clock_max_mhz, device.power_limit_watts) == (
        "NVIDIA H100 80GB HBM3", "127.0.0.1", 1980.0, 700.0)
    assert device.throttles == ClockEvent(0) and healthy.source == server.url + SIM_DCGM_PATH
    [record] = collector.recent_records()
    assert record.gpu_source == server.url + SIM_DCGM_PATH and record.gpus and record.gpus[0]["host"] == "127.0.0.1"
    # A saved snapshot keeps the readings and their source: its replay has the same GPU history.
    from diagnostics.recording import encode_recording, read_recording

    replayed = read_recording(encode_recording(collector.recent_records())).replay().gpu_history()
    assert replayed == collector.gpu_history()
    server.sim.set_scenario("gpu_thermal_throttle")

    def loaded() -> bool:  # the fresh engine idles (idle clock) until its first requests arrive
        collector.scrape_once()
        return (collector.gpu_history()[-1][1].devices[0].utilization_gpu_perc or 0) > 0

    assert wait_for(loaded)
    hot = collector.gpu_history()[-1][1].devices[0]
    assert hot.clock_events == ClockEvent.SW_THERMAL_SLOWDOWN | ClockEvent.HW_THERMAL_SLOWDOWN
    assert hot.sm_clock_mhz == 1267.0  # round(1980 × 0.64 = 1267.2)
    assert hot.temperature_celsius == 89.0  # 2 °C over its 87 °C slowdown threshold


def test_an_unreachable_gpu_metrics_url_is_a_reading_that_says_why(server: SimServer) -> None:
    from diagnostics.sources.dcgm_http import DcgmReader

    reader = DcgmReader(server.url + "/no-such-exporter")
    collector = Collector(VllmClient(server.url), interval_seconds=0.25, gpu_reader=reader, gpu_source=reader.url)
    scrape = collector.scrape_once()
    [(_, reading)] = collector.gpu_history()
    assert scrape.snapshot is not None  # vLLM's scrape stands
    assert reading.devices == () and "GPU metrics URL" in (reading.unavailable or "") and "404" in reading.unavailable


def test_two_simulated_servers_name_their_own_host_and_their_own_gpus() -> None:
    """Two simulated engines on two loopback hosts (the Fleet screenshots' pair), and two on one host:
    dcgm-exporter's ``Hostname`` is the address each listens on (the host part of its vLLM instance,
    which the Fleet page's join by host matches), and no two servers share a GPU UUID (one would
    collapse the other's device when a host's GPUs are joined)."""
    from diagnostics.core.fleet.gpus import host_of, join
    from diagnostics.core.metrics.dcgm import parse_dcgm
    from diagnostics.sim.server import SIM_DCGM_PATH

    servers = [SimServer("healthy", host="127.0.0.1"), SimServer("healthy", host="127.0.0.2"),
               SimServer("healthy", host="127.0.0.1")]
    try:
        for s in servers:
            s.start()
        devices = [parse_dcgm(httpx.get(s.url + SIM_DCGM_PATH, timeout=5).text).devices[0] for s in servers]
    finally:
        for s in servers:
            s.stop()
    assert [d.host for d in devices] == ["127.0.0.1", "127.0.0.2", "127.0.0.1"]
    assert len({d.uuid for d in devices}) == 3
    # Joined by the Hostname label alone (the exporter scraped under a name of its own): each vLLM
    # instance gets the GPUs of its own host, both of them on the shared one.
    series = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "instance": "dcgm-exporter:9400", "gpu": "0",
                          "UUID": d.uuid or "", "Hostname": d.host or ""}, "value": [1.0, "40"]} for d in devices]
    joined = join([{"metric": {"instance": host_of(s.url.split("://")[1]) + ":8000"}} for s in servers[:2]], series)
    assert {k: len(v.readings[0][1].devices) for k, v in joined.items()} == {"127.0.0.1:8000": 2, "127.0.0.2:8000": 1}


def test_status_prints_the_gpu_health_of_a_gpu_metrics_url(capsys: pytest.CaptureFixture[str]) -> None:
    """``status --gpu-metrics-url`` on the simulated thermally throttled GPU: utilisation, temperature
    against its slowdown threshold (89 °C over 87: the H100 board's), power against its limit, the SM
    clock held at 64 % of 1,980 MHz and the thermal reasons by name, in the text and in ``--json``;
    without a GPU source, no GPU line and ``gpus`` null."""
    from diagnostics.cli.main import main
    from diagnostics.sim.server import SIM_DCGM_PATH

    hot = SimServer("gpu_thermal_throttle", speed=20.0).start()
    try:
        args = ["status", "--url", hot.url, "--gpu-metrics-url", hot.url + SIM_DCGM_PATH, "--seconds", "1",
                "--interval", "0.25"]
        assert main(args) == 0
        text = capsys.readouterr().out
        assert main([*args, "--json"]) == 0
        obj = json.loads(capsys.readouterr().out)
        assert main(args[:3] + ["--seconds", "0.5", "--json"]) == 0
        bare = json.loads(capsys.readouterr().out)
    finally:
        hot.stop()
    gpu = [line for line in text.splitlines() if line.startswith("GPU ") or line.startswith("    ")]
    assert gpu[0].startswith("GPU           GPU 0 · NVIDIA H100 80GB HBM3 @ 127.0.0.1 (from http")
    assert "temperature 89 °C (slowdown 87)" in gpu[1] and " W of 700" in gpu[1] and "utilisation " in gpu[1]
    assert "SM clock 1267 MHz of 1980" in gpu[2] and "memory clock 2619 MHz of 2619" in gpu[2]
    assert "THROTTLED (SW thermal slowdown, HW thermal slowdown): no vLLM flag fixes this" in gpu[2]
    [device] = obj["gpus"]["devices"]
    assert obj["gpus"]["source"] == hot.url + SIM_DCGM_PATH
    assert (device["sm_clock_mhz"], device["temperature_slowdown_celsius"], device["power_limit_watts"]) == (
        1267.0, 87.0, 700.0)
    assert device["throttled_by"] == ["SW thermal slowdown", "HW thermal slowdown"]
    assert 0 <= device["utilization_gpu_perc"] <= 1 and device["label"].startswith("GPU 0 · NVIDIA H100")
    assert bare["gpus"] is None or bare["gpus"]["source"] != hot.url + SIM_DCGM_PATH


def test_a_prompt_beyond_the_context_limit_is_refused_and_counted_as_vllm_does(server: SimServer) -> None:
    """vLLM refuses a prompt longer than --max-model-len with HTTP 400 ("This model's maximum context
    length is N tokens", vllm/renderers/params.py) and its API server counts the 4xx: the outcome
    rules read it as a rejected request."""
    from diagnostics.core.diagnosis.outcomes import window_outcomes
    from diagnostics.core.metrics.derive import Scrape

    collector = Collector(VllmClient(server.url), interval_seconds=0.25)
    collector.scrape_once()
    limit = server.sim.scenario.config.max_model_len
    replies = [httpx.post(server.url + "/v1/completions", json={"prompt": "word " * (limit + 1), "max_tokens": 4},
                          timeout=10) for _ in range(3)]
    collector.scrape_once()
    assert [r.status_code for r in replies] == [400] * 3
    assert f"maximum context length is {limit} tokens" in replies[0].json()["error"]["message"]
    o = window_outcomes([s for s in collector.history() if isinstance(s, Scrape)], limit)
    assert o.rejected == 3
