"""GPU health through a real Prometheus: two simulated engines on two loopback hosts, each with its
DCGM-shaped endpoint scraped as a dcgm-exporter job; the Fleet report joins each engine's GPU by
host and the thermally throttled one is named, through Prometheus, and only that one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from diagnostics.core.fleet.promql import Scope
from diagnostics.core.metrics.gpu import ClockEvent
from diagnostics.prometheus_fleet import PrometheusTarget, fleet_report
from diagnostics.sim.server import SIM_DCGM_PATH, SimServer
from diagnostics.sources.prometheus import PrometheusClient
from tests.integration.prometheus_server import PrometheusServer


def host(url: str) -> str:
    return url.split("://", 1)[1]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[PrometheusServer, str, str]]:
    healthy = SimServer("healthy", host="127.0.0.1").start()
    hot = SimServer("gpu_thermal_throttle", host="127.0.0.2").start()
    prom = PrometheusServer([host(healthy.url), host(hot.url)],
                            extra_jobs=[("dcgm", SIM_DCGM_PATH, [host(healthy.url), host(hot.url)])]).start()
    try:
        prom.wait_for_scrapes(12)
        yield prom, host(healthy.url), host(hot.url)
    finally:
        prom.close()
        healthy.stop()
        hot.stop()


def test_the_fleet_joins_each_engine_to_its_own_gpu_by_host(fleet: tuple[PrometheusServer, str, str]) -> None:
    prom, healthy, hot = fleet
    report = fleet_report(PrometheusClient(prom.url), Scope('job="vllm"'), range_s=60)
    assert set(report.gpus) == {healthy, hot}
    assert {j.by for j in report.gpus.values()} == {"host"}
    cool_gpu = report.gpus[healthy].last.devices  # type: ignore[union-attr]
    hot_gpu = report.gpus[hot].last.devices  # type: ignore[union-attr]
    assert len(cool_gpu) == 1 and len(hot_gpu) == 1  # each host's own exporter only
    assert hot_gpu[0].clock_events == ClockEvent.SW_THERMAL_SLOWDOWN | ClockEvent.HW_THERMAL_SLOWDOWN
    assert not cool_gpu[0].throttles
    rows = {r.instance: r for r in report.rows}
    assert "gpu_throttled" in [f.id for f in rows[hot].findings]
    assert "gpu_throttled" not in [f.id for f in rows[healthy].findings]


def test_an_instance_opened_from_the_fleet_has_its_gpu_history(fleet: tuple[PrometheusServer, str, str]) -> None:
    prom, _, hot = fleet
    target = PrometheusTarget(PrometheusClient(prom.url), Scope('job="vllm"', hot), range_s=60)
    target.refresh()
    readings = target.gpu_history()
    assert len(readings) >= 3 and all(r.devices[0].host == "127.0.0.2" for _, r in readings)
    assert readings[-1][1].devices[0].sm_clock_mhz == 1267.0  # 64 % of 1,980 MHz, through Prometheus


def test_the_fleet_page_lists_each_gpu_with_its_join_and_warns_for_the_hot_one(
        fleet: tuple[PrometheusServer, str, str]) -> None:
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    prom, healthy, hot = fleet
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=60)
    at.switch_page("pages/6_Fleet.py")
    at.secrets["prometheus_url"] = prom.url
    at.secrets["prometheus_selector"] = '{job="vllm"}'
    at.run()
    assert not at.exception
    assert "GPUs (dcgm-exporter, through Prometheus)" in [s.value for s in at.subheader]
    gpus = next(d.value for d in at.dataframe if "joined by" in d.value.columns)
    rows = {r["instance"]: r for r in gpus.to_dict("records")}
    assert set(rows) == {healthy, hot} and {r["joined by"] for r in rows.values()} == {"host"}
    assert rows[hot]["clock-event reasons"] == "SW thermal slowdown, HW thermal slowdown"
    assert rows[healthy]["clock-event reasons"] == "none"
    assert rows[hot]["SM clock (of max)"] == "1267 MHz of 1980"
    assert any("throttled: SW thermal slowdown, HW thermal slowdown" in w.value for w in at.warning)
