"""The GPU health screenshots in docs/screenshots/, taken in headless Chromium on the simulated
engine (no GPU here): the Live page's GPU panel, healthy and thermally throttled (the app's own
simulated engine, its /dcgm/metrics as the GPU metrics URL), and the Fleet page on a real Prometheus
scraping two simulated engines on two loopback hosts and their DCGM endpoints as a dcgm-exporter job.

Run (it starts Streamlit and Chromium): ``flock /tmp/heavy.lock .venv/bin/python -m tests.e2e.screenshots_gpu``
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

from diagnostics.sim.server import SIM_DCGM_PATH, SimServer
from tests.e2e.conftest import CHROMIUM
from tests.e2e.streamlit_app import streamlit_app
from tests.integration.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "screenshots"


def _section(page: Page, heading: str, path: Path, height: int) -> None:
    """From ``heading`` down ``height`` pixels (Streamlit scrolls its own container, not the page:
    the heading is scrolled to the top of the viewport first)."""
    element = page.get_by_text(heading, exact=True).first
    element.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(1500)
    box = element.bounding_box()
    assert box is not None, heading
    top = max(0, box["y"] - 60)
    page.screenshot(path=str(path), clip={"x": 0, "y": top, "width": 1500, "height": min(height, 2400 - top)})
    print("wrote", path)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=120_000)
    healthy = SimServer("healthy", host="127.0.0.1").start()
    hot = SimServer("gpu_thermal_throttle", host="127.0.0.2").start()
    hosts = [u.split("://", 1)[1] for u in (healthy.url, hot.url)]
    prom = PrometheusServer(hosts, extra_jobs=[("dcgm", SIM_DCGM_PATH, hosts)]).start()
    env = {**os.environ, "PROMETHEUS_URL": prom.url, "PROMETHEUS_SELECTOR": '{job="vllm"}'}
    env.pop("VLLM_URL", None)
    try:
        prom.wait_for_scrapes(20)
        with tempfile.TemporaryDirectory() as tmp, streamlit_app(env, Path(tmp) / "streamlit.log") as url, \
                sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1500, "height": 2400})
            page.set_default_timeout(120_000)
            page.goto(url + "/Live")  # the app's own simulated engine, healthy
            expect(page.get_by_text("GPU health", exact=True).first).to_be_visible()
            page.wait_for_timeout(25_000)
            _section(page, "GPU health", OUT / "live-gpu-panel-healthy.png", 1150)
            page.get_by_role("combobox", name="Scenario").click()
            page.get_by_role("option", name="GPU thermally throttled").click()
            expect(page.get_by_text("is throttled now").first).to_be_visible()
            page.wait_for_timeout(25_000)
            _section(page, "GPU health", OUT / "live-gpu-panel-throttled.png", 1250)
            page.goto(url + "/Fleet")
            expect(page.get_by_text("GPUs (dcgm-exporter, through Prometheus)").first).to_be_visible()
            expect(page.get_by_text("throttled:").first).to_be_visible()
            page.wait_for_timeout(5_000)
            page.screenshot(path=str(OUT / "fleet-dcgm.png"), full_page=True)
            print("wrote", OUT / "fleet-dcgm.png")
            browser.close()
    finally:
        prom.close()
        healthy.stop()
        hot.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
