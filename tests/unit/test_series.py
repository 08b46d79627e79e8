"""Chart series on a hand-made clock, checked against values computed by hand, across a counter
reset (the server restarted: a new process_start_time_seconds and counters back near zero)."""

from __future__ import annotations

import pytest

from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.series import gauge_series, increase_events, rate_series, rolling_ratio


def _scrape(ts: float, gen: float, start: float, hits: float = 0, queries: float = 0, running: float = 1) -> Scrape:
    text = (f'vllm:generation_tokens_total{{model_name="m",engine="0"}} {gen}\n'
            f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {hits}\n'
            f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {queries}\n'
            f'vllm:num_requests_running{{model_name="m",engine="0"}} {running}\n'
            f"process_start_time_seconds {start}\n")
    return Scrape(ts, parse_snapshot(text))


# t = 0..5 s; the server restarts between t = 2 and t = 3 (counter 30 → 5), t = 6 fails.
HISTORY = [_scrape(0, 0, 100), _scrape(1, 10, 100), _scrape(2, 30, 100), _scrape(3, 5, 200), _scrape(4, 25, 200),
           _scrape(5, 45, 200), Scrape(6, None, "cannot reach")]


def test_rate_over_a_2s_window_across_a_restart() -> None:
    series = rate_series(HISTORY, lambda s: s.value("generation_tokens"), window_seconds=2.0)
    # Increments: -, 10, 20, 5 (the restart: the new value is the increase), 20, 20.
    # Sums over (t−2, t]: 10, 30, 25, 25, 40; divided by min(2, t): 10, 15, 12.5, 12.5, 20.
    assert series.ts == [0, 1, 2, 3, 4, 5, 6]
    assert series.values == [None, pytest.approx(10), pytest.approx(15), pytest.approx(12.5), pytest.approx(12.5),
                             pytest.approx(20), None]


def test_increase_events_count_the_restart_increment_not_a_negative() -> None:
    events = increase_events(HISTORY, lambda s: s.value("generation_tokens"))
    assert list(zip(events.ts, events.values)) == [(1, 10), (2, 20), (3, 5), (4, 20), (5, 20)]


def test_a_failed_scrape_is_a_gap_not_a_zero() -> None:
    series = gauge_series(HISTORY, lambda s: s.value("num_requests_running"))
    assert series.values == [1, 1, 1, 1, 1, 1, None]


def test_hit_ratio_over_a_window_across_a_restart() -> None:
    history = [_scrape(0, 0, 100, hits=0, queries=0), _scrape(1, 0, 100, hits=50, queries=100),
               _scrape(2, 0, 200, hits=10, queries=40), _scrape(3, 0, 200, hits=10, queries=80)]
    series = rolling_ratio(history, lambda s: s.value("prefix_cache_hits"), lambda s: s.value("prefix_cache_queries"),
                           window_seconds=10.0)
    # Δhits 50, 10 (restart), 0 over Δqueries 100, 40 (restart), 40: 50/100, 60/140, 60/180.
    assert series.values == [None, pytest.approx(0.5), pytest.approx(60 / 140), pytest.approx(60 / 180)]
