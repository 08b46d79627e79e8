"""The API key configured for a target (``VLLM_API_KEY``, secrets) goes to that target only: a URL
a viewer types gets no configured key. A real loopback server records the headers it receives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from diagnostics import collector as collector_module
from diagnostics.core.targets import targets_from
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
METRICS = 'vllm:num_requests_running{model_name="m",engine="0"} 1.0\n'


class HeaderRecorder(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        type(self).seen.append(self.headers.get("Authorization"))
        body = METRICS.encode() if self.path == "/metrics" else b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if self.path == "/metrics" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Handler", (HeaderRecorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _scrape_via_app(url: str, *, custom: bool) -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30)
    if custom:
        at.session_state["target_name"] = "custom URL…"
        at.session_state["custom_url"] = url
    at.run()
    assert not at.exception


def test_a_typed_url_never_gets_the_configured_key(
    recorder: tuple[str, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = recorder
    monkeypatch.setenv("VLLM_URL", "http://127.0.0.1:9")  # the configured target: elsewhere
    monkeypatch.setenv("VLLM_API_KEY", "s3cret-for-the-configured-target")
    _scrape_via_app(url, custom=True)
    collector_module.stop_all()
    assert seen, "the typed URL was never scraped"
    assert all(header is None for header in seen), seen


def test_the_configured_target_gets_its_key(
    recorder: tuple[str, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = recorder
    monkeypatch.setenv("VLLM_URL", url)
    monkeypatch.setenv("VLLM_API_KEY", "s3cret-for-the-configured-target")
    _scrape_via_app(url, custom=False)
    collector_module.stop_all()
    assert "Bearer s3cret-for-the-configured-target" in seen


@pytest.mark.parametrize(("value", "allowed", "problem"), [
    (False, False, False), ("false", False, False), ("False", False, False), ("no", False, False),
    (True, True, False), ("true", True, False),
    ("nope", False, True),  # a typo locks down, and says so
])
def test_allow_custom_targets_reads_strings_and_fails_closed(value: object, allowed: bool, problem: bool) -> None:
    config = targets_from({"allow_custom_targets": value, "targets": {"a": "http://h:1"}}, {})
    assert config.allow_custom is allowed
    assert any("allow_custom_targets" in p for p in config.problems) is problem


def test_a_configured_key_follows_its_url_however_it_is_spelled() -> None:
    config = targets_from({"targets": {"a": {"url": "http://h:1", "api_key_env": "K"}}}, {"K": "k"})
    assert config.key_for("HTTP://h:1/") == "k" and config.key_for("h:1") == "k"
    assert config.key_for("http://h:2") is None


def test_a_locked_deployment_never_scrapes_a_typed_url(recorder: tuple[str, list[str | None]]) -> None:
    """allow_custom_targets = "false" (a string, as people write it) in secrets: a custom URL left in
    the session is not scraped, and the sidebar offers only the listed target."""
    url, seen = recorder
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30)
    at.secrets["allow_custom_targets"] = "false"
    at.secrets["targets"] = {"prod": "http://127.0.0.1:9"}
    at.session_state["target_name"] = "custom URL…"
    at.session_state["custom_url"] = url
    at.run()
    assert not at.exception
    collector_module.stop_all()
    assert seen == []
    assert not [t for t in at.sidebar.text_input if t.label == "vLLM URL"]


def test_configured_targets_are_collected_before_any_page_runs(
    recorder: tuple[str, list[str | None]]
) -> None:
    """The flight recorder of `python -m diagnostics serve`: collectors for the configured targets
    start from secrets and the environment alone, with no Streamlit session."""
    from diagnostics.ui.serve import start_flight_recorders

    url, seen = recorder
    started = start_flight_recorders({"targets": {"prod": {"url": url, "api_key": "k-prod"}}}, {})
    try:
        wait_for(lambda: seen)
        assert [c.target for c in started] == [url]
        assert seen and seen[0] == "Bearer k-prod"
        assert collector_module.shared_collector(url, "k-prod") is started[0]  # what the pages will find
    finally:
        collector_module.stop_all()
