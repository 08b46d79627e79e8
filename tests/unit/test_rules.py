"""Table-driven tests of each rule's thresholds on synthetic histories (one behaviour each)."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from diagnostics.core.diagnosis import (
    Budgets,
    Finding,
    KnownFlags,
    Suggestion,
    Thresholds,
    command_diff,
    diagnose,
    exit_code,
    prepare,
)
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape, histogram_delta, histogram_quantile
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.simulator.scenarios import SCENARIOS, Scenario
from diagnostics.core.simulator.scheduler import SimEngine
from diagnostics.recording import read_recording
from diagnostics.sim.driver import Simulation
from tests.unit.synth import down, scrape

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def ids(findings: list[Finding], severity: str | None = None) -> list[str]:
    return [f.id for f in findings if severity is None or f.severity == severity]


def steady(seconds: int, **kw: object) -> list:  # type: ignore[type-arg]
    """One scrape a second with tokens flowing (so no stall), overridable per field."""
    gen = kw.pop("gen_per_s", 100)
    return [scrape(float(t), gen=t * gen, **kw) for t in range(seconds)]


def test_healthy_history_has_no_warning() -> None:
    history = steady(30, running=8, usage=0.3)
    assert ids(diagnose(prepare(history)), "warning") == [] and ids(diagnose(prepare(history)), "critical") == []


@pytest.mark.parametrize(("seconds_at_cap", "usage", "fires"), [
    (2, 0.3, False), (4, 0.3, True), (10, 0.79, True), (10, 0.85, False),
])
def test_queue_at_cap_needs_time_at_the_cap_and_room_in_kv(seconds_at_cap: int, usage: float, fires: bool) -> None:
    history = [scrape(float(t), gen=100 * t, running=4, usage=usage) for t in range(5)]
    history += [scrape(float(t), gen=100 * t, running=4, waiting=10, usage=usage)
                for t in range(5, 5 + seconds_at_cap + 1)]
    findings = diagnose(prepare(history))
    assert ("queue_at_cap" in ids(findings)) == fires
    if fires:
        f = next(f for f in findings if f.id == "queue_at_cap")
        assert f.suggestions[0].flag == "--max-num-seqs" and f.suggestions[0].direction == "increase"
        assert f.suggestions[0].value == 14
        assert f.time_range == (5.0, 5.0 + seconds_at_cap)
    elif usage >= 0.8:
        # At the cap with the KV cache 85 % full, neither free nor full: said, with no flag (more seats may
        # only fill the cache), never silence.
        (f,) = [f for f in findings if f.id == "requests_waiting"]
        assert f.suggestions == () and f.evidence["cause"] is None
        assert {r["cause"]: r["fit"] for r in f.evidence["causes"]}["kv_full"] == "unknown"


@pytest.mark.parametrize(("gap_s", "one_wait"), [(2.0, True), (2.5, False)])
def test_two_short_waits_at_the_cap_are_one_only_when_at_most_two_seconds_apart(gap_s: float, one_wait: bool) -> None:
    """Two 2 s waits (each under the 3 s a queue needs): one 6 s wait when the gauge read 0 for at most
    2 s between them, two short ones (nothing to report) when it stayed 0 longer."""
    ts = [i / 2 for i in range(40)]
    waiting = [0.0 <= t <= 2.0 or 2.0 + gap_s <= t <= 4.0 + gap_s for t in ts]
    history = [scrape(t, gen=100 * t, running=4, waiting=3 if w else 0, usage=0.2) for t, w in zip(ts, waiting)]
    assert ("queue_at_cap" in ids(diagnose(prepare(history, max_num_seqs=4)))) == one_wait


def test_queue_uses_the_known_cap_when_given() -> None:
    history = [scrape(float(t), gen=100 * t, running=6, waiting=3, usage=0.2) for t in range(10)]
    assert "queue_at_cap" not in ids(diagnose(prepare(history, max_num_seqs=16)))
    assert "queue_at_cap" in ids(diagnose(prepare(history, max_num_seqs=6)))


@pytest.mark.parametrize(("preempt_per_s", "usage", "waiting", "severity"), [
    (0, 1.0, 5, None), (0.5, 0.97, 0, "warning"), (2, 1.0, 5, "critical"),
    (1, 1.0, 5, "critical"), (0.9, 1.0, 5, "warning"),  # one preemption a second is the critical line
])
def test_kv_pressure(preempt_per_s: float, usage: float, waiting: float, severity: str | None) -> None:
    history = [scrape(float(t), gen=100 * t, running=10, waiting=waiting, usage=usage, preempt=preempt_per_s * t)
               for t in range(20)]
    findings = diagnose(prepare(history, gpu_memory_utilization=0.9, max_model_len=8192))
    found = [f for f in findings if f.id == "kv_pressure"]
    assert (found[0].severity if found else None) == severity
    if found:
        flags = {(s.flag, s.direction) for s in found[0].suggestions}
        assert ("--max-num-seqs", "increase") not in flags
        assert ("--max-num-seqs", "decrease") in flags
        assert ("--gpu-memory-utilization", "increase") in flags and ("--kv-cache-dtype", "set") in flags


def test_fewer_seqs_is_sized_from_what_ran_at_the_onset_not_the_episodes_peak() -> None:
    """Preemption from t = 5 s on, once a second, while the running count climbs 10 → 58: one
    episode. At the onset 10 ran (the scrapes either side read 10), so the advice is three quarters
    of 10, not of the 58 it reached later."""
    history = [scrape(float(t), gen=100 * t, running=10 if t <= 5 else 10 + 4 * (t - 5), waiting=5, usage=1.0,
                      preempt=max(0, t - 4)) for t in range(18)]
    found = [f for f in diagnose(prepare(history, gpu_memory_utilization=0.9)) if f.id == "kv_pressure"]
    assert found[0].evidence["num_requests_running_at_onset"] == 10 and found[0].evidence["episodes"] == 1
    assert [(s.direction, s.value) for s in found[0].suggestions if s.flag == "--max-num-seqs"] == [("decrease", 7)]


def test_kv_pressure_does_not_push_utilization_past_the_ceiling() -> None:
    history = [scrape(float(t), gen=100 * t, running=10, usage=1.0, preempt=t) for t in range(10)]
    findings = diagnose(prepare(history, gpu_memory_utilization=0.95))
    f = next(f for f in findings if f.id == "kv_pressure")
    assert "--gpu-memory-utilization" not in [s.flag for s in f.suggestions]


@pytest.mark.parametrize(("stall_seconds", "running", "fires"), [
    (3, 4, False), (4, 4, False), (5, 4, True), (6, 4, True), (10, 0, False),  # a stall from 5 s
])
def test_silent_stall(stall_seconds: int, running: int, fires: bool) -> None:
    history = [scrape(float(t), gen=100 * t, running=running) for t in range(5)]
    history += [scrape(float(t), gen=400, running=running) for t in range(5, 5 + stall_seconds)]
    history += [scrape(float(t), gen=400 + 100 * (t - 4 - stall_seconds), running=running)
                for t in range(5 + stall_seconds, 10 + stall_seconds)]
    findings = diagnose(prepare(history))
    assert ("silent_stall" in ids(findings, "critical")) == fires
    if fires:
        f = next(f for f in findings if f.id == "silent_stall")
        assert f.time_range == (4.0, 4.0 + stall_seconds) and f.evidence["ongoing"] is False


def test_a_silence_two_scrapes_saw_is_not_yet_a_stall() -> None:
    """Scrapes every 3 s: 6 s without a token with 4 running, read by two scrapes, is under the three
    scrapes a stall needs; a third scrape that still reads none makes it one."""
    def history(silent_scrapes: int) -> list[Scrape]:
        moving = [scrape(float(t), gen=100 * t, running=4) for t in range(5)]
        silent = [scrape(4.0 + 3 * i, gen=400, running=4) for i in range(1, silent_scrapes + 1)]
        end = 4.0 + 3 * silent_scrapes
        return moving + silent + [scrape(end + 1 + t, gen=500 + 100 * t, running=4) for t in range(3)]

    assert "silent_stall" not in ids(diagnose(prepare(history(2))))
    assert "silent_stall" in ids(diagnose(prepare(history(3))))


def test_an_outage_that_came_and_went_is_reported_with_its_range() -> None:
    history = steady(5, running=1) + [down(5.0), down(6.0), down(7.0)] + [
        scrape(float(t), gen=100 * t, running=1) for t in range(8, 12)]
    f = next(f for f in diagnose(prepare(history)) if f.id == "server_down")
    assert f.severity == "critical" and f.time_range == (5.0, 7.0) and f.evidence["ongoing"] is False
    assert "recovered" in f.title


def test_what_the_server_did_before_an_outage_is_read_from_the_last_minute_only() -> None:
    """20 running until 70 s before the outage, 2 in the minute before it: the minute is what counts."""
    history = [scrape(float(t), gen=100 * t, running=20 if t < 30 else 2) for t in range(100)] + [
        down(100.0), down(101.0)]
    f = next(f for f in diagnose(prepare(history)) if f.id == "server_down")
    assert f.evidence["before_max_num_requests_running"] == 2
    assert f.evidence["before_last_good_scrape_at"] == 99.0


def test_an_ongoing_outage_is_critical_and_says_so() -> None:
    history = steady(5) + [down(5.0), down(6.0, ErrorKind.ENGINE_UNAVAILABLE)]
    f = next(f for f in diagnose(prepare(history)) if f.id == "server_down")
    assert f.evidence["ongoing"] is True and "Engine dead" in f.title
    assert exit_code(diagnose(prepare(history))) == 2


def _itl(baseline: float, spike: float, bucket: int = 8) -> list[float]:
    """ITL bucket counts: ``baseline`` observations ≤ 10 ms, ``spike`` in bucket ``bucket``
    (8: (0.3, 0.4] s; 5: (0.1, 0.15] s)."""
    counts = [0.0] * 14
    counts[0] = baseline
    counts[bucket] = spike
    return counts


def hol_history(prefill_tokens: float, spikes: int = 3, bucket: int = 8) -> list:  # type: ignore[type-arg]
    history = []
    cum = [0.0] * 14
    prompt = 0.0
    for t in range(20):
        spike = t in (5, 10, 15)[:spikes]
        add = _itl(100, 20 if spike else 0, bucket)
        cum = [a + b for a, b in zip(cum, add)]
        prompt += prefill_tokens if spike else 10
        history.append(scrape(float(t), gen=100 * t, running=16, itl_counts=cum, itl_sum=t, prompt=prompt))
    return history


@pytest.mark.parametrize(("prefill_tokens", "spikes", "fires"), [(2000, 3, True), (100, 3, False), (2000, 1, False)])
def test_head_of_line_needs_spikes_that_coincide_with_prefills(prefill_tokens: float, spikes: int, fires: bool) -> None:
    findings = diagnose(prepare(hol_history(prefill_tokens, spikes)))
    assert ("head_of_line_blocking" in ids(findings)) == fires
    if fires:
        f = next(f for f in findings if f.id == "head_of_line_blocking")
        assert f.suggestions[0].flag == "--max-num-batched-tokens" and f.suggestions[0].direction == "decrease"
        # 2000 × (0.1 − 0.00516)/(0.394 − 0.00516) = 488 → below the 512 floor.
        assert f.suggestions[0].value == 512
        assert "--max-num-seqs" not in [s.flag for s in f.suggestions]


def test_head_of_line_chunk_never_goes_below_max_num_seqs() -> None:
    """976 tokens would do (see below), but vLLM refuses a budget under --max-num-seqs 1024."""
    f = next(f for f in diagnose(prepare(hol_history(4000), max_num_batched_tokens=8192, max_num_seqs=1024))
             if f.id == "head_of_line_blocking")
    assert f.suggestions[0].value == 1024


@pytest.mark.parametrize(("prefill", "bucket", "budget", "expected"), [
    # Baseline B = the window median: 1,900 gaps in [0, 10 ms] and 60 spikes, rank 980 →
    # 0.01 × 980/1,900 = 5.16 ms; threshold T = 100 ms (the floor). Chunk = S × (T − B)/(W − B).
    # Spikes in (0.3, 0.4]: W = 0.3 + 0.1 × 18.8/20 = 0.394 s → 4000 × 0.2439 = 976 → 512.
    (4000, 8, 8192, 512),
    # Spikes in (0.1, 0.15]: W = 0.1 + 0.05 × 18.8/20 = 0.147 s → 4000 × 0.6687 = 2675 → 2048.
    (4000, 5, None, 2048),
    # Steps are at most the known budget: 4096 × 0.2439 = 999 → 512 (8000 × 0.2439 would give 1024).
    (8000, 8, 4096, 512),
    # At most half the known budget, as a power of two: 3500 × 0.6687 = 2340 → 2048, but 3500 / 2
    # = 1750 → 1024.
    (4000, 5, 3500, 1024),
])
def test_head_of_line_chunk_keeps_a_step_under_the_threshold(
    prefill: float, bucket: int, budget: int | None, expected: int
) -> None:
    f = next(f for f in diagnose(prepare(hol_history(prefill, bucket=bucket), max_num_batched_tokens=budget))
             if f.id == "head_of_line_blocking")
    assert f.suggestions[0].value == expected


@pytest.mark.parametrize(("budget_ms", "fires"), [(None, False), (50, False), (5, True)])
def test_slow_decode_needs_a_budget(budget_ms: float | None, fires: bool) -> None:
    history = [scrape(float(t), gen=100 * t, running=8, itl_counts=[0, 0, 50 * t] + [0] * 11, itl_sum=t)
               for t in range(10)]
    findings = diagnose(prepare(history, budgets=Budgets(itl_ms=budget_ms)))
    assert ("slow_decode" in ids(findings, "warning")) == fires
    if budget_ms is None:
        assert "itl_budget_unset" in ids(findings, "info")


@pytest.mark.parametrize(("caching", "n_gt_1", "expected"), [
    (False, 5, "sharing_disabled"), (True, 5, None), (False, 0, None),
])
def test_parallel_sampling_without_prefix_caching(caching: bool, n_gt_1: int, expected: str | None) -> None:
    history = [scrape(float(t), gen=100 * t, prefix_caching=caching, n_counts=[t, 0, 0, n_gt_1 * t, 0, 0])
               for t in range(5)]
    found = [f.id for f in diagnose(prepare(history)) if f.id.startswith("sharing")]
    assert found == ([expected] if expected else [])


def test_absent_metrics_say_so_in_info() -> None:
    from diagnostics.core.metrics.catalog import parse_snapshot
    from diagnostics.core.metrics.derive import Scrape

    history = [Scrape(float(t), parse_snapshot(f'vllm:num_requests_running{{model_name="m"}} {t}\n')) for t in range(3)]
    findings = diagnose(prepare(history))
    assert {"absent:silent_stall", "absent:kv_pressure"} <= set(ids(findings, "info"))
    assert exit_code(findings) == 0


@pytest.mark.parametrize(("severities", "code"), [((), 0), (("info",), 0), (("info", "warning"), 1),
                                                   (("warning", "critical"), 2)])
def test_exit_code(severities: tuple[str, ...], code: int) -> None:
    findings = [Finding(id=str(i), severity=s, title="", evidence={}) for i, s in enumerate(severities)]  # type: ignore[arg-type]
    assert exit_code(findings) == code


def test_command_diff_shows_known_and_unknown_values() -> None:
    flags = KnownFlags(model="llama", gpu_memory_utilization=0.9, max_model_len=8192, enable_prefix_caching=False)
    diff = command_diff(flags, [Suggestion("--gpu-memory-utilization", "increase", 0.95, ""),
                                   Suggestion("--tensor-parallel-size", "increase", None, ""),
                                   Suggestion("--enable-prefix-caching", "set", None, "")])
    assert diff.before == "vllm serve llama --max-model-len 8192 --gpu-memory-utilization 0.9 --no-enable-prefix-caching"
    assert diff.after == ("vllm serve llama --max-model-len 8192 --gpu-memory-utilization 0.95 "
                          "--tensor-parallel-size <↑> --enable-prefix-caching")


def test_thresholds_are_parameters() -> None:
    history = [scrape(float(t), gen=100 * t, running=4, waiting=10, usage=0.3) for t in range(3)]
    assert "queue_at_cap" not in ids(diagnose(prepare(history)))
    assert "queue_at_cap" in ids(diagnose(prepare(history, thresholds=Thresholds(queue_min_seconds=1.0))))


# -- the statistics behind head-of-line blocking and slow decode (issue 9) -------------------------

ITL_SLOTS = 14  # 13 ITL bounds + the +Inf bucket
STEP_SLOTS = 14
PROMPT_SLOTS = 12


def _latency_history(per_interval: list[dict[str, object]]) -> list:  # type: ignore[type-arg]
    """Cumulative scrapes from per-interval increments: ``itl`` (bucket counts), ``steps``
    (iteration-token bucket counts), ``prompts`` (prompt-length bucket counts), ``running``."""
    history = []
    itl, steps, prompts = [0.0] * ITL_SLOTS, [0.0] * STEP_SLOTS, [0.0] * PROMPT_SLOTS
    gen = 0.0
    for t, iv in enumerate(per_interval):
        itl = [a + b for a, b in zip(itl, iv.get("itl", [0.0] * ITL_SLOTS))]  # type: ignore[arg-type]
        steps = [a + b for a, b in zip(steps, iv.get("steps", [0.0] * STEP_SLOTS))]  # type: ignore[arg-type]
        prompts = [a + b for a, b in zip(prompts, iv.get("prompts", [0.0] * PROMPT_SLOTS))]  # type: ignore[arg-type]
        gen += sum(iv.get("itl", [1.0]))  # type: ignore[arg-type]
        history.append(scrape(float(t), gen=gen, running=iv.get("running", 16), itl_counts=itl, itl_sum=0.0,
                              step_counts=steps, prompt_len_counts=prompts))
    return history


def _counts(slots: int, **at: float) -> list[float]:
    counts = [0.0] * slots
    for index, n in at.items():
        counts[int(index[1:])] = n
    return counts


def _modest_spikes() -> list:  # type: ignore[type-arg]
    """Every 4th interval: 10 of 210 gaps in (50, 75] ms over a ≤ 10 ms median, next to a large step
    and a long prompt — everything head-of-line needs except spikes a user would notice."""
    return _latency_history([{"itl": _counts(ITL_SLOTS, b0=200, b3=10 if t % 4 == 0 else 0), "running": 4,
                              "steps": _counts(STEP_SLOTS, b8=1 if t % 4 == 0 else 0),
                              "prompts": _counts(PROMPT_SLOTS, b9=1 if t % 4 == 0 else 0)} for t in range(20)])


@pytest.mark.parametrize(("floor_s", "budget_ms", "fires"), [
    (0.100, None, False),  # a 50-75 ms gap is no incident: below the 100 ms floor
    (0.0, None, True),  # the same data without the floor: it is the floor that keeps it quiet
    (0.100, 40.0, True),  # with an ITL budget of 40 ms, gaps above the budget matter
    (0.100, 200.0, False),  # and with 200 ms they do not
])
def test_a_spike_must_matter_in_absolute_terms(floor_s: float, budget_ms: float | None, fires: bool) -> None:
    """Failure shape 1: a healthy server's tail several times its median is not head-of-line
    blocking unless the gaps exceed the ITL budget, or, without one, a floor a user notices."""
    ctx = prepare(_modest_spikes(), budgets=Budgets(itl_ms=budget_ms),
                  thresholds=Thresholds(hol_spike_floor_seconds=floor_s))
    assert ("head_of_line_blocking" in ids(diagnose(ctx))) == fires


def test_a_tail_that_only_p99_sees_next_to_long_prompts_is_head_of_line() -> None:
    """Failure shape 2: p50 and p90 flat (95 % of gaps ≤ 10 ms), 3 % of gaps in (0.4, 0.5] s in the
    intervals with a 1,500-token step and long prompts: head-of-line blocking."""
    intervals = []
    for t in range(24):
        burst = t % 6 == 3
        intervals.append({"itl": _counts(ITL_SLOTS, b0=485, b9=15) if burst else _counts(ITL_SLOTS, b0=500),
                          "steps": _counts(STEP_SLOTS, b2=40, b10=1 if burst else 0),
                          "prompts": _counts(PROMPT_SLOTS, b10=3 if burst else 0, b2=8), "running": 24})
    findings = diagnose(prepare(_latency_history(intervals)))
    f = next(f for f in findings if f.id == "head_of_line_blocking")
    assert f.evidence["spike_intervals_next_to_large_prefill"] == 4
    assert f.evidence["itl_window_p50_seconds"] < 0.01
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == ("--max-num-batched-tokens", "decrease")


def _p99_only(long_prompts: bool) -> list:  # type: ignore[type-arg]
    intervals = []
    for t in range(24):
        burst = t % 6 == 3
        intervals.append({"itl": _counts(ITL_SLOTS, b0=485, b9=15) if burst else _counts(ITL_SLOTS, b0=500),
                          "steps": _counts(STEP_SLOTS, b2=40, b10=1 if burst else 0),
                          "prompts": _counts(PROMPT_SLOTS, b10=3 if burst and long_prompts else 0,
                                             b3=3 if burst and not long_prompts else 0, b2=8), "running": 24})
    return _latency_history(intervals)


def test_tail_spikes_next_to_large_steps_of_many_short_prompts_are_not_head_of_line() -> None:
    """The p99-only data, but the large steps come from many short prompts (none over 500 tokens)."""
    assert "head_of_line_blocking" in ids(diagnose(prepare(_p99_only(long_prompts=True))))
    assert "head_of_line_blocking" not in ids(diagnose(prepare(_p99_only(long_prompts=False))))


def _ramp(with_long_prompt_spikes: bool) -> list:  # type: ignore[type-arg]
    """8 → 48 → 160 running with 8-token prompts (steps of > 512 tokens when a level arrives); ITL
    300 gaps per interval in (0, 10], (25, 50], (50, 75] ms. Optionally every 5th interval also
    15 gaps in (0.4, 0.5] s next to a > 1,024-token step and two long prompts."""
    intervals = []
    for t in range(30):
        running, bucket = (8, 0) if t < 10 else (48, 2) if t < 20 else (160, 3)
        spike = with_long_prompt_spikes and t % 5 == 2
        itl = _counts(ITL_SLOTS, **{f"b{bucket}": 300})
        if spike:
            itl[9] += 15
        intervals.append({"itl": itl,
                          "steps": _counts(STEP_SLOTS, b9=2 if t in (10, 20) else 0, b7=20, b10=1 if spike else 0),
                          "prompts": _counts(PROMPT_SLOTS, b3=running, b10=2 if spike else 0), "running": running})
    return _latency_history(intervals)


@pytest.mark.parametrize("with_long_prompt_spikes", [False, True])
def test_a_median_rising_with_the_batch_is_slow_decode_not_head_of_line(with_long_prompt_spikes: bool) -> None:
    """Failure shape 3: ITL p50 rises 5 → 37.5 → 62.5 ms with 8 → 48 → 160 running. Even with tail
    spikes next to long prompts, a median that rises with the batch is batch size."""
    findings = diagnose(prepare(_ramp(with_long_prompt_spikes), budgets=Budgets(itl_ms=40)))
    assert "head_of_line_blocking" not in ids(findings)
    f = next(f for f in findings if f.id == "slow_decode")
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == ("--max-num-seqs", "decrease")
    assert f.evidence["median_rises_with_batch"] is True


@pytest.mark.parametrize(("budget_ms", "defended"), [
    # Cumulative p95 over running ≤ 8: within (0, 10] ms → ≤ 40 ms; ≤ 48: 5,700 of 6,000 gaps
    # below 50 ms: p95 = 0.025 + 0.025 × (5,700 − 3,000)/3,000 = 47.5 ms > 40 → stops at 8.
    (40.0, 8),
    # With 60 ms, 47.5 ms is within; ≤ 160 adds 3,000 in (50, 75]: p95 = 0.05 + 0.025 × (8,550 −
    # 6,000)/3,000 = 71.25 ms > 60 → stops at 48.
    (60.0, 48),
])
def test_slow_decode_lowers_max_num_seqs_to_the_batch_the_budget_defends(budget_ms: float, defended: int) -> None:
    f = next(f for f in diagnose(prepare(_ramp(False), budgets=Budgets(itl_ms=budget_ms))) if f.id == "slow_decode")
    assert f.suggestions[0].value == defended


def test_a_median_rising_with_the_batch_leads_with_a_value_even_when_no_batch_met_the_budget() -> None:
    """A 9 ms budget: the smallest batch's gaps are ≤ 10 ms (p95 9.5 ms), so none is defended, yet the
    median rose 5 → 62.5 ms with 8 → 160 running: start from the 8 the fast median was measured at."""
    f = next(f for f in diagnose(prepare(_ramp(False), budgets=Budgets(itl_ms=9))) if f.id == "slow_decode")
    assert f.evidence["defended_num_requests_running"] is None
    assert [(s.flag, s.direction, s.value) for s in f.suggestions[:2]] == [
        ("--max-num-seqs", "decrease", 8), ("--quantization", "set", None)]


def test_a_median_flat_across_the_batch_gives_no_fewer_sequences() -> None:
    """8 → 48 → 160 running and every gap in (50, 75] ms at each: over a 40 ms budget at every batch,
    and no smaller batch ran faster: the batch size is ruled out, so --max-num-seqs is not suggested."""
    history = _latency_history([{"itl": _counts(ITL_SLOTS, b3=300), "steps": _counts(STEP_SLOTS, b7=20),
                                 "prompts": _counts(PROMPT_SLOTS), "running": 8 if t < 10 else 48 if t < 20 else 160}
                                for t in range(30)])
    f = next(f for f in diagnose(prepare(history, budgets=Budgets(itl_ms=40))) if f.id == "slow_decode")
    assert f.evidence["median_rises_with_batch"] is False
    assert "--max-num-seqs" not in [s.flag for s in f.suggestions] and f.suggestions[0].flag == "--quantization"
    assert {r["cause"]: r["fit"] for r in f.evidence["causes"]}["batch_size"] == "ruled_out"


def _simulated(scenario: Scenario, seconds: float = 60.0) -> list[Scrape]:
    return [Scrape(ts, parse_snapshot(t)) for ts, t in Simulation(scenario.name).run_for(seconds)]


def test_a_simulated_batch_grown_past_what_the_gpu_decodes_within_budget_leads_with_fewer_sequences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The built-in slow-decode engine (an 8B model in bf16 on an L4, --max-num-seqs 512) under 16
    requests a second of 250 tokens: past ~200 sequences a step is compute-bound (2 × 8.03e9 FLOPs a
    token at half of 121 TFLOPs), so the L4 decodes at most ~3,770 tokens a second against 4,000
    asked; the batch grows and every step slows. A 100 ms budget holds at the smaller batches."""
    base = SCENARIOS["slow_decode"]
    grown = replace(base, name="batch_grown", workload=replace(base.workload, rate_per_s=16.0), itl_budget_ms=100.0)
    monkeypatch.setitem(SCENARIOS, grown.name, grown)
    findings = diagnose(prepare(_simulated(grown), budgets=Budgets(itl_ms=grown.itl_budget_ms)))
    top = next(f for f in findings if f.severity != "info")
    assert top.id == "slow_decode"
    first = top.suggestions[0]
    assert (first.flag, first.direction) == ("--max-num-seqs", "decrease")
    assert isinstance(first.value, int) and first.value < top.evidence["peak_num_requests_running"]
    # A batch the L4 decodes within the budget even with every sequence at its full 282 tokens; the
    # peak it reached is not.
    engine = SimEngine(grown.config)
    assert engine.step_seconds(0, first.value, first.value * 282) <= 0.100
    peak = int(top.evidence["peak_num_requests_running"])
    assert engine.step_seconds(0, peak, peak * 282) > 0.100
    assert "--quantization" in [s.flag for s in top.suggestions[1:]]


def test_the_built_in_slow_decode_scenario_cannot_meet_its_budget_at_any_batch_so_fewer_sequences_do_not_lead() -> None:
    """Its one-sequence decode step (all 16 GB of weights read at 300 GB/s, plus launch overhead) is
    already over the 50 ms budget: no --max-num-seqs meets it, smaller weights can."""
    scenario = SCENARIOS["slow_decode"]
    assert scenario.itl_budget_ms is not None
    assert SimEngine(scenario.config).step_seconds(0, 1, 32) > scenario.itl_budget_ms / 1000
    f = next(f for f in diagnose(prepare(_simulated(scenario), budgets=Budgets(itl_ms=scenario.itl_budget_ms)))
             if f.id == "slow_decode")
    assert f.suggestions[0].flag == "--quantization"
    assert "--max-num-seqs" in [s.flag for s in f.suggestions[1:]]


def test_slow_decode_is_judged_without_the_tail_head_of_line_explains() -> None:
    """The p99-only head-of-line data: 3 % of gaps in (0.4, 0.5] s in 4 of 24 intervals. Its p95 with
    the spikes is above 9 ms; without them every gap is ≤ 10 ms. A 9.99 ms budget is met outside."""
    findings = diagnose(prepare(_p99_only(long_prompts=True), budgets=Budgets(itl_ms=9.99)))
    assert "head_of_line_blocking" in ids(findings)
    assert "slow_decode" not in ids(findings)


@pytest.mark.parametrize(("pin", "flag", "value"), [
    (',num_gpu_blocks_override="12"', "--num-gpu-blocks-override", 18),
    (',kv_cache_memory_bytes="67108864"', "--kv-cache-memory-bytes", 100663296),  # 64 MiB × 1.5
])
def test_a_pinned_kv_cache_gets_its_pin_raised_never_the_utilization(pin: str, flag: str, value: int) -> None:
    history = [scrape(float(t), gen=100 * t, running=10, waiting=5, usage=1.0, preempt=2 * t, pin=pin)
               for t in range(20)]
    f = next(f for f in diagnose(prepare(history)) if f.id == "kv_pressure")
    assert (f.suggestions[0].flag, f.suggestions[0].direction, f.suggestions[0].value) == (flag, "increase", value)
    assert "--gpu-memory-utilization" not in [s.flag for s in f.suggestions]
    if flag == "--num-gpu-blocks-override":
        # fp8 KV is proposed by the rule and dropped by the engine's check of the known flags.
        assert "--kv-cache-dtype" not in [s.flag for s in f.suggestions]
        assert any(c.startswith("Not suggested: --kv-cache-dtype") for c in f.checks)
    else:
        assert ("--kv-cache-dtype", "fp8") in [(s.flag, s.value) for s in f.suggestions]


@pytest.mark.parametrize(("flags", "suggestion", "ineffective"), [
    (KnownFlags(kv_cache_memory_bytes=2**26), Suggestion("--gpu-memory-utilization", "increase", 0.95, ""), True),
    (KnownFlags(num_gpu_blocks_override=12), Suggestion("--gpu-memory-utilization", "increase", 0.95, ""), True),
    (KnownFlags(num_gpu_blocks_override=12), Suggestion("--kv-cache-dtype", "set", "fp8", ""), True),
    (KnownFlags(kv_cache_memory_bytes=2**26), Suggestion("--kv-cache-dtype", "set", "fp8", ""), False),
    (KnownFlags(kv_cache_memory_bytes=2**26), Suggestion("--gpu-memory-utilization", "decrease", 0.5, ""), False),
    (KnownFlags(gpu_memory_utilization=0.9), Suggestion("--gpu-memory-utilization", "increase", 0.95, ""), False),
    (KnownFlags(enable_prefix_caching=True), Suggestion("--enable-prefix-caching", "set", None, ""), True),
    (KnownFlags(max_num_seqs=64), Suggestion("--max-num-seqs", "increase", 64, ""), True),
    (KnownFlags(max_num_seqs=64), Suggestion("--max-num-seqs", "decrease", 32, ""), False),
])
def test_a_change_the_configuration_makes_ineffective_is_recognised(
    flags: KnownFlags, suggestion: Suggestion, ineffective: bool
) -> None:
    assert (flags.ineffective(suggestion) is not None) == ineffective


@pytest.mark.parametrize(("arg", "flag"), [("kv_cache_memory_bytes", "--kv-cache-memory-bytes"),
                                          ("num_gpu_blocks_override", "--num-gpu-blocks-override")])
def test_a_startup_log_of_a_pinned_server_never_says_raise_the_utilization(arg: str, flag: str) -> None:
    log = (FIXTURES / "log-0.32.0-kv-too-small-for-max-model-len.txt").read_text()
    log = log.replace("'num_gpu_blocks_override': 12", f"'{arg}': 16777216")
    findings = diagnose(prepare([], log_text=log))
    suggested = [(s.flag, s.direction) for f in findings for s in f.suggestions]
    assert ("--gpu-memory-utilization", "increase") not in suggested
    assert (flag, "increase") in suggested
    assert suggested[0] == ("--max-model-len", "decrease")


def test_runtime_max_model_len_is_offered_only_as_a_plain_trade_off() -> None:
    """Prompts of at most 500 tokens (p99 in the (200, 500] bucket) on a 32k server under KV pressure."""
    history = [scrape(float(t), gen=100 * t, running=10, waiting=5, usage=1.0, preempt=2 * t,
                      prompt_len_counts=_counts(PROMPT_SLOTS, b8=3 * t)) for t in range(20)]
    f = next(f for f in diagnose(prepare(history, max_model_len=32768)) if f.id == "kv_pressure")
    flags = [s.flag for s in f.suggestions]
    assert "--max-model-len" in flags and flags[0] != "--max-model-len"
    cut = f.suggestions[flags.index("--max-model-len")]
    assert "trade-off" in cut.why and "frees nothing" in cut.why


def test_kv_pressure_sizes_each_suggestion_from_the_window() -> None:
    """The same window at --gpu-memory-utilization 0.8: one 0.05 step up (0.85); --max-model-len the
    p99 prompt (497) with 25 % headroom, rounded up to 256 tokens (768); --max-num-seqs three quarters
    of the 10 running when preemption began (7)."""
    history = [scrape(float(t), gen=100 * t, running=10, waiting=5, usage=1.0, preempt=2 * t,
                      prompt_len_counts=_counts(PROMPT_SLOTS, b8=3 * t)) for t in range(20)]
    f = next(f for f in diagnose(prepare(history, max_model_len=32768, gpu_memory_utilization=0.8))
             if f.id == "kv_pressure")
    values = {s.flag: s.value for s in f.suggestions}
    assert (values["--gpu-memory-utilization"], values["--max-model-len"], values["--max-num-seqs"]) == (0.85, 768, 7)


def test_no_queue_or_capacity_advice_while_running_requests_get_no_token() -> None:
    """Failure shape 5: attached in the first seconds of a stall, running at the cap with a queue
    (which looks like queue_at_cap): say "no token for N s, watching", advise nothing yet."""
    history = [scrape(float(t), gen=500, running=8, waiting=12, usage=0.3) for t in range(5)]
    findings = diagnose(prepare(history, max_num_seqs=8))
    assert not [f.id for f in findings if f.suggestions]
    assert "tokens_stopped" in ids(findings, "info")
    assert "queue_at_cap" not in ids(findings)


@pytest.mark.parametrize(("resumed_with_large_step", "stall"), [(True, False), (False, True)])
def test_seconds_without_tokens_that_end_in_one_large_step_are_a_long_prefill_not_a_stall(
    resumed_with_large_step: bool, stall: bool
) -> None:
    """vLLM updates its counters when a step ends: a 1,900-token prefill that takes 6 s on a slow
    device looks like 6 s without tokens, then a 2,048-token step. A SIGSTOP looks the same but
    resumes with ordinary decode steps."""
    history = []
    steps = [0.0] * STEP_SLOTS
    for t in range(12):
        if t == 9:
            steps[9 if resumed_with_large_step else 1] += 1  # one step in (1024, 2048] tokens, or ≤ 8
        gen = 100 * min(t, 2) + (100 if t >= 9 else 0)
        history.append(scrape(float(t), gen=gen, running=16, step_counts=steps))
    assert ("silent_stall" in ids(diagnose(prepare(history)))) == stall


@pytest.mark.parametrize(("silent", "stall"), [(11, False), (12, True)])
def test_one_large_step_can_explain_up_to_10_s_without_tokens(silent: int, stall: bool) -> None:
    """A single silence ended by a 2,048-token step (no pattern in the window yet): up to
    ``long_step_max_seconds`` (10 s: ``silent`` scrapes without a token are ``silent - 1`` seconds)
    it is the step; past it, a stall."""
    history = []
    steps = [0.0] * STEP_SLOTS
    for t in range(silent + 6):
        if t == silent + 2:
            steps[9] += 1
        gen = 100 * min(t, 2) + (100 if t >= silent + 2 else 0)
        history.append(scrape(float(t), gen=gen, running=16, step_counts=list(steps)))
    assert ("silent_stall" in ids(diagnose(prepare(history)))) == stall


def test_more_seconds_without_tokens_than_one_step_can_take_is_a_stall_even_if_a_large_step_ends_it() -> None:
    """A 12 s SIGSTOP, then queued long prompts prefilled as the engine resumes: still a stall."""
    history = []
    steps = [0.0] * STEP_SLOTS
    for t in range(18):
        if t == 15:
            steps[9] += 1
        gen = 100 * min(t, 2) + (100 if t >= 15 else 0)
        history.append(scrape(float(t), gen=gen, running=16, step_counts=steps))
    assert "silent_stall" in ids(diagnose(prepare(history)))


def _long_steps(silences: list[int], trailing: int = 0, tokens: list[int] | None = None) -> list:  # type: ignore[type-arg]
    """16 running; each silence (seconds) ends in one step of (1024, 2048] tokens with 1,800 prompt
    tokens computed (or ``tokens[i]``), then 3 s of decode; then ``trailing`` more scrapes without a
    token."""
    history, steps, t, gen, prompt = [], [0.0] * STEP_SLOTS, 0, 0, 0
    for i, silence in enumerate(silences):
        for _ in range(3):
            history.append(scrape(float(t), gen=gen, running=16, step_counts=list(steps), prompt=prompt))
            t, gen = t + 1, gen + 100
        for _ in range(silence):
            history.append(scrape(float(t), gen=gen, running=16, step_counts=list(steps), prompt=prompt))
            t += 1
        steps[9] += 1
        prompt += tokens[i] if tokens is not None else 1800
        gen += 16
    for i in range(trailing + 1):
        history.append(scrape(float(t + i), gen=gen, running=16, step_counts=list(steps), prompt=prompt))
    return history


@pytest.mark.parametrize(("silences", "stalls"), [
    ([16, 16, 18], []),  # every 1,800-token prefill takes 16-18 s: the device, not a hang
    ([16, 17, 48], [48]),  # one of them three times slower per token: that one hung
    ([16, 16, 30], []),  # under twice the median seconds per token: still the device
    ([16, 16], [16, 16]),  # two are not yet a pattern: over 10 s each is a stall
    ([16], [16]),
])
def test_long_silences_ended_by_large_steps_are_prefills_only_when_the_device_repeats_them(
    silences: list[int], stalls: list[int]
) -> None:
    """A busy CPU took 16-20 s for each 2 x 1,800-token prefill of the head-of-line test: more than
    the 10 s any one step is allowed, but the same seconds per token every time. A hang is a one-off."""
    found = [f for f in diagnose(prepare(_long_steps(silences))) if f.id == "silent_stall"]
    # A silence of N scrapes is N - 1 seconds without tokens (from the first scrape that read none).
    assert sorted(round(f.evidence["seconds_without_tokens"]) for f in found) == [s - 1 for s in stalls]


def test_a_long_silence_is_judged_per_prefilled_token_not_in_seconds() -> None:
    """Two 1,800-token prefills silence tokens 15 s each; a third of 4,600 tokens takes 39 s: the same
    seconds per token (2.6 x the seconds, 2.6 x the tokens), so the device, not a hang. The same 39 s
    for 1,800 tokens is a stall."""
    same_rate = _long_steps([16, 16, 40], tokens=[1800, 1800, 4600])
    assert "silent_stall" not in ids(diagnose(prepare(same_rate)))
    assert "silent_stall" in ids(diagnose(prepare(_long_steps([16, 16, 40]))))


@pytest.mark.parametrize(("trailing", "stall"), [(30, False), (33, False), (36, True)])
def test_a_silence_the_window_ends_inside_is_a_stall_only_past_twice_the_windows_longest_prefill(
    trailing: int, stall: bool
) -> None:
    """Attached while a long prefill runs on a host whose prefills silence tokens for up to 17 s:
    30 s without a token so far is watched, not called a critical stall; 36 s (past 2 x 17) is one."""
    findings = diagnose(prepare(_long_steps([16, 16, 18], trailing)))
    assert ("silent_stall" in ids(findings)) == stall
    if not stall:
        watching = next(f for f in findings if f.id == "tokens_stopped")
        assert watching.evidence["seconds_without_tokens"] == trailing
        assert "up to 17 s; a stall is called past 34 s" in watching.title, watching.title


def _stretched(scrapes: list, factor: float, start: float = float("-inf"), end: float = float("inf")) -> list:  # type: ignore[type-arg]
    """The scrapes with the time between ``start`` and ``end`` made ``factor`` times longer."""
    def at(ts: float) -> float:
        if ts <= start:
            return ts
        return max(start, scrapes[0].ts) + factor * (min(ts, end) - max(start, scrapes[0].ts)) + max(0.0, ts - end)
    return [replace(s, ts=at(s.ts)) for s in scrapes]


def test_a_real_head_of_line_recording_from_a_busy_host_is_head_of_line() -> None:
    """The integration test's workload (16 streaming decoders, 2 x 1,800-token prompts) on a host with
    one core kept busy: most intervals decode at a 350 ms median, one ran at 17 ms with 6,512 gaps
    (more than all the others together), and the intervals holding a 3,600-token prefill reach a p99
    of 2.4-5 s. Judged against the median over every observation (21 ms), every interval was a spike
    and the prefills did not stand out: the window was said to hold nothing but its given-up
    decoders."""
    recording = read_recording(FIXTURES / "recording-hol-busy-host-0.32.0.jsonl.gz")
    findings = diagnose(prepare(list(recording.scrapes()), info=recording.info()))
    hol = [f for f in findings if f.id == "head_of_line_blocking"]
    assert hol and [(s.flag, s.direction) for s in hol[0].suggestions] == [("--max-num-batched-tokens", "decrease")]
    assert hol[0].evidence["itl_worst_interval_p99_seconds"] > 2.0
    assert "slow_decode" not in ids(findings)
    # The median the title calls flat is the gap decoders usually saw: the median of the scrape
    # intervals' ITL medians (computed here from the recording), not the one fast interval's 21 ms
    # that the median over every observation lands on.
    ok = [s for s in recording.scrapes() if s.snapshot is not None]
    medians = [histogram_quantile(0.5, h) for a, b in zip(ok, ok[1:])
               if (h := histogram_delta([a, b], "inter_token_latency_seconds")) is not None and h.count > 0]
    usual = statistics.median(m for m in medians if m is not None)
    overall = histogram_quantile(0.5, histogram_delta(ok, "inter_token_latency_seconds"))
    assert overall is not None and overall < 0.03 < 0.3 < usual
    median_ms = float(re.search(r"median (\d+) ms stays flat", hol[0].title).group(1))  # type: ignore[union-attr]
    assert median_ms == round(usual * 1000), hol[0].title
    assert hol[0].evidence["itl_usual_p50_seconds"] == pytest.approx(usual)
    assert f"stretched decode gaps from {usual * 1000:.0f} to" in hol[0].suggestions[0].why


def test_the_real_head_of_line_recording_on_a_device_four_times_slower_is_still_head_of_line() -> None:
    """hol_long_prefills (each 1,900-token prefill silences the decoders 4-4.5 s) with time running
    four times slower: silences of 16-18 s, as on the busy rehearsal host. Then one of them made a
    40 s hang: that one is a stall."""
    recording = read_recording(FIXTURES / "incidents" / "hol_long_prefills.jsonl.gz")
    scrapes = list(recording.scrapes())
    slow = _stretched(scrapes, 4.0)
    findings = diagnose(prepare(slow, info=recording.info()))
    assert ids(findings)[0] == "head_of_line_blocking" and "silent_stall" not in ids(findings)
    ctx = prepare(scrapes, info=recording.info())
    silent = [iv for iv in ctx.intervals if iv.generation_tokens == 0 and (iv.num_requests_running or 0) > 0]
    hang_start, hang_end = silent[len(silent) // 2].start, silent[len(silent) // 2].end
    hung = _stretched(_stretched(scrapes, 10.0, hang_start, hang_end), 4.0)
    stalls = [f for f in diagnose(prepare(hung, info=recording.info())) if f.id == "silent_stall"]
    assert len(stalls) == 1 and stalls[0].evidence["seconds_without_tokens"] > 30


def _ttft_history(ttft_bucket: int, queue_s: float, prefill_s: float, usage: float) -> list:  # type: ignore[type-arg]
    """10 s of 20 requests a second whose TTFT falls in bucket ``ttft_bucket`` of (0.1, 1.0, +Inf),
    with mean queue and prefill times as given; 8 running (the cap), 4 waiting; 400-token prompts;
    50 engine steps a second of 8 tokens (one per running request)."""
    history = []
    for t in range(10):
        counts = [0.0, 0.0, 0.0]
        counts[ttft_bucket] = 20.0 * t
        history.append(scrape(float(t), gen=100 * t, running=8, waiting=4, usage=usage, ttft_counts=counts,
                              queue_seconds=(queue_s * 20 * t, 20 * t), prefill_seconds=(prefill_s * 20 * t, 20 * t),
                              step_counts=[0.0, 50.0 * t] + [0.0] * 12, step_sum=8.0 * 50 * t,
                              lengths=(400.0 * 20 * t, 8.0 * 20 * t, 20.0 * t)))
    return history


@pytest.mark.parametrize(("ttft_bucket", "queue_s", "prefill_s", "usage", "budget", "expected", "advice"), [
    # p95 = 0.1 + 0.9 × 0.95 = 0.955 s > 500 ms; queue 0.6 s ≥ prefill 0.2 s; KV 30 %: the cap queues.
    (1, 0.6, 0.2, 0.3, None, "ttft_queue_dominated", ("--max-num-seqs", "increase")),  # 8 running + 4 waiting
    # The same queue with the KV cache 90 % full: more KV room, not more sequences.
    (1, 0.6, 0.2, 0.9, None, "ttft_queue_dominated", ("--gpu-memory-utilization", "increase")),
    # Prefill 0.7 s > queue 0.1 s, 400-token prompts over a known 256-token budget: split by it, so a
    # larger budget.
    (1, 0.1, 0.7, 0.3, 256, "ttft_prefill_dominated", ("--max-num-batched-tokens", "increase")),
    # The same prefill with the prompts within a known 2,048-token budget: the budget is ruled out; the
    # prompts (one bucket up to 1,000 tokens, p95 read as 950) are long ones computed whole: no flag.
    (1, 0.1, 0.7, 0.3, 2048, "ttft_prefill_dominated", None),
    # Every TTFT ≤ 100 ms: p95 is "< 100 ms", within any budget of 500 ms.
    (0, 0.6, 0.2, 0.3, None, None, None),
])
def test_ttft_over_budget_is_split_by_where_the_time_went(
    ttft_bucket: int, queue_s: float, prefill_s: float, usage: float, budget: int | None, expected: str | None,
    advice: tuple[str, str] | None,
) -> None:
    findings = [f for f in diagnose(prepare(_ttft_history(ttft_bucket, queue_s, prefill_s, usage),
                                            budgets=Budgets(ttft_ms=500), max_num_batched_tokens=budget))
                if f.id.startswith("ttft")]
    assert [f.id for f in findings] == ([expected] if expected else [])
    if advice:
        s = findings[0].suggestions[0]
        assert (s.flag, s.direction) == advice
        if s.flag == "--max-num-seqs":
            assert s.value == 12
        if s.flag == "--max-num-batched-tokens":
            assert s.value is not None and s.value >= 400 + 8  # a whole 400-token prompt and 8 running decodes
        if s.flag == "--gpu-memory-utilization":
            assert s.value == 0.95
    elif expected:
        assert findings[0].suggestions == () and findings[0].title.endswith("long prompts computed whole")
        assert any(c.startswith("Not prompts split over several steps") and "within the 2,048-token budget" in c
                   for c in findings[0].checks)


def test_a_ttft_p95_in_the_first_bucket_is_not_over_a_budget_below_that_bucket() -> None:
    """All TTFTs ≤ 100 ms and a 50 ms budget: interpolation would say 95 ms, but the bucket only
    says "< 100 ms", so the rule cannot claim the budget is missed."""
    findings = diagnose(prepare(_ttft_history(0, 0.6, 0.2, 0.3), budgets=Budgets(ttft_ms=50)))
    assert not [f for f in findings if f.id.startswith("ttft")]


def test_an_itl_p95_in_the_first_bucket_is_not_over_a_budget_below_that_bucket() -> None:
    """Every gap ≤ 10 ms (vLLM's first ITL bucket) and a 5 ms budget: interpolation would say
    9.5 ms > 5 ms, but the bucket only says "< 10 ms"; the evidence carries the bound."""
    history = [scrape(float(t), gen=100 * t, running=8, itl_counts=[50 * t] + [0] * 13, itl_sum=0.0) for t in range(10)]
    findings = diagnose(prepare(history, budgets=Budgets(itl_ms=5)))
    assert "slow_decode" not in ids(findings)
    unset = next(f for f in diagnose(prepare(history)) if f.id == "itl_budget_unset")
    assert (unset.evidence["itl_p95_seconds"], unset.evidence["itl_p95_bound"]) == (0.01, "<")
    assert "< 10 ms" in unset.title


TIMEOUT = ErrorKind.TIMEOUT


def test_a_scrape_that_timed_out_once_is_a_slow_server_not_an_outage() -> None:
    history = steady(5) + [down(5.0, TIMEOUT)] + [scrape(float(t), gen=100 * t) for t in range(6, 10)] \
        + [down(10.0, TIMEOUT), down(11.0, TIMEOUT)] + [scrape(float(t), gen=100 * t) for t in range(12, 15)]
    findings = diagnose(prepare(history))
    assert "server_down" not in [f.id for f in findings]
    slow = [f for f in findings if f.id == "scrapes_slow"]
    assert len(slow) == 1 and slow[0].severity == "warning"  # three late answers: a frontend falling behind
    assert slow[0].evidence["failed_scrapes"] == 3 and slow[0].evidence["episodes"] == 2
    once = steady(5) + [down(5.0, TIMEOUT)] + [scrape(float(t), gen=100 * t) for t in range(6, 10)]
    assert [(f.id, f.severity) for f in diagnose(prepare(once)) if f.id == "scrapes_slow"] == [("scrapes_slow", "info")]
    twice = once + [down(10.0, TIMEOUT)] + [scrape(11.0, gen=1100)]
    assert [f.severity for f in diagnose(prepare(twice)) if f.id == "scrapes_slow"] == ["info"]  # 2 < 3
    assert slow[0].time_range == (5.0, 11.0)


def test_timeouts_that_last_or_are_still_going_are_an_outage() -> None:
    long_run = steady(5) + [down(float(t), TIMEOUT) for t in range(5, 11)] + [scrape(11.0, gen=1100)]
    ongoing = steady(5) + [down(5.0, TIMEOUT)]
    refused = steady(5) + [down(5.0)] + [scrape(6.0, gen=600)]  # refused, not slow: the process went away
    mixed = steady(5) + [down(5.0, TIMEOUT), down(6.0)] + [scrape(7.0, gen=700)]
    for history in (long_run, ongoing, refused, mixed):
        ids = [f.id for f in diagnose(prepare(history))]
        assert "server_down" in ids and "scrapes_slow" not in ids, ids


@pytest.mark.parametrize(("kind", "message", "expect"), [
    (ErrorKind.TIMEOUT, "late", "scrapes_slow"),  # a timeout in any words is a late answer
    (ErrorKind.UNREACHABLE, "/metrics did not answer within 2 s", "Server unreachable"),  # the words do not count
    (ErrorKind.ENGINE_UNAVAILABLE, "gone", "Engine dead"),
    (ErrorKind.HTTP_STATUS, "/metrics answered HTTP 503 Service Unavailable", "Server unreachable"),
    (ErrorKind.NOT_VLLM, "Server unreachable", "Answers, but not as a vLLM server"),
    (ErrorKind.BAD_PAYLOAD, "Server unreachable", "/metrics answers what cannot be read"),
])
def test_the_outage_rule_reads_the_error_kind_never_the_message(kind: ErrorKind, message: str, expect: str) -> None:
    history = steady(5) + [down(5.0, kind, message)] + [scrape(6.0, gen=600)]
    found = [f for f in diagnose(prepare(history)) if f.id in ("server_down", "scrapes_slow")]
    assert len(found) == 1 and (found[0].id == expect or expect in found[0].title), found
    assert found[0].id == "scrapes_slow" or found[0].evidence["errors"] == [message]  # the words are kept for people


def test_timeouts_among_answers_that_are_not_vllm_still_say_not_vllm() -> None:
    """A busy host let one scrape of a login page time out between two answers of HTML: the
    episode is still a port that answers, but not as vLLM (CI's rehearsal called it unreachable)."""
    for kind, said in ((ErrorKind.NOT_VLLM, "Answers, but not as a vLLM server"),
                       (ErrorKind.BAD_PAYLOAD, "/metrics answers what cannot be read")):
        history = steady(5) + [down(5.0, kind), down(6.0, TIMEOUT), down(7.0, kind)]
        found = [f for f in diagnose(prepare(history)) if f.id == "server_down"]
        assert len(found) == 1 and found[0].title.startswith(said + " since"), found
    gone = steady(5) + [down(5.0, TIMEOUT), down(6.0, TIMEOUT)]  # only timeouts, still going: an outage
    left = steady(5) + [down(5.0, ErrorKind.NOT_VLLM), down(6.0)]  # the page answered, then nothing did
    assert [f.title for f in diagnose(prepare(left)) if f.id == "server_down"][0].startswith("Server unreachable")
    assert [f.title for f in diagnose(prepare(gone)) if f.id == "server_down"][0].startswith("Server unreachable")


_LAB = 'engine="0",model_name="m"'


def _queue_payload(t: float, *, running: float = 4, deferred: float = 0, capacity: float = 0, usage: float = 0.1,
                   rejected: float = 0, lora: tuple[str, str] | None = None, max_lora: int = 1,
                   extra: str = "") -> Scrape:
    lab = _LAB
    text = (f"vllm:generation_tokens_total{{{lab}}} {100 * t}\n"
            f"vllm:num_requests_running{{{lab}}} {running}\n"
            f"vllm:num_requests_waiting{{{lab}}} {deferred + capacity}\n"
            f'vllm:num_requests_waiting_by_reason{{{lab},reason="capacity"}} {capacity}\n'
            f'vllm:num_requests_waiting_by_reason{{{lab},reason="deferred"}} {deferred}\n'
            f"vllm:kv_cache_usage_perc{{{lab}}} {usage}\n"
            f'vllm:admission_rejections_total{{model_name="m",reason="max_num_queued_reqs"}} {rejected}\n')
    if lora is not None:
        # An older label set stays exported with an older time: the newest one is current.
        text += ('vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 5.0\n'
                 f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{lora[0]}",'
                 f'waiting_lora_adapters="{lora[1]}"}} {1000 + t}\n')
    return Scrape(t, parse_snapshot(text + extra))


def test_requests_deferred_for_lora_slots_say_raise_max_loras() -> None:
    history = [_queue_payload(float(t), deferred=5 if 2 <= t <= 7 else 0, lora=("a", "b,c")) for t in range(10)]
    found = [f for f in diagnose(prepare(history)) if f.id == "waiting_deferred"]
    assert len(found) == 1 and found[0].time_range == (2.0, 7.0)
    # Adapters a (running), b and c (waiting) named while one fits: three slots.
    assert [(s.flag, s.direction, s.value) for s in found[0].suggestions] == [("--max-loras", "increase", 3)]
    assert found[0].evidence["adapters_waiting"] == ["b", "c"] and found[0].evidence["max_lora"] == 1
    assert "queue_at_cap" not in [f.id for f in diagnose(prepare(history))]  # nobody waited for capacity


def test_deferred_without_lora_points_at_kv_transfer_and_short_deferral_is_quiet() -> None:
    history = [_queue_payload(float(t), deferred=3 if 2 <= t <= 7 else 0) for t in range(10)]
    found = [f for f in diagnose(prepare(history)) if f.id == "waiting_deferred"]
    assert len(found) == 1 and found[0].suggestions == () and "KV connector" in found[0].checks[0]
    brief = [_queue_payload(float(t), deferred=3 if 2 <= t <= 3 else 0) for t in range(10)]
    assert "waiting_deferred" not in [f.id for f in diagnose(prepare(brief))]


def test_deferral_that_comes_and_goes_counts_its_episodes_together() -> None:
    """Adapters take turns in the slots, so the gauge reads "deferred" a second at a time with gaps
    longer than the merge (2 s): three 1 s episodes are 3 s deferred, two are not enough."""
    def flicker(on: set[int]) -> list[Scrape]:
        return [_queue_payload(float(t), deferred=2 if t in on else 0, lora=("a", "b")) for t in range(20)]

    found = [f for f in diagnose(prepare(flicker({2, 3, 7, 8, 12, 13}))) if f.id == "waiting_deferred"]
    assert len(found) == 1 and found[0].evidence["seconds_deferred"] == 3.0
    assert found[0].time_range == (2.0, 13.0)
    assert [(s.flag, s.direction) for s in found[0].suggestions] == [("--max-loras", "increase")]
    assert "waiting_deferred" not in ids(diagnose(prepare(flicker({2, 3, 7, 8}))))
    # Two seconds apart or less is one episode, its gap counted (4 s); three apart are two (2 s).
    merged = [f for f in diagnose(prepare(flicker({2, 3, 5, 6}))) if f.id == "waiting_deferred"]
    assert len(merged) == 1 and merged[0].evidence["seconds_deferred"] == 4.0
    assert "waiting_deferred" not in ids(diagnose(prepare(flicker({2, 3, 6, 7}))))


def test_deferral_under_3_s_in_all_is_quiet_at_any_scrape_rate() -> None:
    """Scrapes every 0.5 s: 2.5 s deferred is under the 3 s a finding needs; 3 s is one."""
    def deferred(until: float) -> list[Scrape]:
        return [_queue_payload(t / 2, deferred=2 if 2.0 <= t / 2 <= until else 0, lora=("a", "b"))
                for t in range(24)]

    assert "waiting_deferred" not in ids(diagnose(prepare(deferred(4.5))))
    assert "waiting_deferred" in ids(diagnose(prepare(deferred(5.0))))


@pytest.mark.parametrize(("max_lora", "before", "value"), [
    (2, "", 3),  # a and b named, two slots: one more slot than the server has
    (1, "x,y,z", 2),  # adapters that ran before any deferral do not size the slots
])
def test_the_max_loras_value_is_one_more_slot_or_the_adapters_named_while_deferred(
    max_lora: int, before: str, value: int
) -> None:
    history = [_queue_payload(float(t), deferred=2 if 4 <= t <= 9 else 0, max_lora=max_lora,
                              lora=("a", "b") if 4 <= t <= 9 else (before, "")) for t in range(12)]
    found = [f for f in diagnose(prepare(history)) if f.id == "waiting_deferred"]
    assert [(s.flag, s.value) for s in found[0].suggestions] == [("--max-loras", value)]


def test_a_real_flickering_lora_deferral_is_named() -> None:
    """A real vLLM 0.32 server under --max-loras 1, 8 closed-loop clients alternating adapters a and b
    (the integration test's workload, recorded on a busy host): the gauge read "deferred" in 19 of 48
    scrapes, never for 3 s on end (0.5-1.3 s at a time, 2-3 s apart). It was silent before."""
    recording = read_recording(FIXTURES / "recording-lora-deferred-flicker-0.32.0.jsonl.gz")
    scrapes = list(recording.scrapes())
    shown = [s.ts for s in scrapes if s.snapshot is not None
             and (s.snapshot.by_label("num_requests_waiting_by_reason") or {}).get("deferred", 0) > 0]
    assert len(shown) == 19
    findings = diagnose(prepare(scrapes, info=recording.info()))
    found = [f for f in findings if f.id == "waiting_deferred"]
    assert len(found) == 1 and found[0].time_range == (shown[0], shown[-1])
    assert found[0].evidence["max_lora"] == 1
    assert [(s.flag, s.direction, s.value) for s in found[0].suggestions] == [("--max-loras", "increase", 2)]
    assert not any(s.flag == "--max-num-seqs" for f in findings for s in f.suggestions)


@pytest.mark.parametrize(("running", "usage", "flag"), [
    (4, 0.10, "--max-num-seqs"),  # at the cap with memory to spare: the batch
    (4, 0.97, "--gpu-memory-utilization"),  # the KV cache full: more KV capacity, never a larger batch
    (2, 0.10, "--max-num-queued-reqs"),  # neither: the limit itself
])
def test_admission_rejections_name_the_limit_and_what_would_serve_them(running: float, usage: float, flag: str) -> None:
    history = [_queue_payload(float(t), running=running, capacity=2, usage=usage, rejected=0 if t < 3 else 10)
               for t in range(8)]
    findings = diagnose(prepare(history, max_num_seqs=4))
    found = [f for f in findings if f.id == "admission_rejected"]
    assert len(found) == 1 and found[0].evidence["admission_rejections"] == {"max_num_queued_reqs": 10.0}
    assert found[0].time_range == (2.0, 3.0) and "--max-num-queued-reqs" in found[0].title
    assert found[0].suggestions[0].flag == flag and found[0].suggestions[0].direction == "increase"
    if flag != "--max-num-seqs":
        assert "--max-num-seqs" not in [s.flag for s in found[0].suggestions]


def _times(t: float, queued_share: float) -> str:
    """Queue and decode time histograms: two requests finish a second, each after 1 s of decode and
    ``queued_share`` s of queue."""
    count, lines = 2 * t, []
    for name, each in (("request_queue_time_seconds", queued_share), ("request_decode_time_seconds", 1.0)):
        lines += [f'vllm:{name}_bucket{{{_LAB},le="+Inf"}} {count}', f"vllm:{name}_count{{{_LAB}}} {count}",
                  f"vllm:{name}_sum{{{_LAB}}} {count * each}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("queued_share", "flag"), [(0.25, "--max-num-seqs"), (0.15, "--max-num-queued-reqs")])
def test_admission_judges_the_batch_from_queue_time_when_the_running_gauge_reads_low(
    queued_share: float, flag: str
) -> None:
    """The running gauge never shows the cap (2 of 4): requests that queued a quarter of their decode
    waited for a running one to finish, so the batch held them; a sixth of it, barely at all."""
    history = [_queue_payload(float(t), running=2, capacity=2, rejected=0 if t < 3 else 10,
                              extra=_times(float(t), queued_share)) for t in range(8)]
    found = [f for f in diagnose(prepare(history, max_num_seqs=4)) if f.id == "admission_rejected"]
    assert [s.flag for s in found[0].suggestions] == [flag]
    assert found[0].evidence["mean_queue_seconds"] == pytest.approx(queued_share)


def test_admission_on_a_real_burst_whose_running_gauge_read_0_still_names_the_batch() -> None:
    """What a CI run saw on a busy host: vLLM 0.32's running gauge read 0 through a one-second burst.
    The real recording with that gauge blanked in every scrape still says --max-num-seqs (the
    requests queued 0.6-0.9 s behind 0.6-0.9 s decodes), from the queue times."""
    blanked = []
    with gzip.open(FIXTURES / "incidents" / "admission_queued_reqs.jsonl.gz", "rt") as f:
        for line in f:
            record = json.loads(line)
            if record.get("metrics"):
                text = re.sub(r"^(vllm:num_requests_running\{[^}]*\}) \S+$", r"\1 0.0", record["metrics"],
                              flags=re.M)
                blanked.append(Scrape(record["ts"], parse_snapshot(text)))
    assert len(blanked) > 10
    assert all((s.snapshot.value("num_requests_running") or 0) == 0 for s in blanked if s.snapshot)
    for cap in (4, None):  # the cap known from the flags, or only from the gauge that read 0
        found = [f for f in diagnose(prepare(blanked, max_num_seqs=cap)) if f.id == "admission_rejected"]
        assert [(s.flag, s.direction) for s in found[0].suggestions] == [("--max-num-seqs", "increase")]
        assert "queued" in found[0].suggestions[0].why and found[0].evidence["running_at_cap"] is True


def test_no_rejection_no_admission_finding() -> None:
    history = [_queue_payload(float(t), capacity=2) for t in range(8)]
    ids = [f.id for f in diagnose(prepare(history, max_num_seqs=4))]
    assert "admission_rejected" not in ids and "waiting_deferred" not in ids  # waiting for capacity is not deferred


def test_a_kv_cache_pinned_at_a_mebibyte_says_so_not_zero_gib() -> None:
    """heldout/ho_kv_bytes_wide pins the cache at 1,152 KiB (its recipe): the reason said "0.00 GiB"."""
    recording = read_recording(FIXTURES / "incidents" / "heldout" / "ho_kv_bytes_wide.jsonl.gz")
    kv = next(f for f in diagnose(prepare(list(recording.scrapes()))) if f.id == "kv_pressure")
    why = next(s.why for s in kv.suggestions if s.flag == "--kv-cache-memory-bytes")
    assert "pinned at 1.1 MiB by --kv-cache-memory-bytes" in why, why


def test_a_chunk_held_at_its_floor_is_not_said_to_keep_steps_under_the_spike_line() -> None:
    """hol_long_prefills: 1,900-token prompts filled 2,048-token steps of ~5 s. Chunks of 512 (the
    floor) are a quarter of that step, still about a second and far above the ~190 ms spike line:
    the reason says what they still cost and that each stall is split in four, not that they keep a
    step under the line. On the busy-host recording (325 ms usual gaps, 4,096-token steps) an
    eighth of the step does fit under its 975 ms line, and the reason says so."""
    def why(path: Path) -> str:
        recording = read_recording(path)
        hol = next(f for f in diagnose(prepare(list(recording.scrapes()), info=recording.info()))
                   if f.id == "head_of_line_blocking")
        return hol.suggestions[0].why

    long_prefills = why(FIXTURES / "incidents" / "hol_long_prefills.jsonl.gz")
    assert "keep a step under" not in long_prefills and "split each stall into 4" in long_prefills
    still = float(re.search(r"still take about ([\d,]+) ms a step", long_prefills).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 1000 < still < 2000  # a quarter of a ~5 s step
    assert "keep a step under 975 ms" in why(FIXTURES / "recording-hol-busy-host-0.32.0.jsonl.gz")
