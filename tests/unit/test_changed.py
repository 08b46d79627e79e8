"""unexplained_change: a number that moved by more than the stated factor at the same load, with
no other rule to explain it, is a warning with the numbers; more load, a cause another rule names,
or a change within the factor stays quiet. The real-server proof is the corpus's
``changed_itl_*`` recordings (tests/unit/test_corpus.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from diagnostics.core.diagnosis import Budgets, Finding, Thresholds, diagnose, prepare
from diagnostics.core.diagnosis.rules import changes
from diagnostics.core.diagnosis.rules.changes import parts
from tests.unit.synth import cumulative

FAST = [0.0, 200.0] + [0.0] * 12  # 200 token gaps a second in (10, 25] ms
SLOW = [0.0] * 4 + [200.0] + [0.0] * 9  # 200 gaps a second in (75, 100] ms


def changed_window(seconds: int = 30, slow_from: int = 15, *, running_after: float = 4, prompt_after: float = 100,
            slow: Sequence[float] = SLOW, fast: Sequence[float] = FAST, prompt_before: float = 100,
            gen_after: float = 200) -> list:
    per_second = [{"gen": 200.0 if t < slow_from else gen_after,
                   "prompt": prompt_before if t < slow_from else prompt_after,
                   "itl_counts": list(fast) if t < slow_from else list(slow),
                   "running": 4.0 if t < slow_from else running_after, "usage": 0.2} for t in range(seconds)]
    return cumulative(per_second)


def _changed(findings: list[Finding]) -> Finding | None:
    return next((f for f in findings if f.id == "unexplained_change"), None)


def test_itl_that_quadruples_at_the_same_load_is_a_warning_with_before_after_and_when() -> None:
    finding = _changed(diagnose(prepare(changed_window())))
    assert finding is not None and finding.severity == "warning"
    ev = finding.evidence
    # The early third's p95 is at most its bucket's 25 ms bound, the late third's at least 75 ms.
    assert ev["itl_p95_before"] <= 0.025 and ev["itl_p95_after"] >= 0.075
    assert ev["itl_p95_factor"] >= 3.0
    # The slowdown began at second 15, in the middle third: the first interval that showed it.
    assert 14.0 <= ev["changed_since"] <= 16.0
    assert finding.suggestions == ()  # no flag fixes a slower device
    assert any("throttl" in c.lower() or "clock" in c.lower() for c in finding.checks)
    assert any("co-tenant" in c.lower() for c in finding.checks)
    assert "ITL p95 rose" in finding.title


def test_the_same_rise_with_twice_the_running_requests_is_explained_by_load() -> None:
    assert _changed(diagnose(prepare(changed_window(running_after=8)))) is None


def test_the_same_rise_with_twice_the_prompt_tokens_is_explained_by_load() -> None:
    assert _changed(diagnose(prepare(changed_window(prompt_after=200)))) is None


def test_a_rise_under_the_factor_is_not_a_change() -> None:
    # (25, 50] ms after ≤ 25 ms: at most 2× by the buckets, never certainly over the factor of 2.5.
    modest = [0.0, 0.0, 200.0] + [0.0] * 11
    assert _changed(diagnose(prepare(changed_window(slow=modest), thresholds=Thresholds(change_factor=2.5)))) is None
    assert _changed(diagnose(prepare(changed_window(slow=modest)))) is not None  # 2× with the default 2.0: flagged


def test_a_window_that_is_steady_all_along_is_quiet() -> None:
    assert _changed(diagnose(prepare(changed_window(slow_from=99)))) is None


def test_it_stays_silent_when_another_rule_found_the_cause() -> None:
    """An ITL budget the late part breaks: slow_decode names it, and the change rule does not repeat it."""
    findings = diagnose(prepare(changed_window(), budgets=Budgets(itl_ms=50)))
    assert any(f.id == "slow_decode" for f in findings)
    assert _changed(findings) is None


def test_a_short_window_has_no_parts_to_compare() -> None:
    assert parts(prepare(changed_window(seconds=12, slow_from=6))) is None
    assert _changed(diagnose(prepare(changed_window(seconds=12, slow_from=6)))) is None


def test_the_baseline_is_the_hour_before_the_late_part_when_the_window_holds_it() -> None:
    # Three hours at one scrape a minute: the late part is the last 15 min, the baseline the hour before.
    per_minute = [{"gen": 12000.0, "prompt": 6000.0, "itl_counts": [x * 60 for x in FAST], "running": 4.0}
                  for _ in range(181)]
    history = [s.__class__(s.ts * 60, s.snapshot) for s in cumulative(per_minute)]
    p = parts(prepare(history))
    assert p is not None
    assert p.late_range[1] - p.late_range[0] == 900.0
    assert p.early_range == (p.late_range[0] - 3600.0, p.late_range[0])


def test_the_same_rise_with_prompts_twice_as_long_is_explained_by_the_prompts() -> None:
    """Half the requests with prompts twice as long: the prompt tokens per second stay the same, the
    requests started per second halve, and the longer prompts explain a slower answer."""
    per_second = [{"gen": 200.0, "prompt": 100.0, "itl_counts": FAST if t < 15 else SLOW, "running": 4.0,
                   "ttft_counts": [2.0, 0.0, 0.0] if t < 15 else [1.0, 0.0, 0.0]} for t in range(30)]
    assert _changed(diagnose(prepare(cumulative(per_second)))) is None
    same = [{**second, "ttft_counts": [2.0, 0.0, 0.0]} for second in per_second]
    assert _changed(diagnose(prepare(cumulative(same)))) is not None


def test_a_tail_that_rises_while_p95_holds_is_a_change_on_enough_gaps() -> None:
    """A co-tenant that stalls the engine now and then: 3 % of the gaps go from ≤ 25 ms to (0.3, 0.4] s,
    p95 stays in its bucket, p99 moves; judged only with 500 gaps or more in each part."""
    tail = [0.0, 194.0] + [0.0] * 6 + [6.0] + [0.0] * 5
    finding = _changed(diagnose(prepare(changed_window(slow=tail))))
    assert finding is not None and "ITL p99 rose" in finding.title and "itl_p95_before" not in finding.evidence
    assert finding.evidence["itl_p99_after"] >= 0.3
    few = Thresholds(change_min_itl_tail_observations=5000)  # 10 s × 200 gaps: under it, no p99 judged
    assert _changed(diagnose(prepare(changed_window(slow=tail), thresholds=few))) is None



# -- the sceptic's surviving mutations ------------------------------------------------------------


def test_a_rise_inside_one_bucket_is_not_certain_however_it_interpolates() -> None:
    """ITL in one bucket, (10, 25] ms, before and after: 189 of 200 gaps a second <= 10 ms and 11 in
    the bucket early (p95 interpolates to 11.4 ms), 5 and 195 late (24.2 ms). 2.1x as interpolated,
    yet the buckets cannot say the late p95 is higher at all: no change. Moved to (25, 50] it is."""
    early = [189.0, 11.0] + [0.0] * 12
    inside = [5.0, 195.0] + [0.0] * 12
    assert _changed(diagnose(prepare(changed_window(slow=inside, fast=early)))) is None
    higher = [5.0, 0.0, 195.0] + [0.0] * 11
    assert _changed(diagnose(prepare(changed_window(slow=higher, fast=early)))) is not None


def test_prompt_tokens_that_start_from_none_are_more_load() -> None:
    """No prompt tokens at all in the early part, 100 a second in the late one: the load rose (from
    nothing counts), so the slower ITL is explained by it."""
    assert _changed(diagnose(prepare(changed_window(prompt_before=0)))) is None


def test_tokens_per_second_per_running_request_that_falls_fourfold_is_a_change() -> None:
    """ITL in its bucket all along, 4 running all along, 200 tokens a second until second 15 and 50
    after: 200 / 4 = 50 tokens/s per running request before, 50 / 4 = 12.5 after, a 4x fall; it first
    shows in the interval 14-15 (the first at or under 50 / 2 = 25)."""
    fewer = [0.0, 50.0] + [0.0] * 12  # the same ITL bucket, as many gaps as tokens
    finding = _changed(diagnose(prepare(changed_window(slow=fewer, gen_after=50))))
    assert finding is not None and "itl_p95_before" not in finding.evidence
    ev = finding.evidence
    assert (ev["tokens_per_second_per_running_request_before"], ev["tokens_per_second_per_running_request_after"],
            ev["tokens_per_second_per_running_request_factor"]) == (50.0, 12.5, 4.0)
    assert ev["changed_since"] == 14.0
    assert finding.title.startswith("Tokens/s per running request fell 4.0× (50.0 → 12.5)")
    # Half as many tokens (100 a second, 25 per request) is a 2x fall: at the factor, a change; 120 is not.
    assert _changed(diagnose(prepare(changed_window(slow=fewer, gen_after=100)))) is not None
    assert _changed(diagnose(prepare(changed_window(slow=fewer, gen_after=120)))) is None


def test_a_window_with_a_stall_has_no_unexplained_change() -> None:
    """Called alone (diagnose runs it only when no other rule spoke, and the stall rule would): 4
    running and no token from second 22 to 28 in the late part, the ITL rise as before. The stall
    explains the numbers; the change rule says nothing."""
    per_second = [{"gen": 0.0 if 22 <= t <= 28 else 200.0, "prompt": 100.0,
                   "itl_counts": [0.0] * 14 if 22 <= t <= 28 else (FAST if t < 15 else SLOW),
                   "running": 4.0, "usage": 0.2} for t in range(30)]
    ctx = prepare(cumulative(per_second))
    assert ctx.stalls and parts(ctx) is not None
    assert changes.unexplained_change(ctx) == []
    moving = prepare(changed_window())
    assert not moving.stalls and changes.unexplained_change(moving) != []


@pytest.mark.parametrize(("gaps", "expected"), [(5.0, False), (20.0, True)],
                         ids=["50 late gaps", "200 late gaps"])
def test_the_late_part_needs_its_own_minimum_of_token_gaps(gaps: float, expected: bool) -> None:
    """The late third (10 s) with 5 slow gaps a second is 50, under the 100 asked; with 20, 200."""
    few = [0.0] * 4 + [gaps] + [0.0] * 9
    assert (_changed(diagnose(prepare(changed_window(slow=few)))) is not None) is expected


# -- the cause of a change (issue 41) --------------------------------------------------------------------


def missed_window(hits_after: float) -> list:
    """ITL up fourfold from second 15 at the same 100 prompt tokens and 2 requests a second; the prefix
    cache served 90 of the 100 prompt tokens each second before, ``hits_after`` after."""
    window = [{"gen": 200.0, "prompt": 100.0, "queries": 100.0, "hits": 90.0 if t < 15 else hits_after,
               "itl_counts": list(FAST) if t < 15 else list(SLOW), "ttft_counts": [2, 0, 0],
               "running": 4.0, "usage": 0.2} for t in range(30)]
    return cumulative(window)


def test_a_change_when_the_prefix_cache_stopped_hitting_names_that_cause_and_leads() -> None:
    findings = diagnose(prepare(missed_window(hits_after=0.0)))
    first = next(f for f in findings if f.severity != "info")
    assert first.id == "latency_changed" and first.evidence["cause"] == "prefix_cache_misses"
    # 90 % → 0 %; computed per request (100 − 90) / 2 = 5 → 100 / 2 = 50 tokens.
    assert "from 90 % to 0 %" in first.title and "5 → 50 tokens computed" in first.title
    fits = {r["cause"]: r["fit"] for r in first.evidence["causes"]}
    assert fits == {"more_load": "ruled_out", "prefix_cache_misses": "fits", "preemption": "ruled_out",
                    "queueing": "unknown"}
    assert first.suggestions == () and first.knobs == ()
    assert "unexplained_change" not in [f.id for f in findings]


def test_a_change_with_the_hits_held_is_unexplained_and_says_the_cache_is_ruled_out() -> None:
    findings = diagnose(prepare(missed_window(hits_after=90.0)))
    assert "latency_changed" not in [f.id for f in findings]
    found = _changed(findings)
    assert found is not None and found.evidence["cause"] is None
    assert any(c.startswith("Not prefix-cache misses: the prefix-cache hit rate went 90 % → 90 %") for c in found.checks)


def test_a_hit_rate_that_halves_is_the_cause_and_one_short_of_half_is_not() -> None:
    """90 → 45 hit tokens of 100 a second: the rate halves (the fall's edge), computed tokens go 5 → 27.5
    a request; 90 → 50 is short of half and is ruled out."""
    first = next(f for f in diagnose(prepare(missed_window(hits_after=45.0))) if f.severity != "info")
    assert first.id == "latency_changed" and first.evidence["cause"] == "prefix_cache_misses"
    found = _changed(diagnose(prepare(missed_window(hits_after=50.0))))
    assert found is not None and found.evidence["cause"] is None


def _missed_from(hits_before: float, hits_after: float, preempt: float = 0.0) -> list:
    window = [{"gen": 200.0, "prompt": 100.0, "queries": 100.0, "hits": hits_before if t < 15 else hits_after,
               "itl_counts": list(FAST) if t < 15 else list(SLOW), "ttft_counts": [2, 0, 0], "preempt": preempt,
               "running": 4.0, "usage": 0.2} for t in range(30)]
    return cumulative(window)


@pytest.mark.parametrize(("after", "fit"), [(10.0, "fits"), (15.0, "ruled_out")])
def test_the_prompt_tokens_computed_must_rise_one_and_a_half_times(after: float, fit: str) -> None:
    """40 → 10 hit tokens of 100: computed (100 − 40) / 2 = 30 → 45 a request, 1.5×; 40 → 15: 42.5, 1.42×.
    The hit rate falls under half in both: the computed tokens decide."""
    findings = diagnose(prepare(_missed_from(40.0, after)))
    found = next(f for f in findings if f.id in ("latency_changed", "unexplained_change"))
    assert {r["cause"]: r["fit"] for r in found.evidence["causes"]}["prefix_cache_misses"] == fit


def test_preemptions_as_many_before_as_after_are_not_the_cause_of_a_change() -> None:
    """One preemption a second through the whole window: the late part has no more than the early one.
    (The KV-pressure finding reports them, so the change rule itself stays quiet: its differential is
    read directly.)"""
    ctx = prepare(_missed_from(90.0, 90.0, preempt=1.0))
    moved = changes.moved(ctx)
    assert moved is not None
    ruling = changes.change_differential(ctx, moved).ruling("preemption")
    late, early = len(moved.parts.late), len(moved.parts.early)  # one preemption in each 1 s interval
    assert ruling.fit == "ruled_out" and ruling.because.startswith(f"{late} preemptions in the late part ({early} before)")


def _co_tenant(running_before: float, factor: float = 3.0) -> list:  # type: ignore[type-arg]
    """30 s at one request started a second and 100 prompt tokens a second throughout; ITL in (10, 25] ms
    for 15 s, then in (50, 75] ms, and the running count ``factor`` times ``running_before`` after."""
    return cumulative([{"gen": 200.0, "prompt": 100.0, "ttft_counts": [1.0, 0.0, 0.0],
                        "itl_counts": list(FAST) if t < 15 else list(SLOW),
                        "running": running_before if t < 15 else factor * running_before, "usage": 0.2}
                       for t in range(30)])


@pytest.mark.parametrize(("before", "changed"), [(0.5, True), (0.9, True), (1.1, False)])
def test_more_running_at_the_same_request_rate_is_slowness_only_from_an_engine_idle_before(
        before: float, changed: bool) -> None:
    """The running count tripled at one request a second: from under one on average before (the engine idle
    part of the time, so more clients would have raised the rate) it is each request staying longer, and
    the ITL rise is a change; from 1.1 it may be more clients on a busy engine, so it stays more load."""
    finding = _changed(diagnose(prepare(_co_tenant(before))))
    assert (finding is not None) is changed
    if finding is not None:
        more = next(r for r in finding.evidence["causes"] if r["cause"] == "more_load")
        assert more["fit"] == "ruled_out" and "each request stayed longer" in more["because"]


def test_p99_is_judged_only_where_p95_did_not_move() -> None:
    """The default window's ITL p95 rose 3× (and its p99 with it): the finding says p95, once; the tail is
    read only when p95 held (test_a_tail_that_rises_while_p95_holds_is_a_change_on_enough_gaps)."""
    finding = _changed(diagnose(prepare(changed_window())))
    assert finding is not None and "ITL p95 rose" in finding.title and "ITL p99" not in finding.title
    assert "itl_p99_before" not in finding.evidence


def test_a_rate_per_running_request_is_not_judged_when_the_gauges_are_blind() -> None:
    """Tokens a second fell fourfold at 4 running (test_tokens_per_second_per_running_request_that_falls…),
    but with the running gauge reading 0 at every scrape while tokens flowed (gauges blind), no per-request
    rate can be formed, so that change is not claimed from it."""
    fewer = [0.0, 50.0] + [0.0] * 12
    blind = [{**s, "running": 0.0} for s in [
        {"gen": 200.0 if t < 15 else 50.0, "prompt": 100.0, "itl_counts": list(FAST) if t < 15 else fewer,
         "running": 4.0, "usage": 0.2} for t in range(30)]]
    assert _changed(diagnose(prepare(cumulative(blind)))) is None
    seen = _changed(diagnose(prepare(changed_window(slow=fewer, gen_after=50))))
    assert seen is not None and "Tokens/s per running request fell" in seen.title


def test_a_baseline_in_the_first_bucket_is_stated_at_its_bound_and_a_rise_from_it_claimed() -> None:
    """Every early gap ≤ 10 ms (vLLM's first inter_token_latency bound: nothing is known below it), every
    late one in (75, 100] ms. The baseline is stated as the most it can be, 10 ms, so the rise is at least
    7.5×: a fast engine that slowed is not excused because its old speed sat in the first bucket. The
    same late speed from the (75, 100] ms bucket is no rise at all."""
    first = [200.0] + [0.0] * 13
    finding = _changed(diagnose(prepare(changed_window(fast=first))))
    assert finding is not None and "ITL p95 rose" in finding.title
    assert finding.evidence["itl_p95_before"] == pytest.approx(0.010)
    assert finding.evidence["itl_p95_after"] >= 0.075 and finding.evidence["itl_p95_factor"] >= 7.5
    assert _changed(diagnose(prepare(changed_window(fast=SLOW)))) is None
