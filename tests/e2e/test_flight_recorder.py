"""History starts when the dashboard starts, not when someone opens the page: a target configured
by VLLM_URL is collected from app start (Chromium opens the page only after 8 s)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from diagnostics.sim.server import SimServer
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
    env = {**{k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}, "VLLM_URL": sim.url}
    with streamlit_app(env, tmp_path / "streamlit.log") as url:
        page = browser.new_page(viewport={"width": 1500, "height": 2400})
        try:
            page.wait_for_timeout(8000)  # nobody is looking yet
            page.goto(url + "/Live")
            caption = page.get_by_text(re.compile(r"\d+ scrapes kept")).first
            expect(caption).to_be_visible(timeout=30_000)
            kept = int(re.search(r"(\d+) scrapes kept", caption.inner_text()).group(1))  # type: ignore[union-attr]
            assert kept >= 7, caption.inner_text()
            expect(page.get_by_text("KV-cache block usage").first).to_be_visible(timeout=30_000)
            page.wait_for_timeout(2000)  # let the charts finish drawing before the screenshot
            shoot(page, "flight-recorder-live.png")
        finally:
            page.close()
