"""Rerun benchmark: server-side time of one live-panel rerun with 1 h of 1 s history (as a
fraction of the refresh interval), and /metrics requests that reach a real vLLM per interval with
10 browser sessions open on the live page.

    .venv/bin/python bench/rerun.py              # starts a real vllm serve + streamlit + 10 Chromium tabs
    .venv/bin/python bench/rerun.py --no-server  # the rerun timing only

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import CountingProxy  # noqa: E402
from diagnostics.collector import Collector, register, stop_all  # noqa: E402
from diagnostics.core.metrics.catalog import parse_snapshot  # noqa: E402
from diagnostics.core.metrics.derive import Scrape  # noqa: E402
from diagnostics.sources.vllm_http import VllmClient  # noqa: E402

PAYLOAD = ROOT / "tests" / "fixtures" / "metrics-0.32.0-burst.txt"
REFRESH_SECONDS = 2.0


def hour_of_history() -> list[Scrape]:
    text = PAYLOAD.read_text()
    now = time.time()
    out = []
    for i in range(3600):
        varied = re.sub(
            r"^(vllm:(?:generation|prompt)_tokens_total\{[^}]*\}) (\S+)",
            lambda m, i=i: f"{m.group(1)} {float(m.group(2)) + 150 * i}",
            text,
            flags=re.M,
        )
        varied = re.sub(
            r"^(vllm:kv_cache_usage_perc\{[^}]*\}) (\S+)", lambda m, i=i: f"{m.group(1)} {(i % 100) / 100}",
            varied, flags=re.M,
        )
        out.append(Scrape(now - 3600 + i, parse_snapshot(varied)))
    return out


def bench_rerun() -> None:
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    history = hour_of_history()
    url = "http://bench.invalid:8000"
    collector = Collector(VllmClient(url), interval_seconds=1.0)
    collector._history.extend(history)  # noqa: SLF001 - a bench pre-fills an hour without waiting an hour
    with collector._lock:  # noqa: SLF001
        collector._state = "up"  # noqa: SLF001
    collector.start = lambda: collector  # type: ignore[method-assign]  # no scraping of a fake URL
    register(collector)
    times = []
    for window in ("1 h", "15 min"):
        runs = []
        for _ in range(4):
            at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
            at.switch_page("pages/1_Live.py")
            at.session_state["custom_url"] = url
            at.session_state["window_seconds"] = window
            t0 = time.perf_counter()
            at.run()
            runs.append(time.perf_counter() - t0)
            assert not at.exception, at.exception
        best = statistics.median(runs[1:])
        times.append((window, best))
    for window, seconds in times:
        print(
            f"live page rerun, 1 h of 1 s history kept, {window} window shown: {seconds * 1000:7.0f} ms "
            f"= {seconds / REFRESH_SECONDS:.1%} of the {REFRESH_SECONDS:g} s default refresh"
        )
    stop_all()
    st.cache_resource.clear()


def bench_sessions(sessions: int = 10, seconds: float = 20.0) -> None:
    from playwright.sync_api import sync_playwright

    from tests.integration.vllm_server import VllmServer, build_tiny_model, free_port

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = VllmServer(build_tiny_model(work / "model"), work).start()
        streamlit = None
        try:
            server.wait_ready()
            proxy = CountingProxy(server.url)
            port = free_port()
            env = {**os.environ, "VLLM_URL": proxy.url}
            streamlit = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                 "--server.headless", "true"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    if httpx.get(base + "/_stcore/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path="/usr/bin/chromium",
                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"],
                )
                pages = []
                for _ in range(sessions):
                    page = browser.new_page()
                    page.goto(base + "/Live")
                    pages.append(page)
                for page in pages:
                    page.get_by_text("KV-cache block usage").first.wait_for(timeout=60_000)
                start = proxy.count
                time.sleep(seconds)
                counted = proxy.count - start
                browser.close()
            print(
                f"{sessions} browser sessions on the live page for {seconds:.0f} s: {counted} /metrics requests "
                f"reached the server = {counted / seconds:.2f} per 1 s collector interval"
            )
        finally:
            if streamlit is not None:
                streamlit.terminate()
                streamlit.wait(10)
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-server", action="store_true")
    args = parser.parse_args()
    bench_rerun()
    if not args.no_server:
        bench_sessions()


if __name__ == "__main__":
    main()
