"""A server that trickles its /metrics body a line at a time (as a server in trouble does) must not
hold the dashboard past its timeout: the timeout bounds the whole request, not each read. Real
sockets on loopback, no mock transport. Each line comes well inside httpx's per-read timeout, and
the whole answer would take 30 s: the server itself notes whether the client hung up on it before
it was done (no stopwatch, so a busy machine cannot fail or pass these by its speed)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from diagnostics.errors import TargetTimeout
from diagnostics.sources.vllm_http import VllmClient

ROOT = Path(__file__).resolve().parents[2]
LINE_EVERY_SECONDS = 0.5
NUM_LINES = 60


@dataclass
class Trickled:
    """What the trickling server saw: its requests, and how each ended."""

    num_requests: int = 0
    hung_up: list[bool] = field(default_factory=list)  # per request: the client left before the end
    ended: threading.Event = field(default_factory=threading.Event)

    def wait_hung_up(self) -> bool:
        """Whether the first request ended with the client gone (waits for it to end)."""
        assert self.ended.wait(2 * LINE_EVERY_SECONDS * NUM_LINES), "the request never ended"
        return self.hung_up[0]


class Trickle(BaseHTTPRequestHandler):
    seen: Trickled

    def write_slowly(self, lines: Iterator[bytes]) -> None:
        self.seen.num_requests += 1
        try:
            for line in lines:
                self.wfile.write(line)
                self.wfile.flush()
                time.sleep(LINE_EVERY_SECONDS)
            self.seen.hung_up.append(False)
        except OSError:
            self.seen.hung_up.append(True)  # the client gave up: that is the point
        self.seen.ended.set()

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.write_slowly(f'vllm:num_requests_running{{model_name="m",engine="0"}} {i}\n'.encode()
                          for i in range(NUM_LINES))

    def log_message(self, *args: object) -> None:
        pass


class TrickleHeaders(Trickle):
    """The status line, then one header line every 0.5 s: slow before any body exists."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        self.write_slowly(f"X-Slow-{i}: yes\r\n".encode() for i in range(NUM_LINES))


def _serve(handler: type[Trickle]) -> Iterator[tuple[str, Trickled]]:
    seen = Trickled()
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (handler,), {"seen": seen}))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def trickling() -> Iterator[tuple[str, Trickled]]:
    yield from _serve(Trickle)


@pytest.fixture
def trickling_headers() -> Iterator[tuple[str, Trickled]]:
    yield from _serve(TrickleHeaders)


def test_a_trickling_body_times_out_within_the_timeout(trickling: tuple[str, Trickled]) -> None:
    url, seen = trickling
    with pytest.raises(TargetTimeout):
        VllmClient(url, timeout_seconds=2.0).metrics_text()
    assert seen.wait_hung_up()


def test_trickling_headers_time_out_within_the_timeout(trickling_headers: tuple[str, Trickled]) -> None:
    """No body is read yet, so only the deadline's timer can end it (httpx's per-read timeout never
    fires on a header every 0.5 s)."""
    url, seen = trickling_headers
    with pytest.raises(TargetTimeout):
        VllmClient(url, timeout_seconds=2.0).metrics_text()
    assert seen.wait_hung_up()


def test_the_cli_gives_up_on_a_trickling_server_with_exit_3(trickling: tuple[str, Trickled]) -> None:
    url, seen = trickling
    result = subprocess.run([sys.executable, "-m", "diagnostics", "status", "--url", url], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    assert "did not answer within" in result.stderr + result.stdout
    # One attempt, cut off, and no more (a collection of several scrapes took 12 s before).
    assert seen.wait_hung_up() and seen.num_requests == 1
