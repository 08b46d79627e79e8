"""History starts when the dashboard starts, not when someone opens the page: a target configured
by VLLM_URL is collected from app start. The simulated target counts the scrapes it answers, and
Chromium opens the page only once it has answered 7 with nobody looking."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from diagnostics.sim.server import SimServer
from tests.conftest import wait_for
from tests.e2e.conftest import new_page
from tests.e2e.streamlit_app import streamlit_app
from tests.e2e.test_browser import shoot

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    server = SimServer("healthy").start()
    yield server
    server.stop()


def test_a_configured_target_is_collected_before_anyone_opens_the_page(
    browser: Browser, sim: SimServer, tmp_path: Path  # noqa: F811
) -> None:
    answered: list[str] = []
    metrics_text = sim.sim.metrics_text

    def counted() -> str:
        answered.append("scrape")
        return metrics_text()

    sim.sim.metrics_text = counted  # type: ignore[method-assign]
    env = {**{k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}, "VLLM_URL": sim.url}
    with streamlit_app(env, tmp_path / "streamlit.log") as url:
        page = new_page(browser)
        try:
            assert wait_for(lambda: len(answered) >= 7, timeout=120), "the dashboard never collected on its own"
            before_anyone_looked = len(answered)
            page.goto(url + "/Live")
            caption = page.get_by_text(re.compile(r"\d+ scrapes kept")).first
            expect(caption).to_be_visible()
            kept = int(re.search(r"(\d+) scrapes kept", caption.inner_text()).group(1))  # type: ignore[union-attr]
            assert kept >= before_anyone_looked, caption.inner_text()
            expect(page.get_by_text("KV-cache block usage").first).to_be_visible()
            page.wait_for_timeout(2000)  # let the charts finish drawing before the screenshot
            shoot(page, "flight-recorder-live.png")
        finally:
            page.close()
            sim.sim.metrics_text = metrics_text  # type: ignore[method-assign]
