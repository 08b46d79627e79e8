"""The Fleet page with configured targets and no Prometheus: one row per target from its own
collector — up, down, or answering something that is not vLLM — and each row's link opens that
target by its configured name (a link naming anything else is refused). Real loopback servers:
one answers a real vLLM 0.32 payload, one an HTML page, and nothing listens on the third."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from diagnostics import collector as collector_module
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PAYLOADS = {"/metrics": (FIXTURES / "metrics-0.32.0-burst.txt").read_bytes(),
            "/v1/models": (FIXTURES / "models-0.32.0.json").read_bytes(), "/version": b'{"version": "0.32.0"}'}
DEAD = "http://127.0.0.1:9"


class Vllm(BaseHTTPRequestHandler):
    html = False

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = b"<html><body>login</body></html>" if self.html else PAYLOADS.get(self.path, b"")
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if self.html else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def targets() -> Iterator[dict[str, str]]:
    started = []
    for html in (False, True):
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (Vllm,), {"html": html}))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
    yield {"vllm": f"http://127.0.0.1:{started[0].server_address[1]}", "gone": DEAD,
           "portal": f"http://127.0.0.1:{started[1].server_address[1]}"}
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def app(page: str, configured: dict[str, str], **params: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.switch_page(page)
    at.secrets["allow_custom_targets"] = False
    at.secrets["targets"] = configured
    for key, value in params.items():
        at.query_params[key] = value
    return at


def test_the_fleet_lists_each_configured_target_with_its_state(targets: dict[str, str]) -> None:
    at = app("pages/6_Fleet.py", targets).run()
    assert not at.exception
    # The page started one collector per target; once each has answered (or failed), read again.
    assert wait_for(lambda: all(c.status().num_scrapes >= 2 for c in list(collector_module._REGISTRY.values())) and
                    len(collector_module._REGISTRY) == 3, timeout=30)
    st.cache_data.clear()
    at.run()
    assert not at.exception
    assert not [r for r in at.main.radio if r.label == "Read the fleet from"]  # no Prometheus may be read: no choice
    df = at.dataframe[0].value
    rows = {name: df.iloc[i] for i, name in enumerate(targets)}
    assert rows["vllm"]["up"] == "up" and rows["gone"]["up"] == "DOWN" and rows["portal"]["up"] == "NOT vLLM"
    assert rows["vllm"]["instance"] == targets["vllm"].removeprefix("http://")
    assert list(df.columns)[0] == "name" and list(df["name"]) == list(targets)  # the configured names lead each row
    # A down server has no KV usage: the cell is missing, and the table draws it as a dash, not "None".
    assert df["kv_cache_usage_perc"].isna()[list(targets).index("gone")] and at.dataframe[0].proto.placeholder == "—"
    assert rows["vllm"]["num_requests_running"] > 0  # the recorded payload's burst is running
    assert rows["portal"]["worst finding"].startswith("CRITICAL: Answers, but not as a vLLM server")
    assert rows["gone"]["worst finding"].startswith("CRITICAL: Server unreachable")
    assert [rows[n]["live"] for n in targets] == [f"/Live?target={n}" for n in targets]
    assert rows["portal"]["diagnose"] == "/Diagnose?target=portal"
    assert any(e.value.startswith("2 of 3 replicas") and e.value.endswith(" down") for e in at.error), at.error
    assert any("scraped directly" in c.value for c in at.caption)


def test_a_link_opens_a_configured_target_by_name(targets: dict[str, str]) -> None:
    at = app("pages/1_Live.py", targets, target="portal").run()
    assert not at.exception
    assert at.session_state["target_name"] == "portal"
    assert at.sidebar.selectbox[0].value == "portal"


def test_a_link_to_a_name_not_configured_is_refused(targets: dict[str, str]) -> None:
    at = app("pages/1_Live.py", targets, target="http://evil:8000").run()
    assert not at.exception
    assert any("No configured target is named" in e.value for e in at.error)
    assert at.session_state["target_name"] != "http://evil:8000"


def test_with_a_prometheus_configured_too_the_page_offers_both(targets: dict[str, str]) -> None:
    at = app("pages/6_Fleet.py", {"vllm": targets["vllm"]})
    at.secrets["prometheus_url"] = DEAD
    at.run()
    assert not at.exception
    source = next(r for r in at.main.radio if r.label == "Read the fleet from")
    assert source.value == "Prometheus"  # the operator set one up for the fleet
    assert any("unreachable" in e.value for e in at.error)  # the Prometheus is not there
    source.set_value("configured servers, scraped directly").run()
    assert not at.exception
    assert list(at.dataframe[0].value["live"]) == ["/Live?target=vllm"]


def test_past_the_line_the_page_says_to_use_prometheus() -> None:
    many = {f"s{i}": f"http://127.0.0.{i}:9" for i in range(1, 22)}  # 21 servers, none there
    at = app("pages/6_Fleet.py", many).run()
    assert not at.exception
    assert len(at.dataframe[0].value) == 21
    assert any("21 servers: past 20" in w.value and "Prometheus" in w.value for w in at.warning)


def test_at_the_line_twenty_servers_get_no_warning() -> None:
    """20 is the line the README states: 20 servers are listed without the warning (a sceptic's
    mutation to warn at 20 passed the 21-server test alone)."""
    many = {f"s{i}": f"http://127.0.0.{i}:9" for i in range(1, 21)}  # 20 servers, none there
    at = app("pages/6_Fleet.py", many).run()
    assert not at.exception
    assert len(at.dataframe[0].value) == 20
    assert not any("past 20" in w.value for w in at.warning)
