"""The what-if screenshots in docs/screenshots/, taken in headless Chromium on real corpus
recordings: the Diagnose page's "Find a change that meets the budget" answer on
queue_cap_closed_loop (TTFT budget 2 s), a KV-pressure card on the held-out ho_kv_bytes_wide,
whose window the replay does not reproduce (no after-value), and the queue card of the validation's
queue_cap_burst recording, whose cap raise runs more streams than the window did (the TTFT range
grows the API server's share, and the caption says so).

Run (it starts Streamlit and Chromium): ``flock /tmp/heavy.lock .venv/bin/python -m tests.e2e.screenshots_whatif``
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.e2e.shots import OUT, chromium_page, diagnose_with_cap, section
from tests.e2e.streamlit_app import streamlit_app

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "tests" / "fixtures" / "incidents"


def _recording(page: Page, url: str, recording: Path) -> None:
    page.goto(url + "/Diagnose")
    expect(page.get_by_text("Knob table").first).to_be_visible()
    page.get_by_text("a recording", exact=True).first.click()
    page.locator('input[type="file"]').set_input_files(str(recording))


def token_budget_card(page: Page, url: str) -> None:
    """The held-out token-budget queue (issue 41) with the server's --max-num-seqs 8 typed into the
    sidebar: the cause named, the seat cap ruled out by the running count, no --max-num-seqs change."""
    cap = diagnose_with_cap(page, url, INCIDENTS / "heldout" / "alt_queue_token_budget_h8.jsonl.gz", 8)
    expect(page.get_by_text("Ruled out", exact=True).first).to_be_visible()
    page.wait_for_timeout(2000)
    section(page, "Queueing at the token budget", OUT / "diagnose-token-budget.png", 1060, above=30)
    cap.fill("0")
    cap.press("Enter")


def main() -> int:
    env = dict(os.environ)
    env.pop("VLLM_URL", None)
    with tempfile.TemporaryDirectory() as tmp, streamlit_app(env, Path(tmp) / "streamlit.log") as url, \
            chromium_page() as page:
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
        section(page, "Find a change that meets the budget (the simulated engine", OUT / "diagnose-goal-seek.png", 700, above=80)
        _recording(page, url, INCIDENTS / "heldout" / "ho_kv_bytes_wide.jsonl.gz")
        expect(page.get_by_text("does not reproduce this window").first).to_be_visible()
        page.wait_for_timeout(2000)
        section(page, "KV-cache pressure:", OUT / "diagnose-not-reproduced.png", 900, above=80)
        _recording(page, url, ROOT / "bench" / "whatif_runs" / "2026-12-06" / "queue_cap_burst-before.jsonl.gz")
        expect(page.get_by_text("so the TTFT range also grows that share").first).to_be_visible()
        page.wait_for_timeout(2000)
        section(page, "Predicted:", OUT / "diagnose-api-server-share.png", 600, above=460)
        token_budget_card(page, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
