"""A server that trickles its /metrics body a line at a time (as a server in trouble does) must not
hold the dashboard past its timeout: the timeout bounds the whole request, not each read. Real
sockets on loopback, no mock transport."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from diagnostics.errors import TargetTimeout
from diagnostics.sources.vllm_http import VllmClient

ROOT = Path(__file__).resolve().parents[2]
LINE_EVERY_SECONDS = 1.5


class Trickle(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        try:
            for i in range(20):
                self.wfile.write(f'vllm:num_requests_running{{model_name="m",engine="0"}} {i}\n'.encode())
                self.wfile.flush()
                time.sleep(LINE_EVERY_SECONDS)
        except OSError:
            pass  # the client gave up: that is the point

    def log_message(self, *args: object) -> None:
        pass


class TrickleHeaders(BaseHTTPRequestHandler):
    """The status line, then one header line every 1.5 s: slow before any body exists."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(20):
                self.wfile.write(f"X-Slow-{i}: yes\r\n".encode())
                self.wfile.flush()
                time.sleep(LINE_EVERY_SECONDS)
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def trickling_url() -> Iterator[str]:
    yield from _serve(Trickle)


@pytest.fixture
def trickling_headers_url() -> Iterator[str]:
    yield from _serve(TrickleHeaders)


def test_a_trickling_body_times_out_within_the_timeout(trickling_url: str) -> None:
    client = VllmClient(trickling_url, timeout_seconds=2.0)
    start = time.monotonic()
    with pytest.raises(TargetTimeout):
        client.metrics_text()
    assert time.monotonic() - start < 2.5


def test_trickling_headers_time_out_within_the_timeout(trickling_headers_url: str) -> None:
    client = VllmClient(trickling_headers_url, timeout_seconds=2.0)
    start = time.monotonic()
    with pytest.raises(TargetTimeout):
        client.metrics_text()
    assert time.monotonic() - start < 2.5


def test_the_cli_gives_up_on_a_trickling_server_with_exit_3(trickling_url: str) -> None:
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "diagnostics", "status", "--url", trickling_url], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.stderr
    assert "did not answer within" in result.stderr + result.stdout
    assert elapsed < 8.0  # interpreter start + one 2 s attempt; it took 12 s before
