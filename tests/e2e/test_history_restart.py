"""A dashboard killed (SIGKILL) after an incident and started again shows and diagnoses it: the
simulated engine runs out of KV cache with `python -m diagnostics serve` collecting it into the
history store; the dashboard is killed, the engine goes away, and the restarted dashboard's Live page
keeps the scrapes from before its restart and its Diagnose page names the KV-cache pressure."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from diagnostics.sim.server import SimServer
from tests.conftest import wait_for
from tests.e2e.conftest import new_page
from tests.e2e.streamlit_app import streamlit_app
from tests.e2e.test_browser import shoot
from tests.integration.vllm_server import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _stored(data: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{data / 'history.sqlite'}?mode=ro", uri=True)
        (n,) = conn.execute("SELECT coalesce(sum(num_rows), 0) FROM chunks WHERE tier = 0").fetchone()
        conn.close()
        return int(n)
    except sqlite3.Error:
        return 0


def test_a_dashboard_restarted_after_an_incident_shows_and_diagnoses_it(browser: Browser, tmp_path: Path) -> None:
    data = tmp_path / "history"
    sim = SimServer("kv_pressure", speed=5.0).start()
    env = {**{k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}, "VLLM_URL": sim.url,
           "VLLM_TRIAGE_DATA_DIR": str(data)}
    first = subprocess.Popen([sys.executable, "-m", "diagnostics", "serve", "--server.port", str(free_port()),
                              "--server.address", "127.0.0.1", "--server.headless", "true"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # Thirty scrapes committed (batches of 5 s): the KV cache fills within them at 5× speed.
        assert wait_for(lambda: _stored(data) >= 30, timeout=180, step=0.5), "the dashboard stored nothing"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        sim.stop()  # the server is gone too: what it did is only in the store now
    stored = _stored(data)
    with streamlit_app(env, tmp_path / "again.log") as url:
        log = (tmp_path / "again.log").read_text(errors="replace")
        assert "(history from " in log, log[-2000:]
        page = new_page(browser)
        try:
            page.goto(url + "/Live")
            caption = page.get_by_text(re.compile(r"\d+ scrapes kept")).first
            expect(caption).to_be_visible()
            kept = int(re.search(r"(\d+) scrapes kept", caption.inner_text()).group(1))  # type: ignore[union-attr]
            assert kept >= stored, (kept, stored)
            expect(page.get_by_text("History store: from").first).to_be_visible()
            page.goto(url + "/Diagnose")
            expect(page.get_by_text(re.compile("KV-cache pressure")).first).to_be_visible()
            page.wait_for_timeout(2000)
            shoot(page, "history-restart-diagnose.png")
        finally:
            page.close()
