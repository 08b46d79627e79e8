"""The Prometheus adapter against real sockets on loopback: a Prometheus that trickles its answer
is cut off at the whole-request deadline (not per read), garbage is a clear error, a closed port
says unreachable. (The real Prometheus is in tests/integration/test_prometheus.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from diagnostics.errors import BadPayload, TargetTimeout, TargetUnreachable
from diagnostics.sources.prometheus import PrometheusClient
from tests.integration.vllm_server import free_port


class Trickle(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            for ch in '{"status":"success","data":{"resultType":"vector","result":[]}}':
                self.wfile.write(ch.encode())
                self.wfile.flush()
                time.sleep(0.4)  # each byte well inside any per-read timeout
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


class Garbage(Trickle):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>a login page</html>")


def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def trickling() -> Iterator[str]:
    yield from serve(Trickle)


@pytest.fixture
def garbage() -> Iterator[str]:
    yield from serve(Garbage)


def test_a_trickling_prometheus_is_cut_off_at_the_deadline(trickling: str) -> None:
    """The whole answer would take 26 s and each byte comes well inside the per-read timeout:
    only the whole-request deadline raises this (no stopwatch: a busy machine must not decide)."""
    client = PrometheusClient(trickling, timeout_seconds=2.0)
    with pytest.raises(TargetTimeout, match="did not answer a query within 2 s"):
        client.query("up")


def test_garbage_is_a_clear_error(garbage: str) -> None:
    with pytest.raises(BadPayload, match="no usable answer"):
        PrometheusClient(garbage, timeout_seconds=2.0).query("up")


def test_a_closed_port_is_unreachable() -> None:
    with pytest.raises(TargetUnreachable, match="unreachable: connection refused"):
        PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout_seconds=2.0).query("up")


def test_the_scrape_interval_falls_back_when_there_is_no_targets_api(garbage: str) -> None:
    assert PrometheusClient(garbage, timeout_seconds=2.0).scrape_interval() == 15.0
