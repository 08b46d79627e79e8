"""The what-if screenshots in docs/screenshots/, taken in headless Chromium on real corpus
recordings: the Diagnose page's "Find a change that meets the budget" answer on
queue_cap_closed_loop (TTFT budget 2 s), and a head-of-line card on hol_long_prefills, whose window
the replay does not reproduce (no after-value).

Run (it starts Streamlit and Chromium): ``flock /tmp/heavy.lock .venv/bin/python -m tests.e2e.screenshots_whatif``
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

from tests.e2e.conftest import CHROMIUM
from tests.e2e.streamlit_app import streamlit_app

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "screenshots"
INCIDENTS = ROOT / "tests" / "fixtures" / "incidents"


def _recording(page: Page, url: str, recording: Path) -> None:
    page.goto(url + "/Diagnose")
    expect(page.get_by_text("Knob table").first).to_be_visible()
    page.get_by_text("a recording", exact=True).first.click()
    page.locator('input[type="file"]').set_input_files(str(recording))


def _shoot(page: Page, text: str, path: Path, height: int) -> None:
    element = page.get_by_text(text).first
    element.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(1500)
    box = element.bounding_box()
    assert box is not None, text
    top = max(0, box["y"] - 80)
    page.screenshot(path=str(path), clip={"x": 0, "y": top, "width": 1500, "height": min(height, 2400 - top)})
    print("wrote", path)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=120_000)
    env = dict(os.environ)
    env.pop("VLLM_URL", None)
    with tempfile.TemporaryDirectory() as tmp, streamlit_app(env, Path(tmp) / "streamlit.log") as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 2400})
        page.set_default_timeout(120_000)
        _recording(page, url, INCIDENTS / "queue_cap_closed_loop.jsonl.gz")
        expect(page.get_by_text("Queueing at the concurrency cap").first).to_be_visible()
        # The page's own budget (the sidebar has one of the same name for the other pages).
        ttft = page.get_by_test_id("stMainBlockContainer").get_by_role("spinbutton", name="TTFT budget, p95")
        ttft.fill("2000")
        ttft.press("Enter")
        page.wait_for_timeout(3000)
        page.get_by_text("Find a change that meets the budget (the simulated engine").first.click()
        page.get_by_role("button", name="Find a change that meets the budget").click()
        expect(page.get_by_text("Smallest change that meets the budget").first).to_be_visible()
        page.wait_for_timeout(2000)
        _shoot(page, "Find a change that meets the budget (the simulated engine", OUT / "diagnose-goal-seek.png", 700)
        _recording(page, url, INCIDENTS / "hol_long_prefills.jsonl.gz")
        expect(page.get_by_text("does not reproduce this window").first).to_be_visible()
        page.wait_for_timeout(2000)
        _shoot(page, "Head-of-line blocking:", OUT / "diagnose-not-reproduced.png", 900)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
