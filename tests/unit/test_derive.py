from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diagnostics.core.metrics.catalog import Histogram, parse_snapshot
from diagnostics.core.metrics.derive import (
    Scrape,
    counter_rate,
    counter_steps,
    derive_state,
    histogram_delta,
    histogram_quantile,
    histogram_step,
    increase,
    prefix_cache_hit_rate,
    quantile_estimate,
    window,
)
from diagnostics.core.text import fmt_latency

LABELS = '{engine="0",model_name="m"}'


def payload(
    *, hits: float = 0, queries: float = 0, gen: float = 0, start: float = 1000.0, buckets: tuple[float, ...] = (0, 0, 0)
) -> str:
    b1, b2, inf = buckets
    return "\n".join([
        f"vllm:prefix_cache_hits_total{LABELS} {hits}",
        f"vllm:prefix_cache_queries_total{LABELS} {queries}",
        f"vllm:generation_tokens_total{LABELS} {gen}",
        f"vllm:num_requests_running{LABELS} 1",
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {b1}',
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0",model_name="m"}} {b2}',
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {inf}',
        f"vllm:time_to_first_token_seconds_count{LABELS} {inf}",
        f"vllm:time_to_first_token_seconds_sum{LABELS} {inf * 0.2}",
        f"process_start_time_seconds {start}",
    ]) + "\n"


def scrape(ts: float, **kw: object) -> Scrape:
    return Scrape(ts, parse_snapshot(payload(**kw)))  # type: ignore[arg-type]


def generated(history: list[Scrape]) -> list[tuple[float, float, float]]:
    """``(previous ts, ts, tokens generated)`` between the scrapes that carry the counter."""
    return counter_steps(history, lambda s: s.value("generation_tokens"))


def test_increase_treats_a_drop_as_a_reset() -> None:
    assert increase([10, 15, 3, 8]) == 5 + 3 + 5


def test_counter_reset_gives_no_negative_rate_and_no_spike() -> None:
    history = [scrape(0, gen=1000), scrape(1, gen=1100), scrape(2, gen=20, start=2000), scrape(3, gen=120, start=2000)]
    assert [inc for _, _, inc in generated(history)] == [100.0, 20.0, 100.0]  # one-second intervals
    assert counter_rate(history, "generation_tokens") == pytest.approx(220 / 3)


def test_restart_detected_by_start_time_even_when_the_counter_grew() -> None:
    history = [scrape(0, gen=10), scrape(1, gen=500, start=2000)]
    assert [inc for _, _, inc in generated(history)] == [500.0]


def test_error_scrapes_leave_gaps_not_zeros() -> None:
    history = [scrape(0, gen=0), Scrape(1, None, "down"), scrape(2, gen=200)]
    assert generated(history) == [(0, 2, 200.0)]  # one step across the gap


def test_hit_rate_is_windowed_not_lifetime() -> None:
    history = [scrape(0, hits=0, queries=1000), scrape(50, hits=0, queries=2000), scrape(100, hits=900, queries=3000)]
    assert prefix_cache_hit_rate(window(history, 50)) == pytest.approx(0.9)
    assert prefix_cache_hit_rate(history) == pytest.approx(0.45)


def test_hit_rate_is_none_when_nothing_was_queried() -> None:
    assert prefix_cache_hit_rate([scrape(0, queries=10), scrape(1, queries=10)]) is None


def test_hit_rate_falls_back_to_the_v0_gauge() -> None:
    v0 = Scrape(0, parse_snapshot('vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.25\n'))
    assert prefix_cache_hit_rate([v0]) == 0.25


def test_quantiles_come_from_bucket_deltas_in_the_window() -> None:
    history = [scrape(0, buckets=(100, 100, 100)), scrape(1, buckets=(100, 110, 110)), scrape(2, buckets=(100, 120, 120))]
    delta = histogram_delta(history, "time_to_first_token_seconds")
    assert delta is not None and delta.cumulative == (0, 20, 20)
    # All 20 new observations lie in (0.1, 1.0]: the median interpolates to the middle.
    assert histogram_quantile(0.5, delta) == pytest.approx(0.55)
    state = derive_state(history)
    q = state.quantile("time_to_first_token_seconds", 0.5)
    assert q is not None and q.value == pytest.approx(0.55) and (q.lower, q.upper, q.bound) == (0.1, 1.0, None)


@pytest.mark.parametrize(("cumulative", "expected"), [
    # Every observation ≤ 0.3 s (vLLM's first queue-time bucket): the p95 is a bound, "< 300 ms".
    ((20, 20, 20), (0.0, 0.3, "below")),
    # All in (0.3, 1.0]: an interpolated number inside that bucket.
    ((0, 20, 20), (0.3, 1.0, None)),
    # All beyond the last finite bound: only "> 1 s" is known.
    ((0, 0, 20), (1.0, float("inf"), "above")),
])
def test_a_quantile_says_which_bucket_it_came_from(cumulative: tuple[float, ...], expected: tuple) -> None:  # type: ignore[type-arg]
    q = quantile_estimate(0.95, Histogram((0.3, 1.0, float("inf")), cumulative, 0.0, cumulative[-1]))
    assert q is not None and (q.lower, q.upper, q.bound) == expected


def test_a_first_bucket_quantile_is_never_over_a_budget_and_reads_as_a_bound() -> None:
    q = quantile_estimate(0.95, Histogram((0.3, 1.0, float("inf")), (20, 20, 20), 0.0, 20))
    assert q is not None and not q.over(0.1)  # interpolation would say 285 ms > 100 ms
    assert fmt_latency(q) == "< 300 ms"


def test_histogram_reset_counts_the_post_restart_observations() -> None:
    history = [scrape(0, buckets=(50, 60, 60)), scrape(1, buckets=(2, 4, 4), start=2000)]
    delta = histogram_delta(history, "time_to_first_token_seconds")
    assert delta is not None and delta.cumulative == (2, 4, 4)


def test_histogram_step_treats_a_drop_in_any_bucket_as_a_reset() -> None:
    snap = parse_snapshot(payload())
    a = Histogram((0.1, 1.0, math.inf), (5, 9, 9), 1.0, 9)
    b = Histogram((0.1, 1.0, math.inf), (3, 10, 10), 2.0, 10)
    assert histogram_step(snap, a, snap, b) == b


def test_histogram_step_has_no_delta_across_bucket_layouts() -> None:
    a = Histogram((0.1, math.inf), (1, 2), 0.0, 2)
    b = Histogram((0.5, math.inf), (3, 4), 0.0, 4)
    snap = parse_snapshot(payload())
    assert histogram_step(snap, a, snap, b) is None


@pytest.mark.parametrize(
    ("q", "cumulative", "expected"),
    [
        (0.5, (0, 0, 0), None),
        (0.5, (10, 10, 10), 0.05),
        (0.99, (0, 0, 10), 1.0),  # rank in +Inf bucket: the highest finite bound
        (1.0, (5, 10, 10), 1.0),
        (0.25, (5, 10, 10), 0.05),
    ],
)
def test_histogram_quantile_matches_prometheus(q: float, cumulative: tuple[float, ...], expected: float | None) -> None:
    hist = Histogram((0.1, 1.0, math.inf), cumulative, 0.0, cumulative[-1])
    result = histogram_quantile(q, hist)
    assert result == (pytest.approx(expected) if expected is not None else None)


def test_no_observations_in_window_is_none_but_absent_histogram_is_absent() -> None:
    history = [scrape(0, buckets=(5, 5, 5)), scrape(1, buckets=(5, 5, 5))]
    state = derive_state(history)
    assert state.quantiles["time_to_first_token_seconds"] == {0.5: None, 0.95: None, 0.99: None}
    assert state.quantiles["inter_token_latency_seconds"] is None


@given(
    counts=st.lists(st.integers(min_value=0, max_value=1000), min_size=2, max_size=12),
    qs=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_quantile_is_monotone_in_q_and_within_the_bounds(counts: list[int], qs: tuple[float, float]) -> None:
    bounds = tuple(float(2**i) for i in range(len(counts) - 1)) + (math.inf,)
    cumulative = []
    running = 0
    for c in counts:
        running += c
        cumulative.append(float(running))
    hist = Histogram(bounds, tuple(cumulative), 0.0, cumulative[-1])
    lo, hi = sorted(qs)
    a, b = histogram_quantile(lo, hist), histogram_quantile(hi, hist)
    if cumulative[-1] == 0:
        assert a is None and b is None
        return
    assert a is not None and b is not None
    assert 0 <= a <= b <= bounds[-2]


def test_kv_usage_in_blocks_and_tokens_from_cache_config(burst_text: str) -> None:
    state = derive_state([Scrape(0, parse_snapshot(burst_text))])
    assert state.kv_cache_usage_perc == pytest.approx(0.0036623329060612164)
    assert state.kv_cache_used_blocks == pytest.approx(0.0036623329060612164 * 16383)
    assert state.kv_cache_used_tokens == pytest.approx(0.0036623329060612164 * 16383 * 128)
    assert state.num_preemptions_rate is None  # one scrape: a rate needs two
