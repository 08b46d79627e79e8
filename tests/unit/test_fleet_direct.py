"""The fleet table from directly scraped servers, built from real recordings of vLLM 0.32 (the
labelled incident corpus, tests/fixtures/incidents, made by its record.py): each recording stands
for one configured target's collector history. The expected values are read from the recordings'
raw ``/metrics`` text with a regex here, never from the code under test."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from diagnostics.core.diagnosis import Budgets
from diagnostics.core.fleet import direct
from diagnostics.core.fleet.promql import CHART_CONCEPTS, FLEET_COLUMNS
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.info import TargetStatus
from diagnostics.recording import Record, read_recording

INCIDENTS = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"
HEALTHY, KV, DOWN, QUEUE = "healthy_closed_loop", "kv_pressure_memory_bytes", "outage_kill", "queue_cap_burst"


@functools.cache
def records(name: str) -> list[Record]:
    return list(read_recording(INCIDENTS / f"{name}.jsonl.gz").records)


@functools.cache
def target(name: str) -> direct.DirectTarget:
    replay = read_recording(INCIDENTS / f"{name}.jsonl.gz").replay()
    return direct.DirectTarget(name, replay.status(), tuple(replay.scrapes), tuple(replay.gpus))


def raw_values(name: str, metric: str) -> list[tuple[float, float]]:
    """Every (ts, value) of an unlabelled-engine series of ``metric`` in the recording's raw text,
    summed over its label sets (one engine in these recordings)."""
    pattern = re.compile(rf"^{re.escape(metric)}(?:{{[^}}]*}})? (\S+)$", re.M)
    out = []
    for rec in records(name):
        if rec.metrics is None:
            continue
        found = [float(v) for v in pattern.findall(rec.metrics)]
        if found:
            out.append((rec.ts, sum(found)))
    return out


@pytest.fixture(scope="module")
def fleet() -> direct.DirectReport:
    return direct.report([target(n) for n in (HEALTHY, KV, DOWN, QUEUE)], range_s=3600, interval_s=1.0)


def by_name(report: direct.DirectReport) -> dict[str, direct.FleetRow]:
    names = {instance: name for instance, name in report.names.items()}
    return {names[row.instance]: row for row in report.rows}


def test_every_fleet_column_has_a_direct_value_and_no_other() -> None:
    assert list(direct.COLUMN_VALUES) == [c.key for c in FLEET_COLUMNS]


def test_the_trouble_is_on_the_right_row(fleet: direct.DirectReport) -> None:
    """Each recording's label (labels.json: its class) names the worst finding of its own row only."""
    rows = by_name(fleet)
    assert [r.instance for r in fleet.rows] == [target(n).instance for n in (HEALTHY, KV, DOWN, QUEUE)]
    assert rows[KV].worst is not None and rows[KV].worst.id == "kv_pressure"
    assert rows[QUEUE].worst is not None and rows[QUEUE].worst.id == "queue_at_cap"
    assert rows[DOWN].worst is not None and rows[DOWN].worst.id == "server_down"
    healthy = rows[HEALTHY].worst
    assert healthy is None or healthy.severity == "info", healthy
    shared = {f.id: f.instances for f in fleet.findings}
    assert shared["kv_pressure"] == (rows[KV].instance,)
    assert shared["queue_at_cap"] == (rows[QUEUE].instance,)
    assert shared["down"] == (rows[DOWN].instance,) and "server_down" not in shared  # down now: said once
    assert all(rows[HEALTHY].instance not in f.instances for f in fleet.findings)


def test_the_up_cell_says_what_the_collector_saw(fleet: direct.DirectReport) -> None:
    rows = by_name(fleet)
    assert [rows[n].state_text for n in (HEALTHY, KV, DOWN, QUEUE)] == ["up", "up", "DOWN", "up"]
    assert rows[DOWN].up is False and rows[HEALTHY].up is True
    assert ("down" in {o.why for o in fleet.outliers if o.instance == rows[DOWN].instance})


def test_rates_and_peaks_agree_with_the_raw_text() -> None:
    """Preemptions per second over the range, the KV peak and the waiting peak, against the numbers in
    the recorded payloads themselves."""
    row = direct.row(target(KV), 3600)
    preempted = raw_values(KV, "vllm:num_preemptions_total")
    (t0, first), (t1, last) = preempted[0], preempted[-1]
    assert last > first  # the recording did preempt
    assert row.values["preemptions_per_s"] == pytest.approx((last - first) / (t1 - t0))
    assert row.values["kv_cache_usage_peak"] == max(v for _, v in raw_values(KV, "vllm:kv_cache_usage_perc"))
    assert row.values["waiting_peak"] == max(v for _, v in raw_values(KV, "vllm:num_requests_waiting"))
    assert row.values["kv_cache_usage_perc"] == raw_values(KV, "vllm:kv_cache_usage_perc")[-1][1]
    # 36 s of closed-loop load generated tokens: the rate is the counter's rise over the time it took.
    tokens = raw_values(HEALTHY, "vllm:generation_tokens_total")
    healthy = direct.row(target(HEALTHY), 3600)
    rate = (tokens[-1][1] - tokens[0][1]) / (tokens[-1][0] - tokens[0][0])
    assert rate > 0 and healthy.values["generation_tokens_per_s"] == pytest.approx(rate)


def test_a_server_down_now_has_no_now_but_keeps_what_the_range_saw() -> None:
    row = direct.row(target(DOWN), 3600)
    assert row.values["kv_cache_usage_perc"] is None and row.values["num_requests_running"] is None
    assert row.values["kv_cache_usage_peak"] == max(v for _, v in raw_values(DOWN, "vllm:kv_cache_usage_perc"))
    assert row.values["generation_tokens_per_s"] is not None and row.values["generation_tokens_per_s"] > 0


def test_the_range_ends_where_asked_and_leaves_older_scrapes_out() -> None:
    t = target(KV)
    first_preempt = next(ts for (ts, v), (_, prev) in zip(raw_values(KV, "vllm:num_preemptions_total")[1:],
                                                          raw_values(KV, "vllm:num_preemptions_total"))
                         if v > prev)
    before = direct.row(t, 3600, end=first_preempt - 1.5)
    assert before.values["preemptions_per_s"] == 0
    assert before.worst is None or before.worst.id != "kv_pressure"


def _answered_garbage(instance_url: str, kind: ErrorKind, state: str, start: float) -> direct.DirectTarget:
    failed = tuple(Scrape(start + i, None, f"{instance_url}/metrics answered an HTML page", kind) for i in range(20))
    status = TargetStatus(target=instance_url, state=state, since=start, error=failed[-1].error,  # type: ignore[arg-type]
                          last_ok_ts=None, last_attempt_ts=failed[-1].ts, info=None, num_scrapes=20,
                          num_failures=20)
    return direct.DirectTarget("not-vllm", status, failed)


def test_a_target_that_answers_garbage_says_so_and_the_others_lose_nothing() -> None:
    good = [target(n) for n in (HEALTHY, KV)]
    bad = _answered_garbage("http://10.0.0.9:8000", ErrorKind.NOT_VLLM, "not_vllm", good[0].history[0].ts)
    alone = direct.report(good, range_s=3600, interval_s=1.0)
    beside = direct.report([good[0], bad, good[1]], range_s=3600, interval_s=1.0)
    row = beside.rows[1]
    assert row.instance == "10.0.0.9:8000" and row.up is False and row.state_text == "NOT vLLM"
    assert row.worst is not None and row.worst.title.startswith("Answers, but not as a vLLM server")
    assert all(v is None for v in row.values.values())
    kept = [r for r in beside.rows if r.instance != row.instance]
    assert [(r.instance, r.values, [f.id for f in r.findings]) for r in kept] == \
        [(r.instance, r.values, [f.id for f in r.findings]) for r in alone.rows]


def test_a_target_not_scraped_yet_is_unknown_not_down() -> None:
    status = TargetStatus(target="http://10.0.0.8:8000", state="starting", since=None, error=None, last_ok_ts=None,
                          last_attempt_ts=None, info=None, num_scrapes=0, num_failures=0)
    row = direct.row(direct.DirectTarget("new", status, ()), 300)
    assert row.up is None and row.state_text == "starting" and row.worst_text == "—"
    assert direct.outliers([row]) == []


def test_goodput_is_judged_against_the_budgets_given() -> None:
    """The KV-pressure recording's requests waited tens of seconds for their first token: a 100 ms
    TTFT budget is not met by most of them; without budgets there is no goodput cell."""
    assert direct.row(target(KV), 3600).goodput_text == "—"
    row = direct.row(target(KV), 3600, Budgets(ttft_ms=100))
    assert row.slo is not None and row.slo.goodput_at_least is not None and row.slo.goodput_at_least < 0.5


def test_charts_draw_a_line_per_target_with_failed_scrapes_as_gaps() -> None:
    drawn = direct.charts([target(KV), target(DOWN)], 3600)
    assert set(drawn) == set(CHART_CONCEPTS)
    kv_line = drawn["kv_cache_usage_perc"][target(KV).instance]
    assert max(v for _, v in kv_line) == max(v for _, v in raw_values(KV, "vllm:kv_cache_usage_perc"))
    down_line = drawn["num_requests_running"][target(DOWN).instance]
    assert math.isnan(down_line[-1][1])  # down at the end: a gap, never a zero
    assert drawn["preemptions_per_s"][target(KV).instance]


def test_instance_is_host_and_port_as_prometheus_labels_it() -> None:
    assert direct.instance_label("http://10.0.0.5:8000") == "10.0.0.5:8000"
    assert direct.instance_label("https://gpu-a.internal:8443/vllm/") == "gpu-a.internal:8443/vllm"
    t = target(HEALTHY)
    assert replace(t, name="prod-a").instance == direct.instance_label(t.status.target or "")


def test_a_replica_with_only_notes_reads_nothing_above_info_not_the_note_as_its_trouble() -> None:
    """The Fleet table's worst-finding cell: an info note ("ITL p95 … no budget given") is not a
    replica's trouble; a warning is named; a replica with no diagnosis says why."""
    from diagnostics.core.diagnosis.types import Finding
    from diagnostics.core.fleet.table import FleetRow

    note = Finding("itl_unjudged", "info", "ITL p95 is < 10 ms; no ITL budget given", {})
    warn = Finding("queue_at_cap", "warning", "Requests waiting at --max-num-seqs 4", {})
    assert FleetRow("a:8000", "m", True, {}, findings=(note,)).worst_text == "nothing above info"
    assert FleetRow("b:8000", "m", True, {}, findings=(note, warn)).worst_text == \
        "WARNING: Requests waiting at --max-num-seqs 4"
    assert FleetRow("c:8000", "m", False, {}, error="connection refused").worst_text == "connection refused"
