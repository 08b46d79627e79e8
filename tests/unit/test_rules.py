"""Table-driven tests of each rule's thresholds on synthetic histories (one behaviour each)."""

from __future__ import annotations

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


def test_queue_uses_the_known_cap_when_given() -> None:
    history = [scrape(float(t), gen=100 * t, running=6, waiting=3, usage=0.2) for t in range(10)]
    assert "queue_at_cap" not in ids(diagnose(prepare(history, max_num_seqs=16)))
    assert "queue_at_cap" in ids(diagnose(prepare(history, max_num_seqs=6)))


@pytest.mark.parametrize(("preempt_per_s", "usage", "waiting", "severity"), [
    (0, 1.0, 5, None), (0.5, 0.97, 0, "warning"), (2, 1.0, 5, "critical"),
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


def test_kv_pressure_does_not_push_utilization_past_the_ceiling() -> None:
    history = [scrape(float(t), gen=100 * t, running=10, usage=1.0, preempt=t) for t in range(10)]
    findings = diagnose(prepare(history, gpu_memory_utilization=0.95))
    f = next(f for f in findings if f.id == "kv_pressure")
    assert "--gpu-memory-utilization" not in [s.flag for s in f.suggestions]


@pytest.mark.parametrize(("stall_seconds", "running", "fires"), [
    (3, 4, False), (6, 4, True), (10, 0, False),
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


def test_an_outage_that_came_and_went_is_reported_with_its_range() -> None:
    history = steady(5, running=1) + [down(5.0), down(6.0), down(7.0)] + [
        scrape(float(t), gen=100 * t, running=1) for t in range(8, 12)]
    f = next(f for f in diagnose(prepare(history)) if f.id == "server_down")
    assert f.severity == "critical" and f.time_range == (5.0, 7.0) and f.evidence["ongoing"] is False
    assert "recovered" in f.title


def test_an_ongoing_outage_is_critical_and_says_so() -> None:
    history = steady(5) + [down(5.0), down(6.0, "engine unhealthy: /health answered HTTP 503")]
    f = next(f for f in diagnose(prepare(history)) if f.id == "server_down")
    assert f.evidence["ongoing"] is True and "Engine dead" in f.title
    assert exit_code(diagnose(prepare(history))) == 2


def _itl(baseline: float, spike: float) -> list[float]:
    """ITL bucket counts: ``baseline`` observations ≤ 10 ms, ``spike`` in (0.3, 0.4]."""
    counts = [0.0] * 14
    counts[0] = baseline
    counts[8] = spike
    return counts


def hol_history(prefill_tokens: float, spikes: int = 3) -> list:  # type: ignore[type-arg]
    history = []
    cum = [0.0] * 14
    prompt = 0.0
    for t in range(20):
        spike = t in (5, 10, 15)[:spikes]
        add = _itl(100, 20 if spike else 0)
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
        assert f.suggestions[0].value == 256
        assert "--max-num-seqs" not in [s.flag for s in f.suggestions]


def test_head_of_line_halves_a_known_budget() -> None:
    f = next(f for f in diagnose(prepare(hol_history(4000), max_num_batched_tokens=8192))
             if f.id == "head_of_line_blocking")
    assert f.suggestions[0].value == 4096


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
    from diagnostics.core.catalog import parse_snapshot
    from diagnostics.core.derive import Scrape

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
