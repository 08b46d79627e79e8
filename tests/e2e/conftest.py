"""The browser fixtures every e2e test shares: Debian's Chromium under Playwright, one per module,
and the dashboard configured for the real server, one for the whole session (a Streamlit start
is seconds of a busy host's time). A page whose test changes process-wide state (the simulated
engine's scenario) gets a dashboard of its own.

Every wait for the page is a minute by default (Playwright's 5 s measured the host's load, not the
app: a busy 2-core machine renders a page of charts in tens of seconds); a wait is never the claim."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.e2e.streamlit_app import streamlit_app
from tests.integration.vllm_server import VllmServer

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR", ROOT / "test-artifacts"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium (./scripts/test.sh does)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        yield b
        b.close()


def new_page(browser: Browser) -> Page:
    """A tall page (every chart of a page in one screenshot) that waits as long as ``expect`` does."""
    pg = browser.new_page(viewport={"width": 1500, "height": 2400})
    pg.set_default_timeout(WAIT_MS)
    return pg


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    pg = new_page(browser)
    yield pg
    pg.close()




@pytest.fixture(scope="session")
def streamlit_url(vllm_main: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard configured for the real server (VLLM_URL), no API key."""
    env = {**os.environ, "VLLM_URL": vllm_main.url}
    env.pop("VLLM_API_KEY", None)
    with streamlit_app(env, tmp_path_factory.mktemp("streamlit") / "streamlit.log") as url:
        yield url
