"""``python -m diagnostics fleet --url A --url B …`` without Prometheus: each URL gets the API key
configured for that URL (``[targets]`` in the secrets file, ``VLLM_URL`` with ``VLLM_API_KEY``) and
no other — a URL nobody configured gets none, whatever ``VLLM_API_KEY`` holds. Real loopback
servers answer a real vLLM 0.32 payload and record the headers they receive; the CLI runs as a
subprocess, as a person runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
METRICS = (FIXTURES / "metrics-0.32.0-burst.txt").read_bytes()
MODELS = (FIXTURES / "models-0.32.0.json").read_bytes()


class Recorder(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        type(self).seen.append(self.headers.get("Authorization"))
        body, kind = {"/metrics": (METRICS, "text/plain; version=0.0.4"), "/v1/models": (MODELS, "application/json"),
                      "/version": (b'{"version": "0.32.0"}', "application/json")}.get(self.path, (b"", "text/plain"))
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[list[tuple[str, list[str | None]]]]:
    out, started = [], []
    for _ in range(4):
        seen: list[str | None] = []
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (Recorder,), {"seen": seen}))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        out.append((f"http://127.0.0.1:{httpd.server_address[1]}", seen))
    yield out
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def fleet_cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PROMETHEUS_"))}
    return subprocess.run([sys.executable, "-m", "diagnostics", "fleet", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60,
                          env={**clean, "HOME": str(home), "PYTHONPATH": str(ROOT), **env})


def test_each_url_gets_only_its_own_configured_key(tmp_path: Path, servers: list[tuple[str, list[str | None]]]) -> None:
    (a, seen_a), (b, seen_b), (env_url, seen_env), (stranger, seen_stranger) = servers
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text(
        f'[targets]\nprod-a = {{ url = "{a}", api_key = "key-a" }}\n'
        f'prod-b = {{ url = "{b}/", api_key_env = "PROD_B_KEY" }}\n', encoding="utf-8")
    out = fleet_cli(tmp_path, {"PROD_B_KEY": "key-b", "VLLM_URL": env_url, "VLLM_API_KEY": "key-env"},
                    "--url", a, "--url", b, "--url", env_url, "--url", stranger, "--seconds", "2",
                    "--timeout", "30", "--json")  # about keys, not speed: a busy host's scrape may take seconds
    assert out.returncode == 0, out.stderr
    assert seen_a and set(seen_a) == {"Bearer key-a"}
    assert seen_b and set(seen_b) == {"Bearer key-b"}  # a configured URL spelled with a trailing slash
    assert seen_env and set(seen_env) == {"Bearer key-env"}
    assert seen_stranger and set(seen_stranger) == {None}  # VLLM_API_KEY is VLLM_URL's key, not anyone's
    report = json.loads(out.stdout)
    assert report["source"] == "direct"
    rows = report["instances"]
    assert [r["name"] for r in rows] == ["prod-a", "prod-b", "VLLM_URL", stranger]
    assert all(r["up"] is True and r["state"] == "up" for r in rows)
    assert "key-" not in out.stdout + out.stderr


def test_no_url_reads_every_configured_target(tmp_path: Path, servers: list[tuple[str, list[str | None]]]) -> None:
    (a, seen_a), (b, seen_b), _, _ = servers
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text(f'[targets]\none = "{a}"\ntwo = "{b}"\n', encoding="utf-8")
    out = fleet_cli(tmp_path, {}, "--seconds", "1.5")
    assert out.returncode == 0, out.stderr
    assert seen_a and seen_b
    lines = out.stdout.splitlines()
    assert lines[0].startswith("instance") and len([ln for ln in lines if ln.startswith("127.0.0.1:")]) == 2


def test_a_down_url_is_its_own_row(tmp_path: Path, servers: list[tuple[str, list[str | None]]]) -> None:
    (a, _), _, _, _ = servers
    out = fleet_cli(tmp_path, {}, "--url", a, "--url", "http://127.0.0.1:9", "--seconds", "1.5", "--json")
    assert out.returncode == 0, out.stderr
    up, down = json.loads(out.stdout)["instances"]
    assert up["up"] is True and up["num_requests_running"] is not None
    assert down["up"] is False and down["state"] == "down" and down["worst_finding"]["id"] == "server_down"
    assert "Connection refused" in (down["detail"] or "")


@pytest.mark.parametrize(("args", "why"), [
    (("--url", "http://127.0.0.1:9", "--prometheus", "http://127.0.0.1:9"), "not both"),
    (("--url", "http://127.0.0.1:9", "--since", "1h"), "--since goes with --prometheus"),
    (("--url", "ftp://x"), "not an http(s) URL"),
    ((), "fleet needs --url"),
])
def test_usage_errors(tmp_path: Path, args: tuple[str, ...], why: str) -> None:
    out = fleet_cli(tmp_path, {}, *args, "--seconds", "1")
    assert out.returncode == 2 and why in out.stderr, out.stderr


def test_the_same_server_given_twice_is_one_row(tmp_path: Path, servers: list[tuple[str, list[str | None]]]) -> None:
    """``--url A --url A/``: one server, one collector, one row (a sceptic's mutation that stopped
    removing duplicates passed every other test)."""
    (a, _), _, _, _ = servers
    out = fleet_cli(tmp_path, {}, "--url", a, "--url", a + "/", "--seconds", "1.5", "--json")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["instances"]) == 1


def test_a_server_slower_than_the_window_is_read_once_it_answers(tmp_path: Path) -> None:
    """A server that takes 2 s to answer each request, a 1 s window: its first scrape is still in flight
    when the window ends; the CLI waits for it (up to its timeout) and reports the server up, not unseen."""
    class Slow(Recorder):
        seen: list[str | None] = []

        def do_GET(self) -> None:  # noqa: N802
            time.sleep(2.0)
            super().do_GET()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        out = fleet_cli(tmp_path, {}, "--url", url, "--seconds", "1", "--timeout", "10", "--json")
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)["instances"]
        assert [(r["up"], r["state"]) for r in rows] == [(True, "up")]
    finally:
        httpd.shutdown()
        httpd.server_close()
