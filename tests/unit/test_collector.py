from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from diagnostics.collector import Collector, register, shared_collector, stop_all
from diagnostics.core.metrics.derive import counter_steps
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import fixture_text


class FakeServer:
    """A MockTransport handler whose behaviour the test switches: up, down, garbage, not vLLM."""

    def __init__(self) -> None:
        self.mode = "up"
        self.metrics_requests = 0
        self.generation = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "down":
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/metrics":
            self.metrics_requests += 1
            if self.mode == "not_vllm":
                return httpx.Response(200, text="node_load1 1\n")
            if self.mode == "truncated":
                return httpx.Response(200, text='vllm:num_requests_running{engine="0",mod')
            self.generation += 100
            text = re.sub(
                r"(vllm:generation_tokens_total\{[^}]*\}) \S+",
                rf"\g<1> {self.generation}",
                fixture_text("metrics-0.32.0-idle.txt"),
            )
            return httpx.Response(200, text=text)
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if request.url.path == "/v1/models":
            return httpx.Response(200, text=fixture_text("models-0.32.0.json"))
        return httpx.Response(200)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(server: FakeServer, clock: Clock, **kw: float) -> Collector:
    client = VllmClient("http://fake:8000", transport=httpx.MockTransport(server))
    return Collector(client, clock=clock, **kw)


def test_down_since_first_failure_and_history_kept_across_the_gap() -> None:
    server, clock = FakeServer(), Clock()
    collector = make(server, clock)
    states = []
    for mode in ("up", "up", "down", "down", "up"):
        server.mode = mode
        collector.scrape_once()
        states.append((collector.status().state, collector.status().since))
        clock.now += 1
    # Down from the first failed scrape (t = 1002) and still "since 1002" at the second one.
    assert states[2:4] == [("down", 1002.0), ("down", 1002.0)]
    history = collector.history()
    assert [s.snapshot is not None for s in history] == [True, True, False, False, True]
    assert "cannot reach" in (history[2].error or "")
    assert collector.status().state == "up" and collector.status().since == 1004.0
    assert all(inc >= 0 for _, _, inc in counter_steps(history, lambda s: s.value("generation_tokens")))


def test_not_vllm_and_garbage_are_states_not_crashes() -> None:
    server, clock = FakeServer(), Clock()
    collector = make(server, clock)
    server.mode = "not_vllm"
    collector.scrape_once()
    assert collector.status().state == "not_vllm"
    server.mode = "truncated"
    collector.scrape_once()
    status = collector.status()
    assert status.state == "down" and "line 1" in (status.error or "")


def test_stale_when_the_last_good_scrape_is_old() -> None:
    server, clock = FakeServer(), Clock()
    collector = make(server, clock)
    collector.scrape_once()
    clock.now += 60
    assert collector.status().state == "stale"


def test_history_is_bounded_by_retention() -> None:
    server, clock = FakeServer(), Clock()
    collector = make(server, clock, interval_seconds=1.0, retention_seconds=10.0)
    for _ in range(50):
        collector.scrape_once()
        clock.now += 1
    history = collector.history()
    assert len(history) <= 11 and history[-1].ts - history[0].ts <= 10


def test_info_is_read_once_and_carried_on_the_first_record() -> None:
    server, clock = FakeServer(), Clock()
    collector = make(server, clock)
    records = []
    collector.add_sink(records.append)
    for _ in range(3):
        collector.scrape_once()
        clock.now += 1
    assert collector.status().info is not None and collector.status().info.model == "tiny"
    assert records[0].info is not None and records[1].info is None


class FakeTime:
    """The collector's pacing on a fake clock: ``sleep`` records each delay and moves the clock on;
    after ``num_intervals`` sleeps ``done`` is set and the loop runs on (slowly) until stopped."""

    def __init__(self, num_intervals: int) -> None:
        self.now = 0.0
        self.num_intervals = num_intervals
        self.delays: list[float] = []
        self.done = threading.Event()

    def monotonic(self) -> float:
        return self.now

    def interval_ends(self) -> None:
        """What the test checks at the end of each interval (nothing here)."""

    def sleep(self, seconds: float) -> None:
        if self.done.is_set():
            time.sleep(0.01)  # past the intervals judged: do not spin while the test stops us
        else:
            self.interval_ends()
            self.delays.append(seconds)
            if len(self.delays) == self.num_intervals:
                self.done.set()
        self.now += seconds


def test_a_scrape_slower_than_the_interval_skips_the_missed_ticks() -> None:
    """The second scrape takes three intervals: the next one follows at once, then the cadence
    resumes from there (no burst of catch-up scrapes)."""
    fake = FakeTime(num_intervals=4)
    server = FakeServer()

    def slow_second(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics" and server.metrics_requests == 1:
            fake.now += 3.0
        return server(request)

    collector = Collector(VllmClient("http://fake:8000", transport=httpx.MockTransport(slow_second)),
                          interval_seconds=1.0, clock=Clock(), monotonic=fake.monotonic, sleep=fake.sleep)
    collector.start()
    try:
        assert fake.done.wait(60)
    finally:
        collector.stop()
    assert fake.delays == [1.0, 0, 1.0, 1.0]


class Intervals(FakeTime):
    """Each interval ends only once every reader has called in during it, so the readers race the
    collector however the scheduler runs the threads; the server's request count is noted then."""

    def __init__(self, num_readers: int, num_intervals: int, counted: Callable[[], int]) -> None:
        super().__init__(num_intervals)
        self.num_readers = num_readers
        self.counted = counted
        self.requests_per_interval: list[int] = []
        self._called_in: set[int] = set()
        self._cond = threading.Condition()

    def call_in(self, reader: int) -> None:
        with self._cond:
            self._called_in.add(reader)
            self._cond.notify_all()

    def interval_ends(self) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self._called_in) == self.num_readers, timeout=60)
            self._called_in.clear()
        self.requests_per_interval.append(self.counted())


def test_many_readers_share_one_scrape_per_interval() -> None:
    """20 readers each ask the process registry for the target's collector, as 20 browser
    sessions do, against a real loopback server that counts its /metrics requests: one collector,
    one request per interval between them, judged interval by interval on a fake clock."""
    payload = fixture_text("metrics-0.32.0-idle.txt").encode()
    counted: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path == "/metrics":
                counted.append(self.path)
            body = payload if self.path == "/metrics" else b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    intervals = Intervals(num_readers=20, num_intervals=8, counted=lambda: len(counted))
    register(Collector(VllmClient(url), interval_seconds=0.25, monotonic=intervals.monotonic,
                       sleep=intervals.sleep))
    seen: set[int] = set()

    def reader(i: int) -> None:
        while not intervals.done.is_set():
            collector = shared_collector(url, None, interval_seconds=0.25)
            seen.add(id(collector))
            collector.history()
            collector.status()
            intervals.call_in(i)

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(20)]
    try:
        for t in readers:
            t.start()
        assert intervals.done.wait(120), intervals.requests_per_interval
    finally:
        intervals.done.set()
        for t in readers:
            t.join()
        stop_all()
        server.shutdown()
        server.server_close()
    assert len(seen) == 1
    # The server answers before the collector sleeps: after interval k it has seen k requests.
    assert intervals.requests_per_interval == list(range(1, 9))


def test_a_401_on_v1_models_is_reported_while_metrics_keep_flowing() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1"):
            return httpx.Response(401)
        return FakeServer()(request)

    client = VllmClient("http://fake:8000", transport=httpx.MockTransport(handler))
    collector = Collector(client, clock=Clock())
    collector.scrape_once()
    status = collector.status()
    assert status.state == "up" and status.info is None
    assert status.info_error is not None and "check the API key" in status.info_error


def test_a_sink_that_fails_is_dropped_and_collection_goes_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from diagnostics.recording import RecordingWriter

    server, clock = FakeServer(), Clock()
    collector = make(server, clock)
    kept: list[object] = []
    writer = RecordingWriter(tmp_path / "cut.jsonl")
    collector.add_sink(writer.write)
    collector.add_sink(kept.append)
    collector.scrape_once()
    writer.close()  # the recording's file goes away under the collector (a full disk, a closed file)
    for _ in range(3):
        clock.now += 1
        collector.scrape_once()
    assert len(kept) == 4 and len(collector.history()) == 4
    assert len(collector.sink_errors) == 1 and "ValueError" in collector.sink_errors[0]
