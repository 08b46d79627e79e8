"""The rule table's names all resolve (knobs, charts, alerts, scenarios, suppressions), and every
finding a rule emits is one its row lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostics.core.diagnosis import RULES, Budgets, Context, Rule, Thresholds, prepare
from diagnostics.core.diagnosis.alerts import alert_rules
from diagnostics.core.diagnosis.knobs import KNOBS_BY_ID
from diagnostics.core.diagnosis.logs import ERROR_PATTERNS
from diagnostics.core.diagnosis.rules import STARTUP_ERRORS
from diagnostics.core.metrics.catalog import COUNTERS, GAUGES, HISTOGRAMS, RATIOS, parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.simulator.scenarios import SCENARIOS, Scenario
from diagnostics.recording import read_recording
from diagnostics.sim.driver import Simulation
from tests.unit.synth import down, scrape, text
from tests.unit.test_rules import hol_history, steady

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ALERTS = {a.name: a for a in alert_rules(Thresholds(), itl_budget_ms=50, ttft_budget_ms=500)}
BY_ID = {rule.id: rule for rule in RULES}


def _name(value: object) -> str:
    return value.id if isinstance(value, Rule) else str(value)


def test_rule_ids_are_unique() -> None:
    assert len(BY_ID) == len(RULES)


def test_finding_ids_are_unique_across_rows() -> None:
    ids = [i for rule in RULES for i in rule.finding_ids]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_knob_is_a_knob_table_row(rule: Rule) -> None:
    assert set(rule.knobs) <= set(KNOBS_BY_ID), rule


@pytest.mark.parametrize("rule", [r for r in RULES if r.chart], ids=lambda r: r.id)
def test_every_chart_is_a_catalog_concept(rule: Rule) -> None:
    assert rule.chart in {*GAUGES, *COUNTERS, *HISTOGRAMS, *RATIOS}


@pytest.mark.parametrize(("rule", "alert"), [(r, r.alert) for r in RULES if r.alert], ids=_name)
def test_every_alert_exists_and_rests_on_a_knob_of_the_rule(rule: Rule, alert: str) -> None:
    assert ALERTS[alert].knob in rule.knobs


@pytest.mark.parametrize(("rule", "scenario"), [(r, r.scenario) for r in RULES if r.scenario],
                         ids=_name)
def test_every_scenario_exists_and_shows_a_finding_of_the_rule(rule: Rule, scenario: str) -> None:
    assert SCENARIOS[scenario].knob in rule.finding_ids


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS.values() if s.knob], ids=lambda s: s.name)
def test_every_scenario_finding_has_a_rule(scenario: Scenario) -> None:
    assert any(scenario.knob in rule.finding_ids for rule in RULES)


def test_every_log_error_kind_has_a_title_and_knob() -> None:
    assert {kind for kind, _ in ERROR_PATTERNS} == set(STARTUP_ERRORS)


def _restarted(ts: float) -> Scrape:
    return Scrape(ts, parse_snapshot(text(gen=5, running=1).replace("process_start_time_seconds 1000",
                                                                    "process_start_time_seconds 2000")))


def _contexts() -> dict[str, Context]:
    """Windows that make each rule speak (problem, info or nothing), one per condition."""
    stalled = [scrape(float(t), gen=100 * min(t, 4), running=4) for t in range(15)]
    queued = [scrape(float(t), gen=100 * t, running=4, waiting=10 if t >= 5 else 0, usage=0.3) for t in range(12)]
    preempted = [scrape(float(t), gen=100 * t, running=10, waiting=5, usage=1.0, preempt=2 * t) for t in range(20)]
    slow = [scrape(float(t), gen=100 * t, running=8, itl_counts=[0, 0, 50 * t] + [0] * 11, itl_sum=t)
            for t in range(10)]
    sampled = [scrape(float(t), gen=100 * t, prefix_caching=False, n_counts=[t, 0, 0, 5 * t, 0, 0]) for t in range(5)]
    bare = [Scrape(float(t), parse_snapshot(f'vllm:num_requests_running{{model_name="m"}} {t}\n')) for t in range(3)]
    recording = read_recording(str(FIXTURES / "recording-tiny-burst-0.32.0.jsonl.gz"))
    contexts = {
        "healthy": prepare(steady(30, running=8, usage=0.3)),
        "stall": prepare(stalled),
        "tokens_stopped": prepare(stalled[:8]),
        "queue": prepare(queued),
        "preemption": prepare(preempted),
        "outage_and_restart": prepare(steady(5, running=1) + [down(5.0), down(6.0)] + [_restarted(7.0)]),
        "head_of_line": prepare(hol_history(2000), budgets=Budgets(itl_ms=5)),
        "slow_decode": prepare(slow, budgets=Budgets(itl_ms=5)),
        "itl_budget_unset": prepare(slow),
        "sharing_disabled": prepare(sampled),
        "absent": prepare(bare),
        **{name: prepare([Scrape(ts, parse_snapshot(t)) for ts, t in Simulation(name).run_for(40)])
           for name in ("hung_rank", "lora_deferred", "admission_limit", "asleep", "spec_decode_low", "slow_rank")},
        "real_recording": prepare(recording.scrapes(), info=recording.info(), budgets=Budgets(itl_ms=1, ttft_ms=1)),
    }
    for log in FIXTURES.glob("log-*.txt"):
        contexts[log.stem] = prepare([], log_text=log.read_text())
    contexts["engine_killed_log"] = prepare([], log_text=(FIXTURES / "incidents" / "engine_killed.log").read_text())
    return contexts


CONTEXTS = _contexts()


@pytest.mark.parametrize("name", CONTEXTS)
def test_every_finding_a_rule_emits_is_listed_in_its_row(name: str) -> None:
    ctx = CONTEXTS[name]
    for rule in RULES:
        if rule.needs_scrapes and not ctx.ok:
            continue
        for finding in rule.run(ctx):
            assert finding.id in rule.finding_ids, (rule.id, finding.id)
            assert set(finding.knobs) <= set(rule.knobs), (rule.id, finding.knobs)
            assert finding.chart in (None, rule.chart), (rule.id, finding.chart)


def test_the_sample_windows_make_every_row_but_one_speak() -> None:
    """Guards the check above against windows that trigger nothing (sharing_not_happening needs a
    prompt-length histogram the synthetic payload lacks)."""
    spoke = {rule.id for ctx in CONTEXTS.values() for rule in RULES if (ctx.ok or not rule.needs_scrapes)
             and rule.run(ctx)}
    assert set(BY_ID) - spoke == {"sharing_not_happening"}


def test_rules_that_give_queue_capacity_or_latency_advice_do_not_run_while_tokens_stopped() -> None:
    skipped = {rule.id for rule in RULES if not rule.while_tokens_stopped}
    assert skipped == {"kv_pressure", "queue_at_cap", "slow_decode", "ttft", "waiting_deferred", "admission_rejected"}
