"""The Fleet page in a real browser on a real Prometheus (1 s scrapes) over two targets: a real
`vllm serve` and the simulated engine in KV trouble. The table lists both with the trouble on the
right row, the table's link opens that instance's Live and Diagnose views read through Prometheus,
and when Prometheus goes away the page says so and keeps the last answer on screen."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from diagnostics.sim.server import SimServer
from tests.e2e.streamlit_app import streamlit_app
from tests.e2e.test_browser import shoot
from tests.integration import load
from tests.integration.prometheus_server import PrometheusServer
from tests.integration.vllm_server import VllmServer

pytestmark = pytest.mark.integration


def host(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


@pytest.fixture(scope="module")
def fleet(vllm_main: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, PrometheusServer, str, str]]:
    sim = SimServer("kv_pressure").start()
    prom = PrometheusServer([host(vllm_main.url), host(sim.url)]).start()
    env = {**os.environ, "PROMETHEUS_URL": prom.url, "PROMETHEUS_SELECTOR": '{job="vllm"}'}
    env.pop("VLLM_URL", None)
    try:
        prom.wait_for_scrapes(5)
        with streamlit_app(env, tmp_path_factory.mktemp("fleet") / "streamlit.log") as url:
            yield url, prom, host(vllm_main.url), host(sim.url)
    finally:
        prom.close()
        sim.stop()


def grid_row(page: Page, instance: str) -> list[str]:
    """The table row of an instance, from the data grid's accessible cells."""
    cells = page.locator('[role="gridcell"]').all_inner_texts()
    start = cells.index(instance)
    return cells[start:start + 9]


def test_fleet_page_lists_both_and_opens_an_instance(
    page: Page, fleet: tuple[str, PrometheusServer, str, str], vllm_main: VllmServer
) -> None:
    url, prom, real, sim = fleet
    load.completions(vllm_main.url, 8, max_tokens=64)  # the real server has served something
    page.goto(url + "/Fleet")
    expect(page.get_by_text("1 of 2 servers: KV cache full and preempting").first).to_be_visible(timeout=60_000)
    expect(page.locator('[role="gridcell"]').filter(has_text=re.compile(f"^{re.escape(real)}$"))).to_have_count(1)
    sim_row, real_row = grid_row(page, sim), grid_row(page, real)
    assert sim_row[3] == "up" and real_row[3] == "up"
    assert sim_row[4].startswith(("WARNING: KV-cache pressure", "CRITICAL: KV-cache pressure")), sim_row
    assert "KV-cache pressure" not in real_row[4], real_row
    # Beside goodput, the outcome shares: http_requests_total reaches them through Prometheus (without
    # it the rejected and given-up cells say "not counted"), from the real server and the simulated one.
    for row in (real_row, sim_row):
        assert row[6] and row[7] != "not counted" and row[8] != "not counted", row
    expect(page.locator(".js-plotly-plot")).to_have_count(5)
    shoot(page, "fleet.png")

    live_link = real_row[1]
    assert live_link.startswith("/Live?")
    page.goto(url + live_link)
    expect(page.get_by_text(re.compile(rf"Up · {re.escape(real)} \(via Prometheus")).first).to_be_visible()
    expect(page.get_by_text("KV-cache block usage").first).to_be_visible()
    shoot(page, "fleet-instance-live.png")

    assert sim_row[2].startswith("/Diagnose?")
    page.goto(url + sim_row[2])
    expect(page.get_by_text("KV-cache pressure").first).to_be_visible()
    expect(page.get_by_text(re.compile(r"findings over [1-9]\d* scrapes")).first).to_be_visible()
    shoot(page, "fleet-instance-diagnose.png")


def test_prometheus_going_away_keeps_the_last_answer(page: Page, fleet: tuple[str, PrometheusServer, str, str]) -> None:
    url, prom, real, sim = fleet
    page.goto(url + "/Fleet")
    expect(page.locator('[role="gridcell"]').filter(has_text=re.compile(f"^{re.escape(sim)}$"))).to_have_count(1,
                                                                                                                 timeout=60_000)
    prom.stop()
    try:
        expect(page.get_by_text("is unreachable").first).to_be_visible()
        expect(page.get_by_text("Showing what Prometheus answered at").first).to_be_visible()
        expect(page.locator('[role="gridcell"]').filter(has_text=re.compile(f"^{re.escape(sim)}$"))).to_have_count(1)
        shoot(page, "fleet-prometheus-down.png")
    finally:
        prom.start()
