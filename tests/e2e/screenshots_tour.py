"""The page-by-page tour's screenshots in docs/screenshots/tour-*.png, taken in headless Chromium on
the simulated engine (no GPU, no server needed): the app as a new user starts it, put into the
"KV pressure with preemption" scenario, then every page in turn; the Fleet page on a real
Prometheus scraping two simulated engines (one healthy, one in KV trouble).

Run (it starts Streamlit, Prometheus and Chromium): ``scripts/screenshots.sh``. Every image is a
viewport-sized PNG (the first screen a person sees), checked to be at most 300 KB.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import expect

from diagnostics.sim.server import SimServer
from tests.e2e.shots import OUT, chromium_page, top
from tests.e2e.streamlit_app import streamlit_app
from tests.integration.prometheus_server import PrometheusServer

VIEW = {"width": 1400, "height": 1000}

# (file, path, text that shows the page has drawn what the picture is for, seconds to let charts fill)
TOUR = [
    ("tour-overview.png", "", "Up ·", 5),
    ("tour-live.png", "/Live", "KV-cache block usage", 20),
    ("tour-diagnose.png", "/Diagnose", "KV-cache pressure", 5),
    ("tour-pagedattention.png", "/PagedAttention", "1 · Block size is a trade-off", 3),
    ("tour-capacity.png", "/Capacity", "Check against the attached server", 3),
    ("tour-probe.png", "/Probe", "Probe", 3),
]


def main() -> int:
    healthy = SimServer("healthy", host="127.0.0.1").start()
    hot = SimServer("kv_pressure", host="127.0.0.2").start()
    hosts = [u.split("://", 1)[1] for u in (healthy.url, hot.url)]
    prom = PrometheusServer(hosts).start()
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_URL", "VLLM_API_KEY", "VLLM_GPU_METRICS_URL")}
    env.update({"PROMETHEUS_URL": prom.url, "PROMETHEUS_SELECTOR": '{job="vllm"}'})
    try:
        prom.wait_for_scrapes(20)
        with tempfile.TemporaryDirectory() as tmp, streamlit_app(env, Path(tmp) / "streamlit.log") as url, \
                chromium_page(VIEW["height"], VIEW["width"]) as page:
            page.goto(url)
            expect(page.get_by_text("Up ·").first).to_be_visible()
            page.get_by_role("combobox", name="Scenario").click()
            page.get_by_role("option", name="KV pressure with preemption").click()
            expect(page.get_by_text("KV cache full, requests preempted").first).to_be_visible()
            page.wait_for_timeout(40_000)  # the symptom shows within a minute
            for name, path, ready, settle in TOUR:
                page.goto(url + path)
                expect(page.get_by_text(ready).first).to_be_visible()
                page.wait_for_timeout(settle * 1000)
                top(page, OUT / name)
            page.goto(url + "/Fleet")
            expect(page.get_by_text("127.0.0.2").first).to_be_visible()
            page.wait_for_timeout(5_000)
            top(page, OUT / "tour-fleet.png")
    finally:
        prom.close()
        healthy.stop()
        hot.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
