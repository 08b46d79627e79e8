"""The Probe page in a real browser: against the real vllm serve and against the simulated engine,
the confirmation gates the load, the run is drawn over the engine's charts, the results carry the
server's side, and two runs compare before / after."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.e2e.streamlit_app import streamlit_app
from tests.e2e.test_browser import metric_value, shoot

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def app_on_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = dict(os.environ)
    env.pop("VLLM_URL", None)
    with streamlit_app(env, tmp_path_factory.mktemp("probe-sim") / "streamlit.log") as url:
        yield url


def click_until(click: Locator, answer: Callable[[], None], tries: int = 3) -> None:
    """Clicks until ``answer`` (an ``expect``) holds, at most ``tries`` times, saying so each time it
    clicks again. On a busy host a click that lands while the page's script is still on its first
    pass can go unanswered (a rehearsal's run: the "Tick the box" warning never came in 60 s after
    "Start probe"). Only for clicks that are harmless twice: unticked, "Start probe" only warns; once
    a probe runs, the button is disabled."""
    for attempt in range(1, tries + 1):
        click.click()
        try:
            answer()
            return
        except AssertionError:
            if attempt == tries:
                raise
            print(f"click {attempt} on {click} not answered in 20 s: clicking again")


def run_probe(page: Page, shown: str) -> None:
    """Ticks the load's box and starts a probe, until the box reads ticked and then until the page
    shows the probe's progress or ``shown`` (the text its result adds)."""
    start = page.get_by_role("button", name="Start probe")
    expect(start).to_be_visible()
    tick = page.get_by_role("checkbox", name=re.compile("I mean to add this load"))
    click_until(page.get_by_text("I mean to add this load", exact=False).first,
                lambda: expect(tick).to_be_checked(timeout=20_000))
    answered = page.get_by_text(re.compile(rf"\d+ of \d+ finished|{re.escape(shown)}")).first
    click_until(start, lambda: expect(answered).to_be_visible(timeout=20_000))


def test_a_probe_on_the_real_server_over_the_live_charts(page: Page, streamlit_url: str) -> None:
    page.goto(streamlit_url + "/Probe")
    expect(page.get_by_text("I mean to add this load: 8 concurrent clients sending 32 requests").first).to_be_visible()
    # Without the tick, nothing is sent.
    warned = page.get_by_text("Tick the box that names the load first").first
    click_until(page.get_by_role("button", name="Start probe"), lambda: expect(warned).to_be_visible(timeout=20_000))
    expect(page.get_by_text("No probe yet in this session").first).to_be_visible()
    run_probe(page, "Last probe")
    expect(page.get_by_text("Last probe").first).to_be_visible(timeout=120_000)
    assert metric_value(page, "Completed") == "32 / 32"
    assert metric_value(page, "Errors") == "0"
    # The latency table (a data grid: its accessible cells are in the DOM, not "visible").
    cells = page.locator('[role="gridcell"]')
    for row in ("TTFT p50", "ITL p95", "e2e p99"):
        expect(cells.filter(has_text=re.compile(f"^{row}$"))).to_have_count(1)
    expect(page.locator(".js-plotly-plot")).to_have_count(6)  # 3 distributions, 3 engine charts
    # The probe's run is shaded on each engine chart (a rectangle in the shape layer).
    expect(page.locator(".js-plotly-plot .shapelayer path")).to_have_count(3)
    page.wait_for_timeout(1500)
    shoot(page, "probe-real.png")

    run_probe(page, "Before / after")  # a second run: before / after
    expect(page.get_by_text("Before / after").first).to_be_visible(timeout=120_000)
    expect(page.locator('[role="gridcell"]').filter(has_text=re.compile(r"^output tok/s$"))).to_have_count(1)
    # The grid's accessible cells are in the DOM but not "visible" to Playwright: count them.
    changes = page.locator('[role="gridcell"]').filter(has_text=re.compile(r"^[+-]\d+ %"))
    assert changes.count() >= 9, changes.all_inner_texts()  # throughput, rates, TTFT / ITL / e2e percentiles
    shoot(page, "probe-before-after.png")


def test_a_probe_on_the_simulated_engine(page: Page, app_on_sim: str) -> None:
    page.goto(app_on_sim + "/Probe")
    run_probe(page, "Last probe")
    expect(page.get_by_text("Last probe").first).to_be_visible(timeout=120_000)
    assert metric_value(page, "Completed") == "32 / 32"
    shoot(page, "probe-simulated.png")
