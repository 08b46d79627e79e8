"""The verify-under-load probe against the real vllm serve: what the clients counted matches the
server's own counters; an unreachable server, a wrong model name, a server killed mid-probe and a
cancel each end with what was measured kept and the errors counted by kind; the caps refuse an
over-large probe."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from diagnostics.collector import Collector
from diagnostics.core.probe import MAX_CONCURRENCY, ProbeSpec, with_server
from diagnostics.sources.probe_http import Probe, ProbeRefused
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import wait_for
from tests.integration.vllm_server import VllmServer, free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnostics", "probe", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def test_thirty_concurrent_requests_match_the_servers_counters(vllm_main: VllmServer) -> None:
    out = cli("--url", vllm_main.url, "--concurrency", "30", "--requests", "30", "--prompt-tokens", "64",
              "--max-tokens", "32", "--json", "--yes")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["requests"] == result["completed"] == 30 and result["errors"] == 0
    assert result["output_tokens"] == 30 * 32  # ignore_eos: exactly max_tokens each, as the server counted
    server = result["server"]
    assert server["requests_finished"] == 30
    assert server["generation_tokens"] == 30 * 32
    for key in ("ttft_seconds", "itl_seconds", "e2e_seconds"):
        p = result[key]
        assert 0 < p["p50"] <= p["p95"] <= p["p99"]
    # The clients' e2e can only be longer than their TTFT; their rates follow from counts and time.
    assert result["e2e_seconds"]["p50"] > result["ttft_seconds"]["p50"]
    assert result["output_tokens_per_second"] == pytest.approx(960 / result["duration_seconds"])
    assert set(result) >= {"requests", "errors", "duration_seconds", "output_tokens_per_second",
                           "requests_per_second", "ttft_seconds", "itl_seconds", "e2e_seconds"}


def test_the_clients_count_every_token_themselves(vllm_main: VllmServer) -> None:
    summary = Probe(vllm_main.url, ProbeSpec(concurrency=4, requests=8, prompt_tokens=32, max_tokens=16)).start().wait(120)
    assert summary is not None and len(summary.ok) == 8
    for r in summary.ok:
        # 16 tokens, as the server's usage counts them. The client times every chunk it receives: a
        # first one and a gap before each of the others. When the API server falls behind it sends
        # several steps' tokens in one chunk (CI saw 15 chunks for 16 tokens; how many merge depends
        # on how busy the host is), so there are at most 15 gaps, and a gap then spans those steps,
        # as `vllm bench serve` counts it too. One gap per token is tests/adapters/test_sim_server.py.
        assert r.output_tokens == 16 and r.ttft is not None
        assert len(r.gaps) <= 15
        assert all(g >= 0 for g in r.gaps)
        assert r.ttft + sum(r.gaps) <= r.end - r.start + 1e-6


def test_an_unreachable_server_is_one_clear_line() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    out = cli("--url", dead, "--concurrency", "2", "--requests", "2", "--yes")
    assert out.returncode == 3
    assert "cannot reach" in out.stderr and "Traceback" not in out.stderr
    # The probe on its own: it cannot read the model, says so and sends nothing.
    probe = Probe(dead, ProbeSpec(concurrency=2, requests=2)).start()
    summary = probe.wait(30)
    assert summary is not None and summary.results == () and probe.failure is not None
    assert probe.failure.startswith(f"cannot reach {dead}")
    # With the model named, it tries, and stops once connections keep being refused.
    probe = Probe(dead, ProbeSpec(concurrency=3, requests=500, model="tiny")).start()
    summary = probe.wait(60)
    assert summary is not None and summary.errors_by_kind() == {"connect": len(summary.results)}
    assert 5 <= len(summary.results) < 20 and probe.failure is not None and "refused" in probe.failure


def test_a_wrong_model_name_counts_404s_with_the_servers_words(vllm_main: VllmServer) -> None:
    out = cli("--url", vllm_main.url, "--concurrency", "2", "--requests", "4", "--model", "no-such-model",
              "--json", "--yes")
    assert out.returncode == 1, out.stderr  # the probe ran; every request failed
    result = json.loads(out.stdout)
    assert result["completed"] == 0 and result["errors_by_kind"] == {"http_4xx": 4}
    assert "HTTP 404" in result["error_details"]["http_4xx"] and "no-such-model" in result["error_details"]["http_4xx"]


def test_caps_refuse_an_over_large_probe(vllm_main: VllmServer) -> None:
    out = cli("--url", vllm_main.url, "--concurrency", str(MAX_CONCURRENCY + 1), "--requests", "10", "--yes")
    assert out.returncode == 2 and f"concurrency must be 1…{MAX_CONCURRENCY}" in out.stderr
    with pytest.raises(ProbeRefused, match="requests must be"):
        Probe(vllm_main.url, ProbeSpec(requests=100_000))
    without_yes = cli("--url", vllm_main.url, "--concurrency", "4", "--requests", "4")
    assert without_yes.returncode == 2 and "Add --yes" in without_yes.stderr
    assert "4 concurrent clients sending 4 requests" in without_yes.stderr


def test_a_cancel_stops_the_requests_in_flight(vllm_main: VllmServer) -> None:
    # Judged on the server's counters. A probe's requests run in waves that end together; a busy host
    # once cancelled as one wave ended and the next had no token yet (nothing in flight to abort), and
    # once while the last of a wave were a few tokens from their end (the server finished them). The
    # cancel now waits until the requests in flight are at most halfway through; a run where the
    # server still finished every request it started is retried with longer requests and says so.
    for max_tokens in (400, 1000, 1800):  # the tiny model holds 2,048 positions, 128 in the prompt
        if _cancel_mid_probe(vllm_main, max_tokens):
            print(f"cancel with max_tokens={max_tokens}: the server aborted requests mid-generation")
            return
        print(f"cancel with max_tokens={max_tokens}: the server finished every request it had started; "
              "again with longer requests")
    pytest.fail("three cancels, and the server ran every request it had started to its end each time")


@dataclass(frozen=True)
class _Served:
    """What the server's counters say of the probe's requests since ``base``: vLLM counts a
    request's prompt tokens with its first token, and its finish (stop or length; an aborted one
    under neither) at its end. With ignore_eos a finished request generated exactly ``max_tokens``."""

    started: float
    finished: float
    generated: float
    running: float

    @staticmethod
    def read(collector: Collector, base: _Served | None = None, prompt_tokens: int = 1) -> _Served:
        snaps = [s.snapshot for s in collector.history() if s.snapshot is not None]
        assert snaps, "no scrape of the server"
        last = snaps[-1]
        by_reason = last.by_label("request_success") or {}
        now = _Served((last.value("prompt_tokens") or 0.0) / prompt_tokens,
                      by_reason.get("stop", 0.0) + by_reason.get("length", 0.0),
                      last.value("generation_tokens") or 0.0, last.value("num_requests_running") or 0.0)
        if base is None:
            return now
        return _Served(now.started - base.started, now.finished - base.finished, now.generated - base.generated,
                       now.running)

    def in_flight_tokens(self, max_tokens: int) -> float:
        return self.generated - self.finished * max_tokens


def _cancel_mid_probe(server: VllmServer, max_tokens: int) -> bool:
    """Cancel a probe while the server holds requests at most halfway through; check what the probe
    kept, that the server ends idle, and that it finished fewer requests than it started (the rest it
    aborted, having generated less than in full)."""
    spec = ProbeSpec(concurrency=8, requests=400, max_tokens=max_tokens)
    collector = Collector(VllmClient(server.url), interval_seconds=0.5).start()
    try:
        assert wait_for(lambda: any(s.snapshot is not None for s in collector.history()), timeout=60)
        base = _Served.read(collector, prompt_tokens=spec.prompt_tokens)
        probe = Probe(server.url, spec).start()

        def mid_generation() -> bool:
            now = _Served.read(collector, base, spec.prompt_tokens)
            in_flight = now.started - now.finished
            return in_flight >= 1 and 0 < now.in_flight_tokens(max_tokens) <= in_flight * max_tokens / 2

        assert wait_for(lambda: probe.progress()[1] >= 2, timeout=180), "the probe never got going"
        assert wait_for(mid_generation, timeout=120, step=0.2), "the server never held requests mid-generation"
        probe.cancel()
        summary = probe.wait(20)
        assert summary is not None and summary.cancelled
        kinds = summary.errors_by_kind()
        assert kinds.get("cancelled", 0) >= 1 and len(summary.ok) >= 2
        assert len(summary.results) < 400
        probe.cancel()  # a second cancel, after the run ended, is harmless
        # vLLM aborts what the clients closed: nothing left running after a while, and no token
        # generated between two scrapes a second apart (a gauge can read 0 for a moment on a busy host).
        def settled() -> bool:
            before = _Served.read(collector)
            time.sleep(1.0)
            after = _Served.read(collector)
            return after.running == 0 and after.generated == before.generated
        assert wait_for(settled, step=0.5), "requests still running on the server a minute after the cancel"
        end = _Served.read(collector, base, spec.prompt_tokens)
        aborted = end.started - end.finished
        print(f"server counters over the cancel: {end.started:.0f} requests started, {end.finished:.0f} finished "
              f"(stop+length), {end.generated:.0f} tokens generated; {len(summary.results)} requests at the client "
              f"({len(summary.ok)} ok)")
        if aborted < 1:
            return False
        # The ones it aborted generated something, and less than they would have in full.
        assert 0 < end.in_flight_tokens(max_tokens) < aborted * max_tokens, end
        assert end.finished >= len(summary.ok) and end.started <= len(summary.results), (end, len(summary.results))
        return True
    finally:
        collector.stop()


def test_a_server_killed_mid_probe_keeps_what_was_measured(vllm_tiny: VllmServer) -> None:
    collector = Collector(VllmClient(vllm_tiny.url), interval_seconds=0.5).start()
    probe = Probe(vllm_tiny.url, ProbeSpec(concurrency=6, requests=200, max_tokens=150)).start()
    try:
        assert wait_for(lambda: probe.progress()[1] >= 3, timeout=120), "the probe never got going"
        vllm_tiny.kill9()
        summary = probe.wait(60)
        assert summary is not None and probe.done
        kinds = summary.errors_by_kind()
        assert len(summary.ok) >= 3
        assert kinds.get("disconnected", 0) + kinds.get("connect", 0) >= 6, kinds
        assert set(kinds) <= {"disconnected", "connect"}, kinds
        obj = with_server(summary, collector.history()).to_json()
        assert obj["completed"] == len(summary.ok) and obj["errors"] == sum(kinds.values())
    finally:
        collector.stop()  # the next module that needs the server starts it again (tests/conftest.py)
