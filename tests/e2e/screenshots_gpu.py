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

from playwright.sync_api import expect

from diagnostics.sim.server import SIM_DCGM_PATH, SimServer
from tests.e2e.shots import OUT, chromium_page, section, top
from tests.e2e.streamlit_app import streamlit_app
from tests.integration.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    healthy = SimServer("healthy", host="127.0.0.1").start()
    hot = SimServer("gpu_thermal_throttle", host="127.0.0.2").start()
    hosts = [u.split("://", 1)[1] for u in (healthy.url, hot.url)]
    prom = PrometheusServer(hosts, extra_jobs=[("dcgm", SIM_DCGM_PATH, hosts)]).start()
    env = {**os.environ, "PROMETHEUS_URL": prom.url, "PROMETHEUS_SELECTOR": '{job="vllm"}'}
    env.pop("VLLM_URL", None)
    try:
        prom.wait_for_scrapes(20)
        with tempfile.TemporaryDirectory() as tmp, streamlit_app(env, Path(tmp) / "streamlit.log") as url, \
                chromium_page() as page:
            page.goto(url + "/Live")  # the app's own simulated engine, healthy
            expect(page.get_by_text("GPU health", exact=True).first).to_be_visible()
            page.wait_for_timeout(25_000)
            section(page, "GPU health", OUT / "live-gpu-panel-healthy.png", 1150, exact=True)
            page.get_by_role("combobox", name="Scenario").click()
            page.get_by_role("option", name="GPU thermally throttled").click()
            expect(page.get_by_text("is throttled now").first).to_be_visible()
            page.wait_for_timeout(25_000)
            section(page, "GPU health", OUT / "live-gpu-panel-throttled.png", 1250, exact=True)
            page.goto(url + "/Fleet")
            expect(page.get_by_text("GPUs (dcgm-exporter, through Prometheus)").first).to_be_visible()
            expect(page.get_by_text("throttled:").first).to_be_visible()
            page.wait_for_timeout(5_000)
            top(page, OUT / "fleet-dcgm.png", 1600)
    finally:
        prom.close()
        healthy.stop()
        hot.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
