"""The pure half of the Prometheus source: selectors a user types, durations, Prometheus's answers
regrouped into the collector's history, exposition text that parses back to the same snapshot, and
the fleet's outliers and shared findings. (The PromQL itself is proven against a real Prometheus
in tests/integration/test_prometheus.py.)"""

from __future__ import annotations

import pytest

from diagnostics.core.diagnosis.types import Finding
from diagnostics.core.fleet.promql import (
    Scope,
    duration,
    exposition,
    histories_from_matrix,
    parse_duration,
    parse_selector,
    raw_series_query,
)
from diagnostics.core.fleet.table import FleetRow, fleet_findings, outliers
from diagnostics.core.metrics.catalog import parse_snapshot, snapshot_from_samples
from diagnostics.core.metrics.parse import parse_vllm_samples


@pytest.mark.parametrize(
    ("text", "matchers"),
    [
        ('{job="vllm"}', 'job="vllm"'),
        ('job="vllm", namespace=~"prod-.*"', 'job="vllm",namespace=~"prod-.*"'),
        ("", ""),
        ("{}", ""),
        ('{pod!="a\\"b"}', 'pod!="a\\"b"'),
    ],
)
def test_selectors_a_user_types(text: str, matchers: str) -> None:
    assert parse_selector(text) == matchers


@pytest.mark.parametrize("text", ['{job="vllm"} or up', "job=vllm", '{job="a"}}', '{job="a"', 'up{job="a"}'])
def test_anything_but_label_matchers_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="selector"):
        parse_selector(text)


def test_instance_values_are_quoted_not_pasted() -> None:
    query = raw_series_query(Scope('job="vllm"', 'evil"} or vector(1) #'))
    assert 'instance="evil\\"} or vector(1) #"' in query


@pytest.mark.parametrize(("seconds", "text"), [(900, "900s"), (1.5, "1500ms"), (0.0001, "1ms"), (3600.25, "3600250ms")])
def test_durations_keep_milliseconds(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(("text", "seconds"), [("15m", 900), ("2h", 7200), ("7d", 604800), ("90", 90), ("1.5s", 1.5), ("1m30s", 90), ("1h0m500ms", 3600.5)])
def test_durations_a_user_types(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-5m", "2 hours", "15x", "1m30", "m30s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def series(name: str, instance: str, points: list[tuple[float, float]], **labels: str) -> dict[str, object]:
    metric = {"__name__": name, "job": "vllm", "instance": instance, **labels}
    return {"metric": metric, "values": [[t, repr(v)] for t, v in points]}


def test_answers_regroup_into_each_instances_scrapes() -> None:
    engine = {"model_name": "m", "engine": "0"}
    matrix = [
        series("up", "a:1", [(10.0, 1), (11.0, 1), (12.0, 0)]),
        series("vllm:num_requests_running", "a:1", [(10.0, 3), (11.0, 4)], **engine),
        series("vllm:generation_tokens_total", "a:1", [(10.0, 100), (11.0, 150)], **engine),
        series("up", "b:1", [(10.5, 1)]),
        series("vllm:num_requests_running", "b:1", [(10.5, 7)], **engine),
    ]
    history = histories_from_matrix(matrix)
    assert set(history) == {"a:1", "b:1"}
    a = history["a:1"]
    assert [s.ts for s in a] == [10.0, 11.0, 12.0]
    assert a[0].snapshot is not None and a[0].snapshot.value("num_requests_running") == 3
    assert a[1].snapshot is not None and a[1].snapshot.value("generation_tokens") == 150
    # up 0: Prometheus saw the instance down at that scrape; an error scrape, like the collector's.
    assert a[2].snapshot is None and a[2].error is not None and "down" in a[2].error
    # The target labels Prometheus adds are not engines: one engine, as the server exposes it.
    assert a[0].snapshot.engines == (("m", "0"),)
    assert history["b:1"][0].snapshot is not None and history["b:1"][0].snapshot.value("num_requests_running") == 7


def test_exposition_parses_back_to_the_same_snapshot(burst_text: str) -> None:
    samples = list(parse_vllm_samples(burst_text))
    again = parse_snapshot(exposition(samples))
    original = snapshot_from_samples(samples)
    assert again.layout == original.layout
    assert list(again.values) == list(original.values)
    assert again.cache_config == original.cache_config


def row(instance: str, model: str | None = "m", up: bool | None = True, findings: tuple[Finding, ...] = (),
        **values: float) -> FleetRow:
    return FleetRow(instance, model, up, values, findings)


def finding(fid: str, severity: str = "warning") -> Finding:
    return Finding(fid, severity, f"{fid} title", {})  # type: ignore[arg-type]


def test_outliers_name_the_replica_and_why() -> None:
    fleet = [
        row("a", kv_cache_usage_perc=0.98, preemptions_per_s=0.5, num_requests_running=12, num_requests_waiting=3),
        row("b", kv_cache_usage_perc=0.40, preemptions_per_s=0.0, num_requests_running=3, num_requests_waiting=0),
        row("c", up=False),
    ]
    found = {(o.instance, o.key) for o in outliers(fleet)}
    assert found == {
        ("a", "kv_cache_usage_perc"), ("a", "preemptions_per_s"), ("a", "num_requests_waiting"),
        ("a", "num_requests_running"), ("b", "num_requests_running"),  # 12 vs 3 running: imbalance
        ("c", "up"),
    }


def test_no_imbalance_within_the_spread_or_across_models() -> None:
    even = [row("a", num_requests_running=6), row("b", num_requests_running=4)]
    assert outliers(even) == []
    other_models = [row("a", model="m1", num_requests_running=12), row("b", model="m2", num_requests_running=1)]
    assert outliers(other_models) == []


def test_fleet_findings_group_replicas_and_skip_info() -> None:
    fleet = [
        row("a", findings=(finding("kv_pressure"), finding("itl_budget_unset", "info"))),
        row("b", findings=(finding("kv_pressure"),)),
        row("c", model="other", findings=(finding("silent_stall", "critical"),)),
        row("d", up=False),
    ]
    found = fleet_findings(fleet)
    assert [f.id for f in found] == ["down", "silent_stall", "kv_pressure"]  # critical first, then by count
    kv = found[-1]
    assert kv.instances == ("a", "b")
    # Two models in the fleet: its members are servers, not replicas of one another.
    assert kv.text == "2 of 4 servers: KV cache full and preempting; all on model m"
    assert found[1].text == "1 of 4 servers: stalled (requests running, no tokens); on model other"


def test_a_fleet_of_one_model_is_counted_in_replicas() -> None:
    fleet = [row("a", findings=(finding("kv_pressure"),)), row("b"), row("c", model=None, up=False)]  # c: down, model unknown
    assert [f.text for f in fleet_findings(fleet)] == [
        "1 of 3 replicas: down", "1 of 3 replicas: KV cache full and preempting; on model m"]
    # A server of another model, quiet itself, still makes the fleet one of servers, not replicas.
    mixed = fleet + [row("e", model="other")]
    assert [f.text for f in fleet_findings(mixed)][0] == "1 of 4 servers: down"


def _selected(query: str, name: str) -> bool:
    """Whether the raw-series query's ``__name__`` matchers select ``name``, as Prometheus does (a
    fully anchored RE2 match; these patterns mean the same in Python's re)."""
    import re

    wanted = re.search(r'__name__=~"([^"]+)"', query)
    unwanted = re.search(r'__name__!~"([^"]+)"', query)
    assert wanted is not None and unwanted is not None
    return re.fullmatch(wanted.group(1), name) is not None and re.fullmatch(unwanted.group(1), name) is None


def test_the_raw_series_carry_http_requests_so_the_outcome_rules_judge_each_instance_through_prometheus() -> None:
    """The real rejected_over_len_512 recording as Prometheus would answer the raw-series query for
    it (every sample the query's name matchers select, per scrape): the replica's diagnosis through
    Prometheus refuses the 41 prompts its clients saw refused with HTTP 400, and its 67 answers."""
    from pathlib import Path

    from diagnostics.core.diagnosis import diagnose, prepare
    from diagnostics.core.diagnosis.outcomes import outcomes
    from diagnostics.core.metrics.parse import parse_line
    from diagnostics.recording import read_recording

    query = raw_series_query(Scope('job="vllm"'))
    assert _selected(query, "http_requests_total") and not _selected(query, "http_requests_created")
    recording = read_recording(Path(__file__).resolve().parents[1] / "fixtures/incidents/rejected_over_len_512.jsonl.gz")
    by_series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for record in recording.records:
        if record.metrics is None:
            continue
        for s in (parse_line(line) for line in record.metrics.splitlines() if line and not line.startswith("#")):
            if _selected(query, s.name):
                by_series.setdefault((s.name, tuple(sorted(s.labels.items()))), []).append((record.ts, s.value))
    matrix = [series(name, "a:8000", points, **dict(labels)) for (name, labels), points in by_series.items()]
    [history] = histories_from_matrix(matrix).values()
    ctx = prepare(history)
    assert (outcomes(ctx).rejected, outcomes(ctx).answered) == (41, 67)
    assert "requests_rejected" in [f.id for f in diagnose(ctx)]
