"""The Fleet page in a real browser with no Prometheus at all: four targets configured under
``[targets]`` (the user's ``~/.streamlit/secrets.toml``, read by the flight recorder and by
Streamlit alike) — the session's real ``vllm serve`` (``vllm_main``), the simulated engine healthy,
the simulated engine in KV trouble, and a port where nothing listens. One collector per target,
started with the dashboard: the table lists all four with the trouble on the right row and the
down target on its own, and a row's links open that target's Live and Diagnose views by name."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from diagnostics.sim.server import SimServer
from tests.e2e.streamlit_app import streamlit_app
from tests.e2e.test_browser import shoot
from tests.integration import load
from tests.integration.vllm_server import VllmServer, free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "screenshots" / "fleet-direct.png"
NAMES = ("real-vllm", "sim-healthy", "sim-kv-pressure", "gone")


def host(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


@pytest.fixture(scope="module")
def fleet(vllm_main: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    healthy, hot = SimServer("healthy").start(), SimServer("kv_pressure").start()
    urls = dict(zip(NAMES, (vllm_main.url, healthy.url, hot.url, f"http://127.0.0.1:{free_port()}")))
    home = tmp_path_factory.mktemp("home")
    (home / ".streamlit").mkdir()
    (home / ".streamlit" / "secrets.toml").write_text(
        "allow_custom_targets = false\n[targets]\n" + "".join(f'{n} = "{u}"\n' for n, u in urls.items()),
        encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_URL", "VLLM_API_KEY", "PROMETHEUS_"))}
    env["HOME"] = str(home)
    try:
        with streamlit_app(env, home / "streamlit.log") as url:
            yield url, urls
    finally:
        healthy.stop()
        hot.stop()


def grid_row(page: Page, instance: str) -> list[str]:
    """The table row of an instance, from the data grid's accessible cells."""
    cells = page.locator('[role="gridcell"]').all_inner_texts()
    start = cells.index(instance)
    return cells[start:start + 6]


def test_the_direct_fleet_lists_every_target_with_the_trouble_on_its_row(
    page: Page, fleet: tuple[str, dict[str, str]], vllm_main: VllmServer
) -> None:
    url, urls = fleet
    load.completions(vllm_main.url, 8, max_tokens=64)  # the real server has served something
    page.goto(url + "/Fleet")
    expect(page.get_by_text(re.compile(r"1 of 4 servers: KV cache full and preempting")).first).to_be_visible(
        timeout=120_000)
    expect(page.get_by_text("scraped directly, one collector each").first).to_be_visible()
    expect(page.get_by_text("1 of 4 servers: down", exact=True)).to_have_count(1)
    expect(page.get_by_text("down in this window")).to_have_count(0)  # down now is said once
    for name in NAMES:
        expect(page.locator('[role="gridcell"]').filter(has_text=re.compile(f"^{re.escape(host(urls[name]))}$"))
               ).to_have_count(1)
    rows = {name: grid_row(page, host(urls[name])) for name in NAMES}
    cells = page.locator('[role="gridcell"]').all_inner_texts()
    assert [cells[cells.index(host(urls[name])) - 1] for name in NAMES] == list(NAMES)  # each row leads with its name
    hot = rows["sim-kv-pressure"]
    assert hot[3] == "up" and hot[4].startswith(("WARNING: KV-cache pressure", "CRITICAL: KV-cache pressure")), hot
    for quiet in ("real-vllm", "sim-healthy"):
        assert rows[quiet][3] == "up" and "KV-cache pressure" not in rows[quiet][4], rows[quiet]
    assert rows["gone"][3] == "DOWN" and rows["gone"][4].startswith("CRITICAL: Server unreachable"), rows["gone"]
    expect(page.locator(".js-plotly-plot")).to_have_count(5)
    if os.environ.get("SCREENSHOTS_INTO_DOCS") == "1":  # scripts/screenshots.sh: the picture docs/fleet.md shows
        page.wait_for_timeout(15_000)  # a few refreshes more on the charts before the picture
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), clip={"x": 0, "y": 0, "width": 1500, "height": 1400})
    shoot(page, "fleet-direct.png")  # the test's own artifact; a test run leaves the checkout as it was

    assert rows["real-vllm"][1] == "/Live?target=real-vllm"
    page.goto(url + rows["real-vllm"][1])
    expect(page.get_by_text(re.compile(rf"Up · {re.escape(urls['real-vllm'])}")).first).to_be_visible()
    expect(page.get_by_role("combobox", name="Server")).to_have_value("real-vllm")
    expect(page.get_by_text("KV-cache block usage").first).to_be_visible()

    assert hot[2] == "/Diagnose?target=sim-kv-pressure"
    page.goto(url + hot[2])
    expect(page.get_by_role("combobox", name="Server")).to_have_value("sim-kv-pressure")
    expect(page.get_by_text("KV-cache pressure").first).to_be_visible()
    shoot(page, "fleet-direct-diagnose.png")
