"""The rule table's names all resolve (knobs, charts, alerts, scenarios), every finding id a row
declares is built by some sample window, and what the runner stamps on each finding is its row's.
Every list here is read from the table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from diagnostics.core.diagnosis import RULES, Budgets, Context, Finding, Rule, Thresholds, diagnose, prepare
from diagnostics.core.diagnosis.alerts import alert_rules
from diagnostics.core.diagnosis.causes import SYMPTOMS
from diagnostics.core.diagnosis.context import TokensStopped
from diagnostics.core.diagnosis.knobs import KNOBS_BY_ID
from diagnostics.core.diagnosis.logs import ERROR_PATTERNS
from diagnostics.core.diagnosis.rules import startup
from diagnostics.core.diagnosis.rules.startup import FAILED_START, STARTUP_ERRORS
from diagnostics.core.diagnosis.runner import run_rule
from diagnostics.core.diagnosis.table import BARE, Stamp
from diagnostics.core.metrics.catalog import COUNTERS, GAUGES, HISTOGRAMS, RATIOS, parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.gpu import ClockEvent
from diagnostics.core.simulator.scenarios import SCENARIOS, Scenario
from diagnostics.recording import read_recording
from diagnostics.sim.driver import Simulation
from tests.unit.synth import cumulative, down, gpu_readings, scrape, text
from tests.unit.test_changed import changed_window, missed_window
from tests.unit.test_rules import hol_history, steady

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ALERTS = {a.name: a for a in alert_rules(Thresholds(), itl_budget_ms=50, ttft_budget_ms=500)}
BY_ID = {rule.id: rule for rule in RULES}
CHARTS = {*GAUGES, *COUNTERS, *HISTOGRAMS, *RATIOS}  # what the Diagnose page's finding chart can draw
DECLARED = [(rule, finding_id) for rule in RULES for finding_id in rule.finding_ids]
STAMPS = [pytest.param(rule.stamp(finding_id), id=f"{rule.id}:{finding_id}") for rule, finding_id in DECLARED]


def _name(value: object) -> str:
    return value.id if isinstance(value, Rule) else str(value)


def test_rule_ids_are_unique() -> None:
    assert len(BY_ID) == len(RULES)


def test_a_finding_id_shared_by_rows_names_different_causes() -> None:
    """Rows may share the finding id users know (engines out of balance) only when they reach it
    by different causes, each with its own knob; otherwise they would be one rule."""
    rows: dict[str, list[Rule]] = {}
    for rule, finding_id in DECLARED:
        rows.setdefault(finding_id, []).append(rule)
    for finding_id, sharing in rows.items():
        knobs = [rule.stamp(finding_id).knobs for rule in sharing]
        assert len(set(knobs)) == len(knobs), (finding_id, [r.id for r in sharing])


@pytest.mark.parametrize("stamp", STAMPS)
def test_every_stamped_knob_is_a_knob_table_row_and_every_chart_can_be_drawn(stamp: Stamp) -> None:
    assert set(stamp.knobs) <= set(KNOBS_BY_ID)
    assert stamp.chart is None or stamp.chart in CHARTS


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


def test_every_log_error_kind_has_a_title_a_knob_and_a_finding_id() -> None:
    kinds = {kind for kind, _ in ERROR_PATTERNS}
    # Two kinds come from more than one line: an OOM under CUDA-graph capture, and any other failure.
    assert kinds | {"cuda_graph_oom", "startup_failed"} == set(STARTUP_ERRORS) | set(FAILED_START)
    assert not set(STARTUP_ERRORS) & set(FAILED_START)
    assert {startup.finding_id(kind) for kind in kinds} <= {finding_id for _, finding_id in DECLARED}


def _restarted(ts: float) -> Scrape:
    return Scrape(ts, parse_snapshot(text(gen=5, running=1).replace("process_start_time_seconds 1000",
                                                                    "process_start_time_seconds 2000")))


def _ttft(queue_s: float, prefill_s: float) -> list[Scrape]:
    """20 requests a second whose TTFT p95 is over 500 ms, with the mean queue and prefill times given."""
    return [scrape(float(t), gen=100 * t, running=8, waiting=4, usage=0.3, ttft_counts=[0.0, 20.0 * t, 0.0],
                   queue_seconds=(queue_s * 20 * t, 20 * t), prefill_seconds=(prefill_s * 20 * t, 20 * t))
            for t in range(10)]


# One line per startup error kind vLLM prints (the fixtures hold real logs of three of them).
VERSION = "INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.10.2\n"
STARTUP_LINES = {
    "autofit_impossible": "ValueError: Cannot auto-fit max_model_len: not enough memory for even 1 token.",
    "profiling_changed": "AssertionError: Error in memory profiling. Initial free memory 30.0 GiB, current 20.0 GiB.",
    "oom_model_load": "ERROR Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization.",
    "oom_sampler": "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests.",
    "cuda_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "engine_dead": "RuntimeError: Engine core initialization failed. See root cause above.",
}
# One log per failed start outside the memory family (tests/unit/test_startup_failures.py judges them
# and the real ones), and the logs that show neither a start nor a failure.
FAILED_START_LOGS = {
    "max_model_len_too_long": "ValueError: User-specified max_model_len (4096) is greater than the derived "
                              "max_model_len (max_position_embeddings=2048 or model_max_length=None in model's config.json).",
    "batched_below_max_model_len": "  Value error, max_num_batched_tokens (512) is smaller than max_model_len (2048).",
    "batched_below_max_num_seqs": "  Value error, max_num_batched_tokens (32) must be greater than or equal to "
                                  "max_num_seqs (64).",
    "tp_attention_heads": "ValueError: Total number of attention heads (4) must be divisible by tensor parallel size (3).",
    "tp_kv_heads": "INFO non-default args: {'tensor_parallel_size': 3}\nAssertionError: 3 is not divisible by 2",
    "attention_unsupported": "ValueError: Aligned KV cache block size 48 is not supported by attention backend(s): X.",
    "dtype_unsupported": "ValueError: Unknown dtype: 'float64'",
    "invalid_argument": "api_server.py: error: argument --dtype: invalid choice: 'float64' (choose from auto, half)",
    "port_in_use": "OSError: [Errno 98] Address already in use",
    "model_gated": "huggingface_hub.errors.GatedRepoError: 401 Client Error.",
    "model_not_found": "OSError: x is not a local folder and is not a valid model identifier listed on "
                       "'https://huggingface.co/models'",
    "trust_remote_code": "ValueError: Please pass the argument `trust_remote_code=True` to allow custom code to be run.",
    "nccl": "RuntimeError: NCCL error: unhandled system error",
    "cuda_graph_oom": "Capturing CUDA graphs (decode, FULL):  40%\ntorch.OutOfMemoryError: CUDA out of memory.",
    "startup_failed": "FluxCapacitorError: cold",
    "startup_log_empty": "",
    "startup_not_confirmed": "INFO starting",
}


def _contexts() -> dict[str, Context]:
    """Windows that make each rule speak (problem, info or nothing), one per condition."""
    stalled = [scrape(float(t), gen=100 * min(t, 4), running=4) for t in range(15)]
    queued = [scrape(float(t), gen=100 * t, running=4, waiting=10 if t >= 5 else 0, usage=0.3) for t in range(12)]
    # 50 steps a second of 32 tokens each (iteration_tokens' (16, 32] bucket) with 1-3 running and 6
    # waiting, under --max-num-seqs 8 and --max-num-batched-tokens 32: the budget, not the seats.
    budget_bound = [scrape(float(t), gen=10 * t, running=1 + t % 3, waiting=6 if t >= 2 else 0, usage=0.2,
                           step_counts=[0, 0, 0, 50 * t] + [0] * 10, step_sum=32.0 * 50 * t) for t in range(12)]
    preempted = [scrape(float(t), gen=100 * t, running=10, waiting=5, usage=1.0, preempt=2 * t) for t in range(20)]
    slow = [scrape(float(t), gen=100 * t, running=8, itl_counts=[0, 0, 50 * t] + [0] * 11, itl_sum=t)
            for t in range(10)]
    sampled = [scrape(float(t), gen=100 * t, prefix_caching=False, n_counts=[t, 0, 0, 5 * t, 0, 0]) for t in range(5)]
    # n = 4 samples of 100-token prompts, prefix caching on, and hardly a cache hit.
    unshared = [scrape(float(t), gen=100 * t, n_counts=[0, 0, 5 * t, 0, 0, 0], hits=t, queries=1000 * t,
                       prompt_len_counts=[0] * 6 + [5 * t] + [0] * 5) for t in range(5)]
    bare = [Scrape(float(t), parse_snapshot(f'vllm:num_requests_running{{model_name="m"}} {t}\n')) for t in range(3)]
    late = steady(5) + [down(5.0, ErrorKind.TIMEOUT)] + steady(10)[6:]
    recording = read_recording(str(FIXTURES / "recording-tiny-burst-0.32.0.jsonl.gz"))
    contexts = {
        "healthy": prepare(steady(30, running=8, usage=0.3)),
        "stall": prepare(stalled),
        "tokens_stopped": prepare(stalled[:8]),
        "queue": prepare(queued),
        "queue_token_budget": prepare(budget_bound, max_num_seqs=8, max_num_batched_tokens=32),
        # The same steps under a budget of 512: neither the seats nor the budget held admission.
        "requests_waiting": prepare(budget_bound, max_num_seqs=8, max_num_batched_tokens=512),
        "preemption": prepare(preempted),
        "outage_and_restart": prepare(steady(5, running=1) + [down(5.0), down(6.0)] + [_restarted(7.0)]),
        "late_scrape": prepare(late),
        "head_of_line": prepare(hol_history(2000), budgets=Budgets(itl_ms=5)),
        "slow_decode": prepare(slow, budgets=Budgets(itl_ms=5)),
        "itl_budget_unset": prepare(slow),
        # Every gap ≤ 10 ms (the first bucket) under a 4 ms budget: not judged, and said.
        "itl_budget_below_buckets": prepare([scrape(float(t), gen=100 * t, running=2, itl_counts=[50 * t] + [0] * 13,
                                                    itl_sum=0.005 * 50 * t) for t in range(10)], budgets=Budgets(itl_ms=4)),
        "ttft_queue": prepare(_ttft(0.6, 0.2), budgets=Budgets(ttft_ms=500)),
        "ttft_prefill": prepare(_ttft(0.1, 0.7), budgets=Budgets(ttft_ms=500)),
        "sharing_disabled": prepare(sampled),
        "sharing_not_happening": prepare(unshared),
        "unexplained_change": prepare(changed_window()),
        "latency_changed": prepare(missed_window(hits_after=0.0)),
        "absent": prepare(bare),
        "gpu_throttled": prepare(steady(10), gpus=gpu_readings(10, clock_events=ClockEvent.SW_POWER_CAP)),
        "gpu_saturated": prepare(steady(10, running=64, waiting=12, usage=0.5),
                                 gpus=gpu_readings(10, utilization_gpu_perc=1.0, clock_events=ClockEvent(0),
                                                   power_watts=690.0, power_limit_watts=700.0)),
        **{name: prepare([Scrape(ts, parse_snapshot(t)) for ts, t in Simulation(name).run_for(40)])
           for name in ("hung_rank", "lora_deferred", "admission_limit", "asleep", "spec_decode_low", "slow_rank",
                        "pinned_rank")},
        "real_recording": prepare(recording.scrapes(), info=recording.info(), budgets=Budgets(itl_ms=1, ttft_ms=1)),
        # Outcomes: 2 of every 10 answered 5xx; 3 of 11 refused 4xx; 3 of 8 answers never finished while
        # 6 wait at a cap of 4; every answer finished at prompt + output = --max-model-len 512.
        "failed": prepare(cumulative([{"gen": 50, "http": (8, 0, 2), "finished": (0, 8, 0, 0)}] * 10)),
        "rejected": prepare(cumulative([{"gen": 50, "http": (8, 3, 0), "finished": (0, 8, 0, 0)}] * 10)),
        "gave_up": prepare(cumulative([{"gen": 50, "http": (8, 0, 0), "finished": (0, 5, 0, 0), "running": 4,
                                        "waiting": 6, "usage": 0.3}] * 10), max_num_seqs=4),
        "cut": prepare(cumulative([{"gen": 50, "http": (4, 0, 0), "finished": (0, 4, 0, 0),
                                    "lengths": (4 * 300, 4 * 212, 4)}] * 10), max_model_len=512),
        **{f"log_{kind}": prepare([], log_text=VERSION + line + "\n") for kind, line in STARTUP_LINES.items()},
        **{f"log_{kind}": prepare([], log_text=text + "\n" if text else "") for kind, text in FAILED_START_LOGS.items()},
    }
    for log in FIXTURES.glob("log-*.txt"):
        contexts[log.stem] = prepare([], log_text=log.read_text())
    contexts["engine_killed_log"] = prepare([], log_text=(FIXTURES / "incidents" / "engine_killed.log").read_text())
    for log in (FIXTURES / "shutdown").glob("*.log"):
        contexts[f"shutdown_{log.stem}"] = prepare([], log_text=log.read_text())
    return contexts


CONTEXTS = _contexts()


def _knobs(finding: Finding, row: tuple[str, ...]) -> tuple[str, ...]:
    """The knob rows a finding must carry: a finding that checked its symptom's causes rests on the named
    cause's row (none when no cause was identified or the cause has no flag); the others on ``row``."""
    symptom = SYMPTOMS.get(finding.evidence.get("symptom", ""))
    if symptom is None:
        return row
    cause = finding.evidence.get("cause")
    knob = symptom.cause(cause).knob if cause else None
    return (knob,) if knob else ()


def _runs(ctx: Context) -> list[Rule]:
    return [rule for rule in RULES if ctx.ok or not rule.needs_scrapes]


def test_the_sample_windows_build_every_finding_id_every_row_declares() -> None:
    built = {(rule.id, f.id) for ctx in CONTEXTS.values() for rule in _runs(ctx) for f in run_rule(rule, ctx)}
    assert built == {(rule.id, finding_id) for rule, finding_id in DECLARED}


@pytest.mark.parametrize("name", CONTEXTS)
def test_each_finding_carries_the_knobs_chart_and_window_of_its_row_and_no_body_writes_them(name: str) -> None:
    ctx = CONTEXTS[name]
    for rule in _runs(ctx):
        for raw in rule.run(ctx):
            assert (raw.knobs, raw.chart, "window" in raw.evidence) == ((), None, False), (rule.id, raw.id)
        for finding in run_rule(rule, ctx):
            stamp = rule.stamp(finding.id)
            assert finding.knobs == _knobs(finding, stamp.knobs), (rule.id, finding.id)
            assert finding.chart == (stamp.chart if ctx.ok else None), (rule.id, finding.id)
            window = finding.evidence.get("window")
            if stamp.window and ctx.history:
                assert window == {"start": ctx.history[0].ts, "end": ctx.history[-1].ts,
                                  "seconds": round(ctx.history[-1].ts - ctx.history[0].ts, 3)}, (rule.id, finding.id)
            else:
                assert window is None, (rule.id, finding.id)


def test_a_finding_named_in_overrides_or_absent_carries_that_entry_not_its_rows() -> None:
    """Read from the rows' own entries, not through ``Rule.stamp``: an override finding carries its
    entry's knobs, chart and window, an ``absent:`` one none of them; and the sample windows build
    each such finding at least once."""
    seen = set()
    for ctx in CONTEXTS.values():
        for rule in _runs(ctx):
            for f in run_rule(rule, ctx):
                entry = rule.overrides.get(f.id) or (BARE if f.id == f"absent:{rule.absent}" else None)
                if entry is None:
                    continue
                seen.add((rule.id, f.id))
                assert (f.knobs, f.chart, "window" in f.evidence) == (
                    _knobs(f, entry.knobs), entry.chart if ctx.ok else None, entry.window and bool(ctx.history)), (rule.id, f.id)
    assert seen == {(rule.id, finding_id) for rule, finding_id in DECLARED
                    if finding_id in rule.overrides or finding_id == f"absent:{rule.absent}"}


@pytest.mark.parametrize("name", [n for n, ctx in CONTEXTS.items() if ctx.ok])
def test_rows_marked_not_while_tokens_stopped_are_skipped_then_and_only_they(name: str) -> None:
    """The same window judged as if tokens had just stopped: the rows that give queue, capacity or
    latency advice say nothing, every other row says what it said."""
    ctx = CONTEXTS[name]
    stopped = replace(ctx, tokens_stopped=TokensStopped(3.0, ctx.ok[-1][0].ts - 3.0, 4.0, False))
    during = {f.id for f in diagnose(stopped)}
    for rule in _runs(ctx):
        said = {f.id for f in run_rule(rule, ctx)}
        assert (said <= during) if rule.while_tokens_stopped else not said & during, rule.id
