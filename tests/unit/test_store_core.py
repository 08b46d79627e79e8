"""The history store's pure half: chunks round-trip a real recording exactly, a snapshot written back
as text parses to itself, and the per-interval aggregates keep what triage reads (counter and bucket
increases, across a reset too; the last gauge value and its peak; an outage's edges)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from diagnostics.core.metrics.catalog import Layout, parse_snapshot
from diagnostics.core.metrics.derive import counter_increase, histogram_delta
from diagnostics.core.store import DEFAULT_POLICY, Row, StorePolicy, Tier, decode_chunk, downsample, encode_chunk
from diagnostics.core.store.codec import exposition, layout_from_json, layout_to_json
from diagnostics.recording import read_recording
from tests.unit import synth

INCIDENTS = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"


class Layouts:
    """The adapter's layout table, in memory: each layout written once as JSON, read back from it."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.back: dict[int, Layout] = {}

    def id(self, layout: Layout) -> int:
        if id(layout) not in self.ids:
            self.ids[id(layout)] = n = len(self.ids)
            self.back[n] = layout_from_json(layout_to_json(layout))
        return self.ids[id(layout)]


def test_a_chunk_gives_back_every_number_of_a_real_data_parallel_recording() -> None:
    scrapes = read_recording(INCIDENTS / "hung_rank_dp2.jsonl.gz").scrapes()
    layouts = Layouts()
    rows = decode_chunk(encode_chunk([Row(s) for s in scrapes], layouts.id), layouts.back.__getitem__)
    assert len(rows) == len(scrapes)
    for got, want in zip(rows, scrapes):
        assert got.ts == want.ts and got.scrape.error == want.error and got.scrape.error_kind == want.error_kind
        if want.snapshot is None:
            assert got.scrape.snapshot is None
            continue
        assert got.scrape.snapshot is not None
        assert got.scrape.snapshot.layout == want.snapshot.layout
        # Bit for bit (NaN included): XOR-delta and shuffle lose nothing.
        assert got.scrape.snapshot.values.tobytes() == want.snapshot.values.tobytes()
        assert got.scrape.snapshot.cache_config == want.snapshot.cache_config
        assert got.scrape.snapshot.process_start_time_seconds == want.snapshot.process_start_time_seconds


def test_a_chunk_is_far_smaller_than_the_floats_it_holds() -> None:
    scrapes = [s for s in read_recording(INCIDENTS / "healthy_small_steady.jsonl.gz").scrapes() if s.snapshot]
    body = encode_chunk([Row(s) for s in scrapes], Layouts().id)
    raw = sum(len(s.snapshot.values) * 8 for s in scrapes if s.snapshot)
    assert len(body) < raw / 8, (len(body), raw)


@pytest.mark.parametrize("name", ["healthy_data_parallel", "deferred_lora", "admission_queued_reqs", "rejected_at_model_max",
                                  "healthy_spec_ngram"])
def test_a_snapshot_written_back_as_text_parses_to_the_same_snapshot(name: str) -> None:
    path = INCIDENTS / f"{name}.jsonl.gz"
    for scrape in read_recording(path).scrapes()[-3:]:
        if scrape.snapshot is None:
            continue
        again = parse_snapshot(exposition(scrape.snapshot))
        assert again.layout == scrape.snapshot.layout
        assert again.values.tobytes() == scrape.snapshot.values.tobytes()
        assert again.cache_config == scrape.snapshot.cache_config
        assert again.lora == scrape.snapshot.lora
        assert again.process_start_time_seconds == scrape.snapshot.process_start_time_seconds


def _per_second(n: int, restart_at: int | None = None) -> list[Row]:
    """``n`` scrapes a second: 10 tokens and 2 ITL observations (one ≤ 10 ms, one in 25-50 ms) a
    second, KV usage 0.2 but 0.9 for one second at t=13; the server restarts at ``restart_at``."""
    rows = []
    gen = 0.0
    fast = slow = 0.0
    for t in range(n):
        if restart_at is not None and t == restart_at:
            gen = fast = slow = 0.0
        gen += 10
        fast += 1
        slow += 1
        counts = [fast, 0, slow] + [0] * 11
        started = 1000 if restart_at is None or t < restart_at else 2000
        rows.append(Row(synth.scrape(float(t), gen=gen, itl_counts=counts, usage=0.9 if t == 13 else 0.2,
                                     started_at=started)))
    return rows


def test_aggregates_keep_counter_and_bucket_increases() -> None:
    raw = _per_second(60)
    agg = downsample(raw, 10.0)
    assert len(agg) == 7  # the first scrape, then one a 10 s interval
    raw_scrapes = [r.scrape for r in raw]
    agg_scrapes = [r.scrape for r in agg]
    assert counter_increase(agg_scrapes, "generation_tokens") == counter_increase(raw_scrapes, "generation_tokens")
    assert histogram_delta(agg_scrapes, "inter_token_latency_seconds") == \
        histogram_delta(raw_scrapes, "inter_token_latency_seconds")


def test_a_restart_inside_an_interval_is_not_lost_between_aggregates() -> None:
    raw = _per_second(60, restart_at=25)
    agg = [r.scrape for r in downsample(raw, 10.0)]
    # 59 × 10 tokens counted between the first and last scrape: the restart's own 10 included.
    assert counter_increase([r.scrape for r in raw], "generation_tokens") == (590, 59)
    assert counter_increase(agg, "generation_tokens") == (590, 59)


def test_an_aggregate_keeps_the_last_gauge_and_its_peak() -> None:
    agg = downsample(_per_second(30), 10.0)
    by_ts = {r.ts: r.scrape for r in agg}
    assert sorted(by_ts) == [0.0, 9.0, 19.0, 29.0]
    second = by_ts[19.0]
    assert second.snapshot is not None and second.peak is not None
    assert second.snapshot.value("kv_cache_usage_perc") == 0.2  # the last value
    assert second.peak.value("kv_cache_usage_perc") == 0.9      # the spike at t=13
    first = by_ts[9.0].peak
    assert first is not None and first.value("kv_cache_usage_perc") == 0.2
    # Aggregating aggregates keeps the spike.
    coarser = downsample(agg, 30.0)
    assert [r.ts for r in coarser] == [0.0, 29.0] and coarser[1].scrape.peak is not None
    assert coarser[1].scrape.peak.value("kv_cache_usage_perc") == 0.9
    # An aggregate alone in its interval (a read's row cap close to the tier's own interval) keeps its
    # peak too: it stands for ten scrapes, not one.
    alone = downsample(agg, 10.0)
    lone = {r.ts: r.scrape for r in alone}[19.0]
    assert lone.peak is not None and lone.peak.value("kv_cache_usage_perc") == 0.9


def test_an_outage_keeps_its_first_and_last_failure_and_the_recovery() -> None:
    rows = _per_second(5) + [Row(synth.down(float(t))) for t in range(5, 25)] + _per_second(30)[25:]
    agg = [r.scrape for r in downsample(rows, 10.0)]
    failures = [s for s in agg if s.snapshot is None]
    assert failures[0].ts == 5.0 and failures[-1].ts == 24.0
    assert all(f.error == synth.MESSAGES[f.error_kind] for f in failures if f.error_kind in synth.MESSAGES)
    assert agg[-1].snapshot is not None and agg[-1].ts == 29.0
    assert agg == sorted(agg, key=lambda s: s.ts)


def test_a_layout_change_closes_the_interval() -> None:
    rows = [Row(synth.scrape(0.0, gen=1)), Row(synth.scrape(1.0, gen=2)), Row(synth.scrape(2.0, gen=3, finished=[1, 0])),
            Row(synth.scrape(3.0, gen=4, finished=[2, 0]))]
    agg = downsample(rows, 10.0)
    assert [r.ts for r in agg] == [0.0, 1.0, 3.0]


def test_the_default_policy_is_bounded_and_a_bad_one_says_why() -> None:
    assert DEFAULT_POLICY.problems() == []
    assert all(math.isfinite(t.retention_seconds) for t in DEFAULT_POLICY.tiers)
    assert DEFAULT_POLICY.retention_seconds == 30 * 86400
    bad = StorePolicy(tiers=(Tier(10.0, math.inf, 60.0),), max_bytes=1024)
    problems = " ".join(bad.problems())
    assert "every scrape" in problems and "finite" in problems and "1 MiB" in problems
    short = StorePolicy(tiers=(Tier(0.0, 600.0, 60.0), Tier(10.0, 3600.0, 3600.0)))
    assert any("two of tier 1's chunks" in p for p in short.problems())


def test_an_operators_limits_bound_every_tier_and_the_size() -> None:
    week = DEFAULT_POLICY.limited(max_bytes=64 << 20, retention_seconds=7 * 86400)
    assert week.problems() == [] and week.max_bytes == 64 << 20
    assert max(t.retention_seconds for t in week.tiers) == 7 * 86400
    assert [t.interval_seconds for t in week.tiers] == [0.0, 15.0, 60.0, 1800.0]
    hour = DEFAULT_POLICY.limited(retention_seconds=3600)
    assert hour.problems() == [] and [t.interval_seconds for t in hour.tiers] == [0.0, 15.0]
    assert DEFAULT_POLICY.limited(max_bytes=1000).problems() == ["the size cap must be at least 1 MiB"]


def test_live_draws_the_peak_a_downsampled_range_keeps() -> None:
    from diagnostics.core.figures.live import kv_usage_figure

    raw = _per_second(600)  # the one-second spike at t=13
    shown = [r.scrape for r in downsample(raw, 60.0)]
    fig = kv_usage_figure(shown, None)
    assert fig is not None
    peak = next(t for t in fig.data if t.name == "peak in the interval")
    last = next(t for t in fig.data if t.name == "KV-cache usage")
    assert max(v for v in peak.y if v is not None) == 90.0 and max(v for v in last.y if v is not None) == 20.0
    # Every scrape as taken: no peak line.
    plain = kv_usage_figure([r.scrape for r in raw], None)
    assert plain is not None and all(t.name != "peak in the interval" for t in plain.data)


def test_a_counter_that_drops_without_a_restart_closes_the_interval() -> None:
    """A counter reset while the process start time stays (a counter re-created, not a restart): the
    increase over the aggregates is the raw one, counted by hand — 24 steps of 10 before the drop,
    the post-reset value 10, then 34 steps of 10: 590. (Found by a sceptic's mutation: only a
    restart closed an interval, and no test told a bare drop apart.)"""
    from diagnostics.core.metrics.derive import counter_increase
    from diagnostics.core.store import Row, downsample
    from tests.unit import synth

    rows, gen = [], 0.0
    for t in range(60):
        if t == 25:
            gen = 0.0
        gen += 10
        rows.append(Row(synth.scrape(float(t), gen=gen, started_at=1000)))
    aggregates = [r.scrape for r in downsample(rows, 10.0)]
    assert counter_increase(aggregates, "generation_tokens")[0] == 590
