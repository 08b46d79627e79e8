"""The outcome screenshots in docs/screenshots/, taken in headless Chromium on the simulated engine:
Overview with TTFT and ITL budgets set (the verdict first, goodput, and beside it the failed,
rejected-4xx and given-up shares), and the Fleet table (a real Prometheus scraping two simulated
engines on two loopback hosts and their DCGM endpoints) with the same shares per replica.

One simulated engine also gets prompts beyond its --max-model-len, about one a second, as a client
that does not trim would send them: the simulated API server refuses them with HTTP 400 as vLLM does
and counts them in ``http_requests_total``, so the shares are not all zero.

Run (it starts Streamlit and Chromium): ``flock /tmp/heavy.lock .venv/bin/python -m tests.e2e.screenshots_outcomes``
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

import httpx
from playwright.sync_api import expect

from diagnostics.sim.server import SIM_DCGM_PATH, SimServer
from tests.e2e.shots import OUT, chromium_page, top
from tests.e2e.streamlit_app import streamlit_app
from tests.integration.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
MAX_BYTES = 300_000


def _too_long(server: SimServer, stop: threading.Event) -> None:
    """A client sending prompts one token past the context limit, one a second."""
    words = "word " * (server.sim.scenario.config.max_model_len + 1)
    while not stop.wait(1.0):
        try:
            httpx.post(server.url + "/v1/completions", json={"prompt": words, "max_tokens": 16}, timeout=5)
        except httpx.HTTPError:
            pass


def main() -> int:
    refused = SimServer("healthy", host="127.0.0.1").start()
    hot = SimServer("gpu_thermal_throttle", host="127.0.0.2").start()
    stop = threading.Event()
    client = threading.Thread(target=_too_long, args=(refused, stop), daemon=True)
    client.start()
    hosts = [u.split("://", 1)[1] for u in (refused.url, hot.url)]
    prom = PrometheusServer(hosts, extra_jobs=[("dcgm", SIM_DCGM_PATH, hosts)]).start()
    env = {**os.environ, "VLLM_URL": refused.url, "VLLM_GPU_METRICS_URL": refused.url + SIM_DCGM_PATH,
           "PROMETHEUS_URL": prom.url, "PROMETHEUS_SELECTOR": '{job="vllm"}'}
    try:
        prom.wait_for_scrapes(20)
        with tempfile.TemporaryDirectory() as tmp, streamlit_app(env, Path(tmp) / "streamlit.log") as url, \
                chromium_page(1300) as page:
            page.goto(url)
            for label, value in (("TTFT budget, p95 (ms; 0 = none)", "500"), ("ITL budget, p95 (ms; 0 = none)", "25")):
                box = page.get_by_role("spinbutton", name=label)
                box.fill(value)
                box.press("Enter")
            expect(page.get_by_text("Goodput (within budgets)").first).to_be_visible()
            expect(page.get_by_text("Rejected (4xx)").first).to_be_visible()
            page.wait_for_timeout(30_000)  # a rate window of scrapes, refusals among them
            top(page, OUT / "overview-budgets-outcomes.png", 1000)
            page.goto(url + "/Fleet")
            for label, value in (("ITL budget (ms)", "25"), ("TTFT budget (ms)", "500")):
                box = page.get_by_role("spinbutton", name=label)
                box.fill(value)
                box.press("Enter")
            expect(page.get_by_text("GPUs (dcgm-exporter, through Prometheus)").first).to_be_visible()
            page.wait_for_timeout(15_000)
            top(page, OUT / "fleet-outcomes.png", 1300)
    finally:
        stop.set()
        prom.close()
        refused.stop()
        hot.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
