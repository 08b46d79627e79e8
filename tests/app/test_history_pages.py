"""AppTest of the pages on the history store: with a store open, the sidebar offers 6 h … 30 days,
and past the collector's hour Live draws and Diagnose judges what the store holds (a real hung-rank
recording stored an hour ago) — not the live collector's last hour (a KV-pressure burst)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnostics.collector import register, use_history_store
from diagnostics.core.metrics.derive import Scrape
from diagnostics.recording import read_recording
from diagnostics.sources.store import HistoryStore
from tests.app.test_pages import URL, app, fed_collector

HUNG = Path(__file__).resolve().parents[1] / "fixtures" / "incidents" / "hung_rank_dp2.jsonl.gz"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    recording = read_recording(HUNG)
    scrapes = recording.scrapes()
    shift = time.time() - 3600 - scrapes[-1].ts  # it ended an hour ago
    opened = HistoryStore(tmp_path)
    for record, scrape in zip(recording.records, scrapes, strict=True):
        opened.record(URL, Scrape(scrape.ts + shift, scrape.snapshot, scrape.error, scrape.error_kind), None,
                      record.info)
    assert opened.flush()
    use_history_store(opened)
    yield opened
    use_history_store(None)
    opened.close()


def test_live_offers_the_stored_ranges_and_draws_six_hours_from_the_store(store: HistoryStore) -> None:
    register(fed_collector())
    at = app("pages/1_Live.py")
    at.session_state["window_seconds"] = "6 h"
    at.run()
    assert not at.exception
    options = at.sidebar.radio(key="_w_window_seconds").options
    assert options[-4:] == ["6 h", "1 day", "7 days", "30 days"]
    # The stored server ran two data-parallel engines: the per-engine charts are drawn from the store.
    keys = [c.key for c in at.get("plotly_chart")]
    assert "live-engines-generation_tokens" in keys and "live-kv" in keys and len(keys) == 13, keys
    at.session_state["window_seconds"] = "1 h"
    at.run()
    assert not at.exception
    assert "live-engines-generation_tokens" not in [c.key for c in at.get("plotly_chart")]  # the live one has one


def test_diagnose_judges_the_stored_range_past_the_collectors_hour(store: HistoryStore) -> None:
    register(fed_collector())
    at = app("pages/3_Diagnose.py")
    at.session_state["window_seconds"] = "6 h"
    at.run()
    assert not at.exception
    assert any("read from the history store" in c.value for c in at.caption), [c.value for c in at.caption]
    assert at.error and "Critical" in at.error[0].value
    assert "Hung rank" in " ".join(m.value for m in at.markdown)


def test_within_the_hour_the_pages_read_the_live_collector(store: HistoryStore) -> None:
    register(fed_collector())
    at = app("pages/3_Diagnose.py")
    at.session_state["window_seconds"] = "1 h"
    at.run()
    assert not at.exception
    assert not any("history store" in c.value for c in at.caption)
    assert "Hung rank" not in " ".join(m.value for m in at.markdown)


def test_the_sidebar_says_how_far_back_history_goes(store: HistoryStore) -> None:
    register(fed_collector())
    at = app("pages/1_Live.py").run()
    assert not at.exception
    # The stored recording ended an hour ago and is about a minute long.
    assert any(c.value.startswith("History store\\: from ") and "min ago" in c.value for c in at.sidebar.caption), \
        [c.value for c in at.sidebar.caption]


def test_a_corrupt_store_is_a_warning_in_the_sidebar_and_live_goes_on(tmp_path: Path) -> None:
    (tmp_path / "history.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    broken = HistoryStore(tmp_path)
    use_history_store(broken)
    try:
        register(fed_collector())
        at = app("pages/1_Live.py").run()
        assert not at.exception
        assert any("is corrupt" in w.value and "live collection goes on" in w.value for w in at.sidebar.warning)
        assert len(at.get("plotly_chart")) == 9  # the live charts, from the collector
    finally:
        use_history_store(None)
        broken.close()


def test_live_renders_a_thirty_day_range(tmp_path: Path) -> None:
    """Thirty days of 30 min aggregates (the coarsest tier) of a real two-engine recording's series:
    Live draws every chart of them, the per-engine ones included."""
    from diagnostics.core.store import DEFAULT_POLICY, Row, downsample

    scrapes = [s for s in read_recording(HUNG).scrapes() if s.snapshot is not None]
    now = time.time()
    step = DEFAULT_POLICY.tiers[-1].interval_seconds
    n = int(30 * 86400 / step)
    rows = []
    for i in range(n):  # the recording's scrapes in turn, one per 30 min (two a step: an aggregate each)
        a, b = scrapes[(2 * i) % len(scrapes)], scrapes[(2 * i + 1) % len(scrapes)]
        t = now - 30 * 86400 + i * step
        rows += [Row(Scrape(t, a.snapshot)), Row(Scrape(t + 1, b.snapshot))]
    month = HistoryStore(tmp_path)
    month.write_rows(URL, len(DEFAULT_POLICY.tiers) - 1, downsample(rows, step))
    use_history_store(month)
    try:
        register(fed_collector())
        at = app("pages/1_Live.py")
        at.session_state["window_seconds"] = "30 days"
        at.run()
        assert not at.exception
        charts = at.get("plotly_chart")
        assert len(charts) == 13 and "live-engines-generation_tokens" in [c.key for c in charts]
    finally:
        use_history_store(None)
        month.close()
