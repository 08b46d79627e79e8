"""Each rule fires on a real recording of a real vllm serve under the condition it detects, and the
CLI's advice names the right knob and direction; a healthy recording yields no warning."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.recording import read_recording
from tests.integration import load
from tests.integration.recorded import diagnose_json, record_while
from tests.integration.vllm_server import VllmServer, all_ready, build_tiny_model

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR", ROOT / "test-artifacts"))
WORDS = ("block cache token prefill decode queue engine server memory page table request batch sequence latency "
         "the a of and to is in for on with").split()


@pytest.fixture(scope="module")
def condition_servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    """Three more servers, started in parallel: a concurrency cap of 4, prefix caching off, and a
    4-layer ("mid") model whose long prefills take long enough to stall decodes."""
    work = tmp_path_factory.mktemp("conditions")
    mid = build_tiny_model(work / "mid-model", "mid")
    servers = {
        "cap4": VllmServer(tiny_model, work / "cap4", ("--max-num-seqs", "4")).start(),
        "noprefix": VllmServer(tiny_model, work / "noprefix", ("--no-enable-prefix-caching",)).start(),
        # A 1,200-token prompt prefills in one step under this budget: a few hundred ms on 2 cores.
        "mid": VllmServer(mid, work / "mid", ("--max-num-batched-tokens", "4096")).start(),
    }
    with all_ready(servers):
        yield servers


def record(server: VllmServer, path: Path, action: Callable[[], None], interval: float = 0.5) -> Path:
    """A real recording of ``server`` while ``action`` runs (1 s before, 1.5 s after)."""
    return record_while(server.url, path, action, interval=interval)


def _seconds_queued_at(path: Path, cap: int) -> float:
    """How long the recording's raw gauges show requests waiting for capacity with ``cap`` running
    (summed over consecutive good scrapes, each pair counted when both show it)."""
    points = []
    for scrape in read_recording(path).scrapes():
        if scrape.snapshot is not None:
            snap = scrape.snapshot
            waiting = (snap.by_label("num_requests_waiting_by_reason") or {}).get("capacity", 0.0)
            points.append((scrape.ts, waiting > 0 and snap.value("num_requests_running") == cap))
    return sum(b[0] - a[0] for a, b in zip(points, points[1:]) if a[1] and b[1])


def diagnose_cli(*args: str) -> tuple[int, list[dict[str, Any]]]:
    return diagnose_json(*args)


def by_id(findings: list[dict[str, Any]], fid: str) -> dict[str, Any]:
    found = [f for f in findings if f["id"] == fid]
    assert found, [f["id"] for f in findings]
    return found[0]


def advice(finding: dict[str, Any]) -> set[tuple[str, str]]:
    return {(s["flag"], s["direction"]) for s in finding["suggestions"]}


def test_healthy_recording_yields_no_warning(vllm_main: VllmServer, tmp_path: Path) -> None:
    def steady() -> None:
        for _ in range(4):
            load.completions(vllm_main.url, 8, max_tokens=96)

    path = record(vllm_main, tmp_path / "healthy.jsonl.gz", steady)
    code, findings = diagnose_cli("--replay", str(path))
    assert code == 0, findings
    assert all(f["severity"] == "info" for f in findings)


def test_queue_at_the_cap_says_raise_max_num_seqs(condition_servers: dict[str, VllmServer], tmp_path: Path) -> None:
    """40 requests against a cap of 4. Whether they really queued at the cap is judged from the raw
    gauges (not from the diagnosis); a run where they did not is repeated, three such runs fail."""
    server = condition_servers["cap4"]
    seen: list[float] = []
    for attempt in range(3):
        path = record(server, tmp_path / f"cap-{attempt}.jsonl.gz",
                      lambda: load.completions(server.url, 40, max_tokens=256))
        seen.append(_seconds_queued_at(path, cap=4))
        if seen[-1] >= 5.0:
            break
    else:
        pytest.fail(f"in 3 runs, 40 requests never queued at a cap of 4 for 5 s: {seen}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / "recording-queue-at-cap.jsonl.gz")  # to read back when this fails
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "queue_at_cap")
    assert code == 1 and f["severity"] == "warning", (seen, findings)
    assert advice(f) == {("--max-num-seqs", "increase")}
    assert f["evidence"]["num_requests_running_cap"] == 4 and f["suggestions"][0]["value"] > 4
    assert "kv_pressure" not in [x["id"] for x in findings]


def test_tiny_block_budget_says_more_kv_never_more_seqs(vllm_tiny: VllmServer, tmp_path: Path) -> None:
    path = record(vllm_tiny, tmp_path / "kv.jsonl.gz", lambda: load.completions(vllm_tiny.url, 30, max_tokens=200))
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "kv_pressure")
    assert code >= 1 and f["evidence"]["preemptions"] > 0 and f["evidence"]["max_kv_cache_usage_perc"] >= 0.95
    flags = advice(f)
    # The tiny server pins its KV cache with --num-gpu-blocks-override 12: the change that takes
    # effect is a larger override; --gpu-memory-utilization and fp8 KV would change nothing.
    primary = f["suggestions"][0]
    assert (primary["flag"], primary["direction"], primary["value"]) == ("--num-gpu-blocks-override", "increase", 18)
    assert "--gpu-memory-utilization" not in {flag for flag, _ in flags} and ("--kv-cache-dtype", "set") not in flags
    assert ("--max-num-seqs", "decrease") in flags and ("--max-num-seqs", "increase") not in flags
    assert "queue_at_cap" not in [x["id"] for x in findings]


def test_n8_without_prefix_caching_says_enable_it(condition_servers: dict[str, VllmServer], tmp_path: Path) -> None:
    server = condition_servers["noprefix"]
    rng = load.seeded_rng()
    prompt = " ".join(rng.choice(WORDS) for _ in range(300))
    path = record(server, tmp_path / "n8.jsonl.gz",
                  lambda: load.completions(server.url, 10, prompt=prompt, n=8, max_tokens=32))
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "sharing_disabled")
    assert code == 1 and advice(f) == {("--enable-prefix-caching", "set")}
    assert f["evidence"]["mean_n"] == pytest.approx(8.0)


def test_long_prefills_stalling_decodes_say_lower_the_chunk(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    """16 streaming decoders and a 1,200-word prompt every 2.5 s on the 4-layer model. Whether the
    decoders really stalled is judged from the clients' own token gaps (not from the diagnosis);
    a run where they did not is repeated, and three such runs fail the test."""
    server = condition_servers["mid"]
    rng = load.seeded_rng()
    seen: list[float] = []
    for attempt in range(3):
        clients = load.Clients()
        sent: list[float] = []

        def mixed(clients: load.Clients = clients, sent: list[float] = sent) -> None:
            decoders = load.burst(server.url, clients, 16, prompt="decode " * 8, max_tokens=400, stream=True)
            time.sleep(2.0)
            for _ in range(8):
                sent.append(time.time())
                load.burst(server.url, clients, 1, prompt=" ".join(rng.choice(WORDS) for _ in range(1200)),
                           max_tokens=2)
                time.sleep(2.5)
            decoders.join(240)

        path = record(server, tmp_path / f"hol-{attempt}.jsonl.gz", mixed, interval=1.0)
        seen = [round(clients.max_gap(t, t + 2.0), 3) for t in sent]
        if sum(gap >= 0.2 for gap in seen) >= 2:
            break
    else:
        pytest.fail(f"in 3 runs the decoders never saw a ≥ 0.2 s token gap after a long prompt: {seen}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / "recording-head-of-line.jsonl.gz")
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "head_of_line_blocking")
    assert code == 1 and advice(f) == {("--max-num-batched-tokens", "decrease")}, (seen, findings)
    assert f["evidence"]["itl_worst_interval_p99_seconds"] >= 0.1
    assert "slow_decode" not in [x["id"] for x in findings]


def test_sigstop_of_the_engine_is_a_critical_silent_stall(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    server = condition_servers["cap4"]
    engines = [pid for pid in server.engine_pids() if "EngineCor" in Path(f"/proc/{pid}/comm").read_text()]
    assert engines, "no EngineCore process found"

    def stall() -> None:
        running, _ = load.in_background(server.url, 4, max_tokens=1500)
        time.sleep(1.5)
        os.kill(engines[0], signal.SIGSTOP)
        try:
            time.sleep(8)
        finally:
            os.kill(engines[0], signal.SIGCONT)
        running.join(120)

    path = record(server, tmp_path / "stall.jsonl.gz", stall)
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "silent_stall")
    assert code == 2 and f["severity"] == "critical"
    assert f["evidence"]["seconds_without_tokens"] >= 5 and f["evidence"]["ongoing"] is False


def test_a_killed_server_is_critical_with_its_time_range(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    server = condition_servers["cap4"]

    def kill() -> None:
        load.completions(server.url, 4, max_tokens=16)
        server.kill9()
        time.sleep(2.0)

    path = record(server, tmp_path / "killed.jsonl.gz", kill)
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "server_down")
    assert code == 2 and f["evidence"]["ongoing"] is True and f["time_range"][1] > f["time_range"][0]


def test_diagnose_a_failed_start_log_alone(tmp_path: Path) -> None:
    code, findings = diagnose_cli("--log", str(ROOT / "tests/fixtures/log-0.32.0-kv-too-small-for-max-model-len.txt"))
    assert code == 2
    assert findings[0]["suggestions"][0] == {
        "flag": "--max-model-len", "direction": "decrease", "value": 1408,
        "why": "vLLM estimates 1,408 tokens fit in the KV memory it has."}


def test_diagnose_live_url_with_budgets(vllm_main: VllmServer) -> None:
    def generated() -> float:
        snap = parse_snapshot(httpx.get(vllm_main.url + "/metrics", timeout=5).text)
        return snap.value("generation_tokens") or 0.0

    before = generated()
    # 64 decoders make each step slower than vLLM's first ITL bucket (10 ms) on these cores: a p95
    # inside that bucket is only "< 10 ms" and can never be called over a budget.
    thread, results = load.in_background(vllm_main.url, 64, max_tokens=1200)  # outlasts the collection
    deadline = time.monotonic() + 30
    while generated() <= before and time.monotonic() < deadline:  # decoding has started
        time.sleep(0.2)
    code, findings = diagnose_cli("--url", vllm_main.url, "--seconds", "4", "--interval", "0.5",
                                  "--itl-budget-ms", "5")
    thread.join(120)
    assert results == [200] * 64
    f = by_id(findings, "slow_decode")
    assert code == 1 and ("--max-num-seqs", "decrease") in advice(f)
