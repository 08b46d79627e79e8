"""A fleet through a real Prometheus (the Debian binary, 1 s scrapes on loopback).

Live: Prometheus scrapes a real ``vllm serve`` and the simulated engine; the CLI ``fleet`` lists
both, Prometheus's numbers agree with direct scrapes within one scrape interval, and the PromQL
quantile equals the dashboard's own on the same samples.
Recorded: real incidents from the labelled corpus are backfilled into a Prometheus TSDB with
``promtool`` as replicas of one fleet (re-provoking them in every run would take minutes and not
always show); diagnosed through Prometheus, each names the knob its label expects, the healthy
replica stays quiet, and ``record --prometheus`` writes a recording that replays the same way.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnostics.collector import Collector
from diagnostics.core.diagnosis import Budgets, diagnose, prepare
from diagnostics.core.fleet.promql import FLEET_COLUMNS, Scope
from diagnostics.core.metrics.derive import histogram_delta, quantile_estimate
from diagnostics.prometheus_fleet import PrometheusTarget, fleet_report
from diagnostics.recording import read_recording
from diagnostics.sim.server import SimServer
from diagnostics.sources.prometheus import PrometheusClient
from diagnostics.sources.vllm_http import VllmClient
from tests.fixtures.incidents import corpus
from tests.integration import load
from tests.integration.prometheus_server import SCRAPE_TIMEOUT_S, PrometheusServer, Scrapes, backfill, recording_span
from tests.integration.vllm_server import SERVED_NAME, VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "tests/fixtures/incidents"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnostics", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def host(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


@pytest.fixture(scope="module")
def live(vllm_tiny: VllmServer) -> Iterator[tuple[PrometheusServer, str, str]]:
    sim = SimServer("healthy").start()
    prom = PrometheusServer([host(vllm_tiny.url), host(sim.url)]).start()
    try:
        prom.wait_for_scrapes(3)
        yield prom, host(vllm_tiny.url), host(sim.url)
    finally:
        prom.close()
        sim.stop()


def test_fleet_cli_lists_both_instances(live: tuple[PrometheusServer, str, str]) -> None:
    prom, real, sim = live
    out = cli("fleet", "--prometheus", prom.url, "--selector", '{job="vllm"}', "--since", "1m", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    by_instance = {row["instance"]: row for row in report["instances"]}
    assert set(by_instance) == {real, sim}
    assert by_instance[real]["model"] == SERVED_NAME
    assert by_instance[sim]["model"] and by_instance[sim]["model"] != SERVED_NAME
    for row in by_instance.values():
        assert row["up"] is True
        assert 0 <= row["kv_cache_usage_perc"] <= 1
        assert row["num_requests_running"] is not None
    # The simulated engine serves traffic of its own; the idle real server generates nothing.
    assert by_instance[sim]["generation_tokens_per_s"] > 0
    assert by_instance[real]["generation_tokens_per_s"] == 0
    # Bounded: the same queries whatever the fleet's size: the scrape interval, discovery (up and
    # models), one per table column, one for every instance's raw series, and the GPU join (the
    # targets with their labels, the DCGM series).
    assert report["queries"] == 1 + 2 + len(FLEET_COLUMNS) + 1 + 2
    text = cli("fleet", "--prometheus", prom.url, "--since", "1m")
    assert text.returncode == 0 and real in text.stdout and sim in text.stdout


def test_numbers_agree_with_direct_scrapes(vllm_tiny: VllmServer, live: tuple[PrometheusServer, str, str]) -> None:
    prom, real, _ = live
    direct = Collector(VllmClient(vllm_tiny.url), interval_seconds=0.25).start()
    time.sleep(4.0)  # idle scrapes on both sides first: gauges that hold still
    # 12 KV blocks: 16 clients in a closed loop keep the tiny server busy (and preempting) for 8 s,
    # on a fast host as on a busy one (a fixed burst took from seconds to minutes).
    clients = load.Clients()
    load.closed_loop(vllm_tiny.url, clients, 16, 8.0, lambda: {"prompt": [11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
                                                              "max_tokens": 100}).join(300)
    assert set(clients.statuses) == {200}, clients.summary()
    time.sleep(4.0)
    direct.stop()
    time.sleep(1.5)  # Prometheus's next scrape
    seen = [s for s in direct.history() if s.snapshot is not None]
    target = PrometheusTarget(PrometheusClient(prom.url), Scope('job="vllm"', real), range_s=120)
    history = [s for s in target.refresh() if seen[0].ts + 1.5 <= s.ts <= seen[-1].ts - 1.5 and s.snapshot is not None]
    assert len(history) >= 8, f"{len(history)} Prometheus scrapes while the direct collector ran"
    moving = stable = 0
    disagreed: list[tuple[str, float | None, float | None]] = []
    for scrape in history:
        snap = scrape.snapshot
        assert snap is not None
        # A counter only grows: Prometheus's value lies between the direct scrape stamped last before
        # Prometheus's scrape began (read before that stamp) and the first direct scrape that began
        # after Prometheus's had ended (the collector reads one scrape after another, so a scrape
        # began once the one before it was stamped; Prometheus gives up after its 1 s timeout). Not a
        # fixed window: a starved collector can leave a gap of seconds between its scrapes.
        before = next((s.snapshot for s in reversed(seen) if s.ts <= scrape.ts), None)
        after = next((b.snapshot for a, b in zip(seen, seen[1:]) if a.ts >= scrape.ts + SCRAPE_TIMEOUT_S), None)
        assert before is not None and after is not None, "the direct collector ran from before to after the window"
        for concept in ("generation_tokens", "prompt_tokens", "num_preemptions"):
            value, low, high = snap.value(concept), before.value(concept) or 0.0, after.value(concept) or 0.0
            assert value is not None and low <= value <= high, (concept, low, value, high)
        moving += (before.value("generation_tokens") or 0.0) < (after.value("generation_tokens") or 0.0)
        # A gauge can spike between two samples of either scraper: compared where it held still
        # for the direct scrapes within a second either side. Even there it can dip between them
        # (CI saw KV usage at 0.82 once while eight direct samples read 1.0: 12 blocks and preemption
        # free blocks for a step), so a wrong concept shows as many disagreements, not one.
        for concept in ("num_requests_running", "kv_cache_usage_perc"):
            around = [s.snapshot.value(concept) for s in seen if abs(s.ts - scrape.ts) <= 1.0 and s.snapshot]
            if len(around) >= 4 and len(set(around)) == 1:
                stable += 1
                if snap.value(concept) != around[0]:
                    disagreed.append((concept, snap.value(concept), around[0]))
    assert moving >= 2, "the burst never showed between two direct scrapes"
    gap = max(b.ts - a.ts for a, b in zip(seen, seen[1:]))
    print(f"agreement: {len(seen)} direct scrapes (longest gap {gap:.1f} s), {len(history)} Prometheus scrapes, {moving} in motion, {stable} gauge comparisons, "
          f"{len(disagreed)} disagreed: {disagreed}")
    agreed = stable - len(disagreed)
    assert agreed >= 4, "no gauge held still long enough to compare"
    assert agreed >= 2 * len(disagreed), disagreed  # a wrong concept or spelling disagrees nearly every time

    # The fleet table's PromQL quantile (buckets summed by le, then histogram_quantile) agrees with
    # the dashboard's own estimate over the same samples: the same bucket, and within 5 % (the window
    # reaches 50 ms before the first sample and 100 ms past the last; rate() extrapolates to those
    # edges, each bucket alike except one that starts at 0, capped where it would go below zero).
    end = history[-1].ts + 0.1
    span = end - history[0].ts + 0.05
    report = fleet_report(PrometheusClient(prom.url), Scope('job="vllm"'), range_s=span, end=end,
                          diagnose_instances=False)
    row = next(r for r in report.rows if r.instance == real)
    window = [s for s in history if s.ts >= end - span]
    ours = quantile_estimate(0.95, histogram_delta(window, "inter_token_latency_seconds"))
    assert ours is not None and row.values["itl_p95_s"] is not None
    promql_p95 = row.values["itl_p95_s"]
    assert ours.lower <= promql_p95 <= ours.upper, (promql_p95, ours)
    assert math.isclose(promql_p95, ours.value, rel_tol=0.05), (promql_p95, ours)


# -- recorded incidents, backfilled -------------------------------------------------------------

FLEET = {
    "replica-kv:8000": "kv_pressure_blocks_override",
    "replica-queue:8000": "queue_cap_burst",
    "replica-stall:8000": "stall_small",
    "replica-hol:8000": "hol_burst_p99",
    "replica-ok:8000": "healthy_closed_loop",
}


OLD = "replica-old:8000"
OLD_TEXT = (ROOT / "tests/fixtures/metrics-0.8-renamed.txt").read_text()


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[PrometheusServer, float, dict[str, float]]]:
    labels = corpus.labels()
    files: dict[str, Path | Scrapes] = {instance: INCIDENTS / labels[name]["file"] for instance, name in FLEET.items()}
    # A server with vLLM's pre-0.9 spellings (gpu_cache_usage_perc, time_per_output_token_seconds…).
    files[OLD] = [(float(t), OLD_TEXT) for t in range(5)]
    end = float(int(time.time()) - 3600)  # an hour ago: a window in the past, as in a post-mortem
    prom = PrometheusServer()
    backfill(files, prom.data_dir, end=end)
    prom.start()
    spans = {i: recording_span(p)[1] - recording_span(p)[0] for i, p in files.items() if isinstance(p, Path)}
    try:
        yield prom, end, spans
    finally:
        prom.close()


@pytest.mark.parametrize("instance", sorted(FLEET))
def test_diagnosis_through_prometheus_matches_the_label(
    recorded: tuple[PrometheusServer, float, dict[str, float]], instance: str
) -> None:
    prom, end, spans = recorded
    label = corpus.labels()[FLEET[instance]]
    budgets = Budgets(ttft_ms=label["budgets"].get("ttft_ms"), itl_ms=label["budgets"].get("itl_ms"))
    target = PrometheusTarget(PrometheusClient(prom.url), Scope("", instance), range_s=spans[instance] + 1, end=end + 0.5)
    history = target.refresh()
    original = read_recording(INCIDENTS / label["file"]).scrapes()
    assert len(history) == len(original), "every recorded scrape, and only those, comes back from Prometheus"
    findings = diagnose(prepare(history, info=target.status().info, budgets=budgets))
    verdict = corpus.judge(findings, label["expect"], len(history))
    assert verdict.ok, f"{FLEET[instance]} through Prometheus: {verdict.why}; got {[f.id for f in findings]}"


def test_cli_diagnose_and_record_through_prometheus(
    recorded: tuple[PrometheusServer, float, dict[str, float]], tmp_path: Path
) -> None:
    prom, end, spans = recorded
    instance = "replica-kv:8000"
    window = ["--prometheus", prom.url, "--instance", instance, "--until", str(end + 0.5),
              "--since", f"{spans[instance] + 1:.0f}s"]
    out = cli("diagnose", *window, "--json")
    direct = cli("diagnose", "--replay", str(INCIDENTS / corpus.labels()[FLEET[instance]]["file"]), "--json")
    assert out.returncode == direct.returncode == 2, out.stderr  # critical: 24 preemptions in 11 s
    findings = json.loads(out.stdout)["findings"]
    assert [f["id"] for f in findings] == [f["id"] for f in json.loads(direct.stdout)["findings"]]
    assert findings[0]["id"] == "kv_pressure"
    assert findings[0]["suggestions"][0]["flag"] == "--num-gpu-blocks-override"

    path = tmp_path / "kv.jsonl.gz"
    rec = cli("record", *window, "--out", str(path))
    assert rec.returncode == 0, rec.stderr
    original = read_recording(INCIDENTS / corpus.labels()[FLEET[instance]]["file"])
    written = read_recording(path)
    assert len(written.records) == len(original.records) and not written.problems
    assert [r.metrics is None for r in written.records] == [r.metrics is None for r in original.records]
    assert written.info() is not None and written.info().model == "tiny"  # type: ignore[union-attr]
    replayed = cli("diagnose", "--replay", str(path), "--json")
    assert replayed.returncode == 2, replayed.stderr
    assert [f["id"] for f in json.loads(replayed.stdout)["findings"]] == [f["id"] for f in findings]

    no_instance = cli("diagnose", "--prometheus", prom.url, "--until", str(end))
    assert no_instance.returncode == 3 and "--instance is needed" in no_instance.stderr
    for name in FLEET:
        assert name in no_instance.stderr


def test_fleet_report_on_the_recorded_fleet(recorded: tuple[PrometheusServer, float, dict[str, float]]) -> None:
    prom, end, spans = recorded
    out = cli("fleet", "--prometheus", prom.url, "--until", str(end + 0.5), "--since",
              f"{max(spans.values()) + 1:.0f}s", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rows = {r["instance"]: r for r in report["instances"]}
    assert set(rows) == {*FLEET, OLD}
    assert rows["replica-ok:8000"]["worst_finding"] is None or rows["replica-ok:8000"]["worst_finding"]["severity"] == "info"
    assert rows["replica-kv:8000"]["worst_finding"]["id"] == "kv_pressure"
    assert rows["replica-kv:8000"]["preemptions_per_s"] > 0
    assert rows["replica-ok:8000"]["preemptions_per_s"] == 0
    shared = {f["id"]: f for f in report["fleet_findings"]}
    assert shared["kv_pressure"]["instances"] == ["replica-kv:8000"]
    assert shared["silent_stall"]["instances"] == ["replica-stall:8000"]
    assert all("replica-ok:8000" not in f["instances"] for f in report["fleet_findings"])

    # The old spellings answer the same columns (the PromQL joins both with `or`): the values in
    # tests/fixtures/metrics-0.8-renamed.txt, vllm:gpu_cache_usage_perc and num_requests_running.
    assert 'vllm:gpu_cache_usage_perc{model_name="tiny"} 0.00366233' in OLD_TEXT
    assert rows[OLD]["kv_cache_usage_perc"] == pytest.approx(0.00366233, rel=1e-4)
    assert rows[OLD]["num_requests_running"] == 30
    assert rows[OLD]["generation_tokens_per_s"] == 0  # the same payload five times: no progress


def test_prometheus_down_keeps_history(live: tuple[PrometheusServer, str, str]) -> None:
    prom, _, sim = live
    # A Prometheus of its own, so stopping it does not disturb the shared one.
    own = PrometheusServer([sim]).start()
    try:
        own.wait_for_scrapes(3)
        target = PrometheusTarget(PrometheusClient(own.url, timeout_seconds=3), Scope("", sim), range_s=60)
        before = list(target.refresh())
        assert before and target.status().state == "up"
        own.stop()
        target.refresh()
        status = target.status()
        assert target.history() == before, "history already read survives Prometheus going away"
        assert status.state == "stale" and status.error is not None and "unreachable" in status.error
        out = cli("fleet", "--prometheus", own.url, "--timeout", "3")
        assert out.returncode == 3 and "unreachable" in out.stderr and "Traceback" not in out.stderr
        # A query Prometheus refuses (a selector that parses as matchers but not as a regex).
        bad = cli("fleet", "--prometheus", prom.url, "--selector", '{job=~"("}')
        assert bad.returncode == 3 and "refused" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        own.close()
