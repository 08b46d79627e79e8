"""A Fleet-table link (``/Live?prometheus=…&instance=…``) opens that instance as the target, read
through Prometheus — but a locked deployment follows links only to its configured Prometheus, and
a selector smuggled into the link must still be label matchers."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from diagnostics.core.targets import PrometheusInstance

ROOT = Path(__file__).resolve().parents[2]
CONFIGURED = "http://127.0.0.1:9"  # nothing listens: the page must still lay out, saying so


def live(**params: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30)
    at.switch_page("pages/1_Live.py")
    for key, value in params.items():
        at.query_params[key] = value
    return at


def test_a_link_opens_the_instance_through_prometheus() -> None:
    at = live(prometheus=CONFIGURED, instance="vllm-3:8000", selector='{job="vllm"}', model="m").run()
    assert not at.exception
    opened = at.session_state["prometheus_instance"]
    assert opened == PrometheusInstance(CONFIGURED, 'job="vllm"', "vllm-3:8000", "m")
    assert at.sidebar.selectbox[0].value == "vllm-3:8000 · via Prometheus"
    # Prometheus is not there: the banner says so (down, naming Prometheus), nothing crashes.
    assert at.error and "**Down** · `vllm-3:8000 (via Prometheus" in at.error[0].value
    assert "is unreachable" in at.error[0].value


def test_a_locked_deployment_follows_links_to_its_own_prometheus_only() -> None:
    at = live(prometheus="http://elsewhere:9090", instance="x:8000")
    at.secrets["allow_custom_targets"] = False
    at.secrets["prometheus_url"] = CONFIGURED
    at.secrets["targets"] = {"prod": "http://127.0.0.1:9"}
    at.run()
    assert not at.exception
    assert any("only reads its configured Prometheus" in e.value for e in at.error)
    assert "prometheus_instance" not in at.session_state

    at = live(prometheus=CONFIGURED, instance="x:8000")
    at.secrets["allow_custom_targets"] = False
    at.secrets["prometheus_url"] = CONFIGURED
    at.secrets["targets"] = {"prod": "http://127.0.0.1:9"}
    at.run()
    assert at.session_state["prometheus_instance"].instance == "x:8000"


def test_a_selector_in_a_link_must_be_label_matchers() -> None:
    at = live(prometheus=CONFIGURED, instance="x:8000", selector='{job="a"} or vector(1)').run()
    assert not at.exception
    assert any("selector" in e.value for e in at.error)
    assert "prometheus_instance" not in at.session_state
