"""Each rule fires on a real recording of a real vllm serve under the condition it detects, and the
CLI's advice names the right knob and direction; a healthy recording yields no warning.

The servers a condition needs start together, once for the module (a server start is most of a
real-server test's time): a concurrency cap of 4 with an admission limit, prefix caching off with
the sleep endpoints, a 6-layer model whose long prefills stall decodes, and LoRA with one slot. A
workload runs for a fixed time or grows until the server's own gauges show its condition, so a
fast host and a busy one both produce it; a run that did not is repeated and says so."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from diagnostics.core.metrics.catalog import Snapshot, parse_snapshot
from diagnostics.core.metrics.derive import Scrape, count_above, histogram_delta
from diagnostics.recording import Record, read_recording
from tests.conftest import wait_for
from tests.integration import load
from tests.integration.hostload import OutsideLoad
from tests.integration.pool import ServerPool
from tests.integration.recorded import cli_json, diagnose_json, record_while
from tests.integration.vllm_server import VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR", ROOT / "test-artifacts"))
HOST_CHANGE_CORES = 0.3  # more of the host busy outside the server: a change the product is right to name
WORDS = ("block cache token prefill decode queue engine server memory page table request batch sequence latency "
         "the a of and to is in for on with").split()


@pytest.fixture(scope="module")
def condition_servers(server_pool: ServerPool) -> Iterator[dict[str, VllmServer]]:
    """The module's servers (started ahead by the pool). The cap of 4 is killed by the module's last test."""
    with server_pool.lend("condition_servers") as servers:
        yield servers


@pytest.fixture(autouse=True)
def _condition_servers_up(request: pytest.FixtureRequest) -> None:
    """Each test that uses the module's servers finds them running: one whose process exited since
    the last test (not by a test's design: the kill is the module's last test) is started again, and
    the test's output says so with the end of its log."""
    if "condition_servers" not in request.fixturenames:
        return
    servers: dict[str, VllmServer] = request.getfixturevalue("condition_servers")
    for name, server in servers.items():
        note = server.revive()
        if note is not None:
            print(f"{name}: {note}")


def record(server: VllmServer, path: Path, action: Callable[[], None], interval: float = 0.5) -> Path:
    """A real recording of ``server`` while ``action`` runs (1 s before, 1.5 s after)."""
    return record_while(server.url, path, action, interval=interval)


def _seconds_queued_at(path: Path, cap: int) -> float:
    """How long the recording's raw gauges show requests waiting for capacity with ``cap`` running
    (summed over consecutive good scrapes, each pair counted when both show it)."""
    points = []
    for scrape in read_recording(path).scrapes():
        if scrape.snapshot is not None:
            points.append((scrape.ts, _queued_at_cap(scrape.snapshot, cap)))
    return sum(b[0] - a[0] for a, b in zip(points, points[1:]) if a[1] and b[1])


def _deferred(snap: Snapshot) -> bool:
    """Whether a scrape shows requests waiting with reason "deferred"."""
    return (snap.by_label("num_requests_waiting_by_reason") or {}).get("deferred", 0.0) > 0


def _seconds_deferred(path: Path) -> float:
    """How long the raw gauge shows requests waiting with reason "deferred" (consecutive scrapes)."""
    points = [(s.ts, _deferred(s.snapshot)) for s in read_recording(path).scrapes() if s.snapshot is not None]
    return sum(b[0] - a[0] for a, b in zip(points, points[1:]) if a[1] and b[1])


def _itl_bounds(path: Path) -> tuple[float, ...]:
    """The bucket bounds of the server's ITL histogram in a recording."""
    hist = next(s.snapshot.histogram("inter_token_latency_seconds") for s in read_recording(path).scrapes()
                if s.snapshot is not None)
    assert hist is not None
    return hist.bounds


def scrape(server: VllmServer) -> Snapshot:
    """What ``server``'s /metrics answers now."""
    return parse_snapshot(httpx.get(server.url + "/metrics", timeout=30).text)


def diagnose_cli(*args: str) -> tuple[int, list[dict[str, Any]]]:
    return diagnose_json(*args)


def by_id(findings: list[dict[str, Any]], fid: str) -> dict[str, Any]:
    found = [f for f in findings if f["id"] == fid]
    assert found, [f["id"] for f in findings]
    return found[0]


def advice(finding: dict[str, Any]) -> set[tuple[str, str]]:
    return {(s["flag"], s["direction"]) for s in finding["suggestions"]}


def test_healthy_recording_yields_no_warning(vllm_main: VllmServer, tmp_path: Path) -> None:
    """Steady load on a healthy server: no warning, exit 0. One warning is right on a busy host and
    passes, said so: an unexplained change whose late part had the host at least
    ``HOST_CHANGE_CORES`` busier outside the server than its early part (the other test worker's
    server or a build took a core; the product's first check is the host's co-tenants). Measured
    from /proc while recording, not assumed."""
    def steady() -> None:
        for _ in range(4):
            load.completions(vllm_main.url, 8, max_tokens=96)

    assert vllm_main.proc is not None
    with OutsideLoad(vllm_main.proc.pid) as host:
        path = record(vllm_main, tmp_path / "healthy.jsonl.gz", steady)
    code, findings = diagnose_cli("--replay", str(path))
    warnings = [f for f in findings if f["severity"] != "info"]
    assert code == (1 if warnings else 0), findings
    for f in warnings:
        assert f["id"] == "unexplained_change", findings
        before = host.cores(*f["evidence"]["before_range"])
        after = host.cores(*f["evidence"]["after_range"])
        assert before is not None and after is not None, (f, host.samples)
        assert after - before >= HOST_CHANGE_CORES, (
            f"{f['title']}, while the host outside the server went {before:.2f} -> {after:.2f} cores busy", f)
        print(f"right on a busy host: {f['title']}; outside the server the host went {before:.2f} -> "
              f"{after:.2f} cores busy")


def _queued_at_cap(snap: Snapshot, cap: int) -> bool:
    """Whether a scrape shows requests waiting for capacity with ``cap`` running."""
    waiting = (snap.by_label("num_requests_waiting_by_reason") or {}).get("capacity", 0.0)
    return waiting > 0 and snap.value("num_requests_running") == cap


def _until_seen(server: VllmServer, condition: Callable[[Snapshot], bool], seconds: float, limit: float) -> float:
    """Polls ``server``'s gauges every 0.25 s until ``condition`` has held for ``seconds`` in all
    (pairs of consecutive polls that both show it) or ``limit`` seconds have passed; returns the
    seconds it held."""
    held, last, deadline = 0.0, None, time.monotonic() + limit
    while held < seconds and time.monotonic() < deadline:
        now, shown = time.monotonic(), condition(scrape(server))
        if shown and last is not None:
            held += now - last
        last = now if shown else None
        time.sleep(0.25)
    return held


def test_queue_at_the_cap_says_raise_max_num_seqs(condition_servers: dict[str, VllmServer], tmp_path: Path) -> None:
    """7 closed-loop clients against a cap of 4, kept going until the server's gauges have shown
    requests waiting at the cap for 8 s (at most 90 s): 3 wait whenever 4 run, however fast the
    machine answers (a fixed burst drained in 4 s on a fast host and took minutes on a busy one; 8 s
    of 64-token requests showed the queue for 0.5 s on a fast host, its requests finishing together).
    Their lengths are staggered, so that the 4 running do not finish in one step, and long (300-900
    tokens): with 96-320 an idle host's engine held each request 0.43 s, the queue's mean was 113 ms
    and no request queued a second, while the gauge caught it only in flickers (28 of 139 scrapes) —
    a queue too thin for either of the rule's paths. Never more than 7 in the server, so its
    admission limit of 8 turns none away. Whether they really queued at the cap is judged from the
    recording's raw gauges (not from the diagnosis); a run where they did not is repeated and says
    so, three such runs fail."""
    server = condition_servers["cap4"]
    seen: list[float] = []
    for attempt in range(3):
        clients, stop = load.Clients(), threading.Event()

        def queue(clients: load.Clients = clients, stop: threading.Event = stop) -> None:
            lengths = itertools.cycle(range(300, 900, 61))
            running = load.closed_loop(server.url, clients, 7, 300.0, lambda: {
                "prompt": "block cache token prefill", "max_tokens": next(lengths)}, stop=stop)
            _until_seen(server, lambda snap: _queued_at_cap(snap, 4), seconds=8.0, limit=90.0)
            stop.set()
            running.join(300)

        path = record(server, tmp_path / f"cap-{attempt}.jsonl.gz", queue)
        seen.append(_seconds_queued_at(path, cap=4))
        if seen[-1] >= 5.0:
            break
        print(f"retrying: the gauges showed requests queued at the cap for {seen[-1]:.1f} s of the 5 s needed")
    else:
        pytest.fail(f"in 3 runs, 7 clients never queued at a cap of 4 for 5 s: {seen}")
    assert set(clients.statuses) == {200}, clients.summary()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / "recording-queue-at-cap.jsonl.gz")  # to read back when this fails
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "queue_at_cap")
    assert code == 1 and f["severity"] == "warning", (seen, findings)
    assert advice(f) == {("--max-num-seqs", "increase")}
    assert f["evidence"]["num_requests_running_cap"] == 4 and f["suggestions"][0]["value"] > 4
    assert "kv_pressure" not in [x["id"] for x in findings]


def test_tiny_block_budget_says_more_kv_never_more_seqs(tiny_burst: Path) -> None:
    """The shared recording of a 60-request burst on the 12-block server (tests/conftest.py)."""
    code, findings = diagnose_cli("--replay", str(tiny_burst))
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


def test_a_sleeping_engine_is_named_asleep_not_stalled_and_serves_again_once_woken(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    """``POST /sleep?level=0&mode=keep`` (scheduling paused with the requests kept, so they wait as
    in a stall; level 0 is the only level the CPU build accepts, levels 1 and 2 need a GPU's memory
    pool) while clients stream. vLLM then exports ``engine_sleep_state`` awake = 0 with neither level
    set. The diagnosis says the engine is asleep (critical, how to wake it), never a stall;
    ``status`` shows it; once woken the requests that waited finish and the state reads awake."""
    server = condition_servers["noprefix"]  # started with VLLM_SERVER_DEV_MODE=1: /sleep and /wake_up
    path = tmp_path / "asleep.jsonl.gz"
    clients = load.Clients()
    streams: list[threading.Thread] = []

    def sleep_under_load() -> None:
        streams.append(load.closed_loop(server.url, clients, 3, 4.0, lambda: {
            "prompt": "block cache token " * 4, "max_tokens": 48, "stream": True}))
        time.sleep(2.0)
        assert httpx.post(server.url + "/sleep", params={"level": 0, "mode": "keep"}, timeout=30).status_code == 200
        time.sleep(8.0)

    try:
        record_while(server.url, path, sleep_under_load, interval=0.5, before=1.0, after=0.5)
        asleep_status = cli_json("status", "--url", server.url)
    finally:
        assert httpx.post(server.url + "/wake_up", timeout=30).status_code == 200
    streams[0].join(120)
    assert not streams[0].is_alive()  # the clients' requests held while asleep all came back
    awake_status = cli_json("status", "--url", server.url)

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


def _stalls_after_prompts(gaps: list[tuple[float, float]], batches: list[tuple[float, float]],
                          bounds: tuple[float, ...]) -> tuple[float, float, int, int, int, int]:
    """How the decoders' token gaps ``(end, gap)`` line up with the long-prompt ``batches`` ``(sent,
    answered)``: ``(needed, bar, batches followed by a stall past the bar, stalls after a batch,
    stalls, concentrated)``. A stall is a gap three times their median, ≥ 0.2 s and past the next of the server's
    ITL bucket ``bounds``; it follows a batch when it began while the batch was in the server and
    ended after it was sent. The bar: twice the 90th percentile of the stalls that followed no batch
    (what a busy host does to the decoders at random), or ``needed`` when there were none.
    ``concentrated``: batches during which the decoders stalled at all (≥ ``needed``), counted only
    where nearly every stall (≥ 90 %, at least 8 stalls, and at least twice the share of the run the
    batches cover, so never where they cover half of it) began during a batch — the host then
    stalled them at random too rarely for its stalls to set a bar (a busy rehearsal: 112 of 113
    stalls after a batch, and the one random stall of 0.97 s put the bar at 1.93 s)."""
    usual = max(0.2, 3 * statistics.median(gap for _, gap in gaps))
    needed = next(b for b in bounds if b >= usual)
    stalls = [(ts - gap, ts) for ts, gap in gaps if gap >= needed]

    slack = 0.1  # a stall may begin just before the batch's send was stamped

    def during(g: tuple[float, float], batch: tuple[float, float]) -> bool:
        return batch[0] - slack <= g[0] <= batch[1] and g[1] >= batch[0]

    at_random = sorted(g[1] - g[0] for g in stalls if not any(during(g, b) for b in batches))
    bar = max(needed, 2 * at_random[int(0.9 * (len(at_random) - 1))]) if at_random else needed
    after_prompt = sum(any(during(g, b) for b in batches) for g in stalls)
    prompts_followed = sum(any(during(g, b) and g[1] - g[0] >= bar for g in stalls) for b in batches)
    # The share of the run the batches cover: stalls falling in them by chance come in that share.
    start, end = min(ts - gap for ts, gap in gaps), max(ts for ts, _ in gaps)
    covered = sum(max(0.0, min(b[1], end) - max(b[0] - slack, start)) for b in batches) / max(end - start, 1e-9)
    concentrated = (sum(any(during(g, b) for g in stalls) for b in batches)
                    if len(stalls) >= 8 and after_prompt >= max(0.9, 2 * covered) * len(stalls) else 0)
    return needed, bar, prompts_followed, after_prompt, len(stalls), concentrated


@pytest.mark.timeout(1800)  # three runs of up to 8 long-prompt batches: on a busy 2-core host one took > 600 s
def test_long_prefills_stalling_decodes_say_lower_the_chunk(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    """16 streaming decoders on the 6-layer model and 8 times long prompts of 1,800 distinct random
    words sent together (identical prompts sent together would share their prefill through the prefix
    cache), each batch sent once the last one was answered and the decoders have since streamed 20
    tokens each — paced by the server, not the clock, so that on a host slow enough for one prefill to
    outlast a fixed pause the decoders still decode between stalls (paced by the clock, a host at load
    average 13 had them stalled all along: their median gap was the stall, and no gap stood out). The
    decoders are closed after the last long prompt. Whether they really stalled because of the long
    prompts is judged from the clients' own token gaps (not from the diagnosis): a stall is a gap three
    times their median, ≥ 0.2 s and past the next bucket bound of the server's ITL histogram (where the
    server's own buckets can tell it from the usual gap); at least two long-prompt batches were followed
    by one that began while the batch was in the server (sent, not yet answered) and lasted twice
    the 90th percentile of the stalls outside the batches (a busy host also stalls the decoders at
    random: a rehearsal with one core kept busy had 1,176 stalls, 342 of them after a batch), or, where
    ≥ 90 % of the stalls began during a batch, two batches were followed by any stall (a busy host
    that rarely stalls them at random leaves too few random stalls for a bar: one of 0.97 s among
    113 set it at 1.93 s above 112 batch stalls). A run
    where that did not hold is repeated with one more long prompt sent together (a longer prefill),
    and says so; three such runs fail."""
    server = condition_servers["small"]
    rng = load.seeded_rng()
    for attempt in range(3):
        clients, stop = load.Clients(), threading.Event()
        batches: list[tuple[float, float]] = []  # (sent, answered) of each batch of long prompts
        together = attempt + 2  # 1,800 tokens a prompt: 2 in one 4,096-token step, 3 or 4 in two

        def decoded(clients: load.Clients = clients) -> int:
            with clients.lock:
                return clients.streamed

        def mixed(clients: load.Clients = clients, stop: threading.Event = stop,
                  batches: list[tuple[float, float]] = batches, together: int = together) -> None:
            # 16 decoders streaming all along, closed when the long prompts are over: long requests
            # of staggered lengths, so that on a fast host their successors do not start together
            # (a batch that empties and refills at once reads as a median rising with the batch).
            lengths = itertools.cycle(range(1500, 2000, 37))
            decoders = load.closed_loop(server.url, clients, 16, 600.0, lambda: {
                "prompt": "decode " * 8, "max_tokens": next(lengths), "stream": True, "stop": stop}, stop=stop)
            try:
                for _ in range(9):  # the decoders' first 20 tokens each, then before each batch 20 more
                    wanted = decoded() + 16 * 20
                    streamed = wait_for(lambda wanted=wanted: decoded() >= wanted, timeout=300, step=0.05)  # type: ignore[misc]
                    assert streamed, f"the decoders streamed {decoded()} tokens in 300 s, {wanted} were awaited"
                    if len(batches) == 8:
                        break
                    sent = time.time()
                    prompts = [load.burst(server.url, clients, 1, prompt=" ".join(rng.choice(WORDS) for _ in range(1800)),
                                          max_tokens=2) for _ in range(together)]
                    for thread in prompts:
                        thread.join(300)
                    batches.append((sent, time.time()))
            finally:
                stop.set()
                decoders.join(300)

        path = record(server, tmp_path / f"hol-{attempt}.jsonl.gz", mixed, interval=1.0)
        needed, bar, prompts_followed, after_prompt, stalls, concentrated = _stalls_after_prompts(
            clients.gaps_s, batches, _itl_bounds(path))
        print(f"run {attempt + 1}: {len(batches)} batches of {together} long prompt(s), {prompts_followed} followed by a "
              f"decoder gap ≥ {bar:.3f} s (twice what the host did at random; a stall is ≥ {needed:.3f} s), "
              f"{after_prompt} of {stalls} stalls after one ({concentrated} batches followed by a stall, counted "
              "where ≥ 90 % of the stalls, and twice the batches' share of the run, followed one)")
        if prompts_followed >= 2 or concentrated >= 2:
            break
        print("retrying: 2 batches followed by such a gap (or by any stall, with ≥ 90 % of the stalls after one) "
              "were needed; sending one more together")
    else:
        pytest.fail(f"in 3 runs the decoders' stalls did not follow the long prompts: {prompts_followed} batches "
                    f"followed by a gap ≥ {bar:.3f} s, {after_prompt} of {stalls} stalls (≥ {needed:.3f} s) after one, "
                    f"{concentrated} batches followed by a stall where ≥ 90 % (and twice the batches' share of the "
                    "run) followed one")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / "recording-head-of-line.jsonl.gz")
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "head_of_line_blocking")
    assert code == 1 and advice(f) == {("--max-num-batched-tokens", "decrease")}, findings
    assert f["evidence"]["itl_worst_interval_p99_seconds"] >= 0.1
    assert "slow_decode" not in [x["id"] for x in findings]


def test_sigstop_of_the_engine_is_a_critical_silent_stall(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    """The EngineCore SIGSTOPped for 8 s under four closed-loop clients of 1,000-token requests. The
    engine publishes its gauges, so a stop between requests reads as an idle server (a busy host's
    recording: 4 clients of 128-token requests, the gauges at 0 running through the whole stop).
    Whether the recording shows requests running through 5 s without tokens is judged from its raw
    gauges; a run where it does not is repeated and says so, three such runs fail."""
    server = condition_servers["cap4"]
    engines = [pid for pid in server.engine_pids() if "EngineCor" in Path(f"/proc/{pid}/comm").read_text()]
    assert engines, "no EngineCore process found"

    def stall() -> None:
        # Four clients keep requests in flight through the stop, however fast the host decodes.
        stop = threading.Event()
        running = load.closed_loop(server.url, load.Clients(), 4, 120.0,
                                   lambda: {"prompt": "block cache token", "max_tokens": 1000}, stop=stop)
        assert wait_for(lambda: (scrape(server).value("num_requests_running") or 0) > 0, step=0.2), \
            "the requests never started"
        os.kill(engines[0], signal.SIGSTOP)
        try:
            time.sleep(8)
        finally:
            os.kill(engines[0], signal.SIGCONT)
        time.sleep(1.0)  # tokens flow again before the clients stop
        stop.set()
        running.join(300)

    for attempt in range(3):
        path = record(server, tmp_path / f"stall-{attempt}.jsonl.gz", stall)
        silent = _seconds_running_without_tokens(path)
        if silent >= 5.0:
            break
        print(f"retrying: the gauges showed requests running without tokens for {silent:.1f} s of the 5 s needed")
    else:
        pytest.fail(f"in 3 runs the gauges never showed requests running without tokens for 5 s (last {silent:.1f} s)")
    code, findings = diagnose_cli("--replay", str(path))
    f = by_id(findings, "silent_stall")
    assert code == 2 and f["severity"] == "critical"
    assert f["evidence"]["seconds_without_tokens"] >= 5 and f["evidence"]["ongoing"] is False


def _seconds_running_without_tokens(path: Path) -> float:
    """The longest time a recording's raw gauges show requests running while the generated-token
    counter stands still: from a scrape with requests running to the last one before the counter
    moves again, every scrape between showing requests running."""
    longest, since, last = 0.0, None, None
    for s in read_recording(path).scrapes():
        if s.snapshot is None:
            continue
        gen, running = s.snapshot.value("generation_tokens"), s.snapshot.value("num_requests_running") or 0
        if running <= 0:
            since = None
        elif since is None or gen != last:
            since = s.ts
        else:
            longest = max(longest, s.ts - since)
        last = gen
    return longest


def test_a_burst_past_the_queue_limit_is_rejected_and_named(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    """40 requests of 512 tokens at once against 4 running and 8 queued at most: the rest are turned
    away, counted as admission rejections and diagnosed with the limit they hit. Whether any was turned
    away is what the clients were answered; a run where none was (a busy host's API server admitted
    128-token requests no faster than the engine finished them: 40 of 40 answered 200) is repeated with
    twice the requests and says so; three such runs fail."""
    server = condition_servers["cap4"]
    for attempt in range(3):
        count, clients = 40 * 2**attempt, load.Clients()
        path = record_while(server.url, tmp_path / f"limit-{attempt}.jsonl.gz",
                            lambda count=count, clients=clients: load.burst(  # type: ignore[misc]
                                server.url, clients, count, prompt="block cache token " * 4, max_tokens=512).join(600))
        rejected = clients.statuses.count(503)
        assert clients.statuses.count(200) + rejected == count, clients.summary()
        if rejected > 0:
            break
        print(f"retrying: {count} requests at once, none turned away; sending {2 * count}")
    else:
        pytest.fail(f"in 3 bursts of up to {count} requests the server turned none away")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / "recording-admission.jsonl.gz")  # to read back when this fails
    code, findings = diagnose_cli("--replay", str(path))
    found = by_id(findings, "admission_rejected")
    # The server's counter agrees with what the clients were answered.
    assert found["evidence"]["admission_rejections"] == {"max_num_queued_reqs": rejected}
    assert "--max-num-queued-reqs" in found["title"]
    assert {(s["flag"], s["direction"]) for s in found["suggestions"]} == {("--max-num-seqs", "increase")}


def test_requests_for_more_adapters_than_max_loras_wait_deferred(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    """8 closed-loop clients, each naming adapter "a" or "b" in turn under --max-loras 1, kept going
    until the server's gauge has shown requests deferred for 7 s (at most 90 s): whichever adapter
    holds the slot, requests for the other wait, however fast the machine (a fixed burst per adapter
    drained in 2.5 s on a fast host; 8 s of clients showed 2.4 s deferred on a busy one). Whether they
    really waited deferred for 4 s is judged from the recording's raw gauge, not from the diagnosis; a
    run where they did not is repeated and says so, three such runs fail the test. The advice is
    --max-loras, never --max-num-seqs."""
    server = condition_servers["lora"]
    seen: list[float] = []
    for attempt in range(3):
        clients, stop = load.Clients(), threading.Event()

        def alternate(clients: load.Clients = clients, stop: threading.Event = stop) -> None:
            turn = iter(range(10**6))
            running = load.closed_loop(server.url, clients, 8, 300.0, lambda: {
                "prompt": "block cache token " * 4, "max_tokens": 96, "model": "a" if next(turn) % 2 else "b"},
                stop=stop)
            _until_seen(server, _deferred, seconds=7.0, limit=90.0)
            stop.set()
            running.join(300)

        path = record_while(server.url, tmp_path / f"lora-{attempt}.jsonl.gz", alternate)
        assert clients.statuses and set(clients.statuses) == {200}, clients.summary()
        seen.append(_seconds_deferred(path))
        if seen[-1] >= 4.0:
            break
        print(f"retrying: the gauge showed requests deferred for {seen[-1]:.1f} s of the 4 s needed")
    else:
        pytest.fail(f"in 3 runs requests never waited deferred for 4 s: {seen}")
    code, findings = diagnose_cli("--replay", str(path))
    found = by_id(findings, "waiting_deferred")
    assert found["evidence"]["max_lora"] == 1 and found["evidence"]["max_num_requests_waiting_deferred"] >= 1
    assert [(s["flag"], s["direction"], s["value"]) for s in found["suggestions"]] == [("--max-loras", "increase", 2)]
    assert not any(s["flag"] == "--max-num-seqs" and s["direction"] == "increase"
                   for f in findings for s in f["suggestions"])


def test_diagnose_a_failed_start_log_alone(tmp_path: Path) -> None:
    code, findings = diagnose_cli("--log", str(ROOT / "tests/fixtures/log-0.32.0-kv-too-small-for-max-model-len.txt"))
    assert code == 2
    assert findings[0]["suggestions"][0] == {
        "flag": "--max-model-len", "direction": "decrease", "value": 1408,
        "why": "vLLM estimates 1,408 tokens fit in the KV memory it has."}


def test_diagnose_live_url_with_budgets(condition_servers: dict[str, VllmServer]) -> None:
    """Closed-loop decoders on the 4-layer model while ``diagnose --url`` collects 4 s with a 5 ms
    ITL budget. vLLM's first ITL bucket ends at 10 ms, and a p95 inside it is only "< 10 ms", never
    over a budget: whether the decode really was that slow is judged from the server's own ITL
    histogram over the collection. A run where it was not is repeated with twice the decoders (up
    to the CPU build's default --max-num-seqs, 128), and says so."""
    server = condition_servers["small"]

    def generated() -> float:
        return scrape(server).value("generation_tokens") or 0.0

    shares: list[float] = []
    for decoders in (32, 64, 128):
        clients, stop = load.Clients(), threading.Event()
        started = generated()
        running = load.closed_loop(server.url, clients, decoders, 120.0,
                                   lambda: {"prompt": "decode " * 8, "max_tokens": 128}, stop=stop)
        assert wait_for(lambda started=started: generated() > started, timeout=120, step=0.2), "decoding never started"
        before = Scrape(time.time(), scrape(server))
        code, findings = diagnose_cli("--url", server.url, "--seconds", "4", "--interval", "0.5",
                                      "--itl-budget-ms", "5")
        after = Scrape(time.time(), scrape(server))
        stop.set()
        running.join(300)
        assert clients.statuses and set(clients.statuses) == {200}, clients.summary()
        itl = histogram_delta([before, after], "inter_token_latency_seconds")
        shares.append(count_above(itl, 0.010) / itl.count if itl is not None and itl.count else 0.0)
        if shares[-1] >= 0.10:
            break
        print(f"retrying: with {decoders} decoders {shares[-1]:.0%} of the server's ITL observations were over "
              "10 ms (10 % needed for a p95 past the first bucket); doubling them")
    else:
        pytest.fail(f"decode never got slower than vLLM's first ITL bucket: shares over 10 ms {shares}")
    f = by_id(findings, "slow_decode")
    assert code == 1 and ("--max-num-seqs", "decrease") in advice(f)


def test_a_killed_engine_core_is_a_death_while_serving_with_the_minute_before(
    condition_servers: dict[str, VllmServer], tmp_path: Path
) -> None:
    """The EngineCore process SIGKILLed under load (as the kernel's OOM killer would): the recording
    and the server's own log, diagnosed together, say the engine died while serving, quote the log
    lines that matter and show the minute before. The module's last test: the cap of 4 dies. Six
    closed-loop clients keep requests in flight, and the kill waits until the recording itself holds
    a scrape with requests running (a busy host's recorder once went 8.7 s without a scrape, while six
    2,000-token requests sent once all finished before the kill)."""
    server = condition_servers["cap4"]
    path = tmp_path / "death.jsonl.gz"
    clients, stop = load.Clients(), threading.Event()
    recorded_running: list[float] = []

    def watch(record: Record) -> None:
        if record.metrics is not None:
            recorded_running.append(parse_snapshot(record.metrics).value("num_requests_running") or 0.0)

    def kill_the_engine_core() -> None:
        running = load.closed_loop(server.url, clients, 6, 300.0, lambda: {
            "prompt": "block cache token " * 4, "max_tokens": 2000, "stream": True}, stop=stop)
        assert wait_for(lambda: max(recorded_running, default=0.0) > 0, timeout=120, step=0.2), \
            "the recording never showed the requests running"
        os.kill(server.engine_core_pid(0), signal.SIGKILL)
        stop.set()
        running.join(60)
        # The API server shuts itself down, seconds later on a fast host (4 s after the kill was not
        # always enough to see one failed scrape): the recording goes on until it has.
        assert server.proc is not None and server.proc.wait(120) is not None

    record_while(server.url, path, kill_the_engine_core, interval=1.0, before=2.0, after=3.0, watch=watch)
    code, findings = diagnose_cli("--replay", str(path), "--log", str(server.log_path))
    assert code == 2, findings
    died = findings[0]
    assert died["id"] == "engine_died", [f["id"] for f in findings]
    assert any("exited unexpectedly" in line for line in died["evidence"]["log_lines"])
    assert any("EngineDeadError" in line for line in died["evidence"]["log_lines"])
    # The requests the clients had in flight, as the server's running gauge showed them: on a busy
    # 2-core host vLLM 0.32's gauges can read low for seconds (never high), so at least one and at
    # most six (a CI rehearsal here saw 1).
    assert 1 <= died["evidence"]["before_max_num_requests_running"] <= 6
    assert "server_down" in [f["id"] for f in findings]
    assert not any(f["id"].startswith("startup_") for f in findings)  # it died serving, not starting
