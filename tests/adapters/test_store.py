"""The SQLite history store: what goes in comes back (the corpus diagnosed the same from the store
as from its recordings; a stored range written back as a recording diagnoses the same), tiers age out
and are read where they reach, and a store that is locked, full, corrupt or written by another
process turns history read-only with a message while the collector goes on collecting."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from diagnostics.cli.main import main
from diagnostics.collector import Collector
from diagnostics.core.diagnosis import diagnose, prepare
from diagnostics.core.metrics.derive import counter_increase
from diagnostics.core.store import StorePolicy, Tier
from diagnostics.recording import encode_recording, read_recording
from diagnostics.sources import store as store_module
from diagnostics.sources.store import FILE_NAME, HistoryStore, StoredTarget, StoreError
from tests.fixtures.incidents.corpus import HERE, labels
from tests.unit import synth
from tests.unit.test_collector import Clock, FakeServer, make

RECORDINGS = sorted({label["file"] for label in labels().values()})


def _findings(history: list, info: object) -> list[dict]:  # type: ignore[type-arg]
    return [f.to_json() for f in diagnose(prepare(history, info=info))]


def _stored(path: Path, tmp_path: Path) -> tuple[StoredTarget, list, object]:  # type: ignore[type-arg]
    recording = read_recording(path)
    scrapes = recording.scrapes()
    store = HistoryStore(tmp_path / "store", clock=lambda: scrapes[-1].ts)
    for record, scrape in zip(recording.records, scrapes, strict=True):
        store.record(record.target, scrape, None, record.info)
    store.close()
    reader = HistoryStore(tmp_path / "store", write=False)
    target = StoredTarget(reader, recording.records[0].target, range_s=scrapes[-1].ts - scrapes[0].ts,
                          end=scrapes[-1].ts)
    return target, scrapes, recording.info()


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_recording_replayed_through_the_store_gives_the_same_findings(name: str, tmp_path: Path) -> None:
    target, scrapes, info = _stored(HERE / name, tmp_path)
    history = target.history()
    assert [s.ts for s in history] == [s.ts for s in scrapes]
    assert target.status().info == info
    assert _findings(history, target.status().info) == _findings(scrapes, info)


@pytest.mark.parametrize("name", ["kv_pressure_blocks_override.jsonl.gz", "outage_restart.jsonl.gz",
                                  "hung_rank_dp2.jsonl.gz"])
def test_a_stored_range_saved_as_a_recording_diagnoses_the_same(name: str, tmp_path: Path) -> None:
    path = HERE / name
    assert path.exists(), f"{name} is a committed corpus recording and must be there"
    target, scrapes, info = _stored(path, tmp_path)
    again = read_recording(encode_recording(target.recent_records()))
    assert again.info() == info
    assert _findings(again.scrapes(), again.info()) == _findings(scrapes, info)


def test_diagnose_from_the_store_prints_what_diagnose_of_the_recording_prints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = HERE / "kv_pressure_blocks_override.jsonl.gz"
    target, scrapes, _ = _stored(path, tmp_path)
    code_replay = main(["diagnose", "--replay", str(path), "--json", "--no-predict"])
    replay_out = json.loads(capsys.readouterr().out)
    code_store = main(["diagnose", "--data-dir", str(tmp_path / "store"), "--since", f"{scrapes[-1].ts - scrapes[0].ts}s",
                       "--until", str(scrapes[-1].ts), "--json", "--no-predict"])
    store_out = json.loads(capsys.readouterr().out)
    assert code_store == code_replay == 2  # KV full and preempting: critical
    assert store_out == replay_out
    out = tmp_path / "past.jsonl.gz"
    assert main(["record", "--from-store", "--data-dir", str(tmp_path / "store"), "--since", "1d",
                 "--until", str(scrapes[-1].ts), "-o", str(out)]) == 0
    assert len(read_recording(out).records) == len(scrapes)


def _small_policy() -> StorePolicy:
    return StorePolicy(tiers=(Tier(0.0, 1200.0, 60.0), Tier(10.0, 7200.0, 600.0), Tier(60.0, 86400.0, 3600.0)),
                       batch_seconds=1.0)


def test_three_hours_age_out_of_the_raw_tier_and_read_back_from_the_aggregates(tmp_path: Path) -> None:
    clock = Clock()
    start = clock.now
    store = HistoryStore(tmp_path, _small_policy(), clock=clock)
    url = "http://fake:8000"
    scrapes = []
    for t in range(3 * 3600):
        clock.now = start + t
        scrape = synth.scrape(clock.now, gen=10.0 * t, usage=0.9 if t == 4000 else 0.2)
        scrapes.append(scrape)
        store.record(url, scrape)
        if t % 600 == 0:
            assert store.flush()
            store._maintain()  # noqa: SLF001 - the writer runs it every minute of wall time
    assert store.flush()
    store._maintain()  # noqa: SLF001
    extent = store.extent(url)
    assert extent is not None and extent[0] == start  # the first scrape stands in every tier
    whole = store.read(url, start, clock.now)
    assert whole.tier in (1, 2)
    history = [r.scrape for r in whole.rows]
    assert counter_increase(history, "generation_tokens") == counter_increase(scrapes, "generation_tokens")
    spike = [r.scrape.peak for r in whole.rows if r.scrape.peak is not None and r.ts >= start + 4000][0]
    assert spike.value("kv_cache_usage_perc") == 0.9  # the one-second spike, long out of the raw tier
    recent = store.read(url, clock.now - 600, clock.now)
    assert recent.tier == 0 and len(recent.rows) >= 590
    raw_oldest = sqlite3.connect(store.path).execute("SELECT min(start_ts) FROM chunks WHERE tier = 0").fetchone()[0]
    assert raw_oldest >= clock.now - 1200 - 600  # pruned whole chunks (600 s each here)
    store.close()


def test_a_restarted_store_rebuilds_the_open_aggregates(tmp_path: Path) -> None:
    clock = Clock()
    start = clock.now
    url = "http://fake:8000"
    first = HistoryStore(tmp_path, _small_policy(), clock=clock)
    for t in range(900):
        clock.now = start + t
        first.record(url, synth.scrape(clock.now, gen=10.0 * t))
    assert first.flush()
    # Killed: the open 10 s chunk (10 min span) was never written.
    first._writable = False  # noqa: SLF001 - stop it writing, as a killed process would
    first._lock_file.close()  # noqa: SLF001
    second = HistoryStore(tmp_path, _small_policy(), clock=clock)
    second.close()  # a clean close writes the open chunks
    conn = sqlite3.connect(tmp_path / store_module.FILE_NAME)
    (n1,) = conn.execute("SELECT sum(num_rows) FROM chunks WHERE tier = 1").fetchone()
    assert n1 >= 90  # 900 s of 10 s aggregates (plus the first scrape)


def test_a_locked_database_turns_history_read_only_and_collection_goes_on(tmp_path: Path) -> None:
    clock = Clock()
    store = HistoryStore(tmp_path, clock=clock, busy_timeout_seconds=0.2)
    collector = make(FakeServer(), clock)
    collector.use_store(store)
    collector.scrape_once()
    assert store.flush()
    assert store.state.writable
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    for _ in range(3):
        clock.now += 1
        collector.scrape_once()
    assert store.flush()
    state = store.state
    assert not state.writable and "locked by another process" in (state.message or "")
    assert "live collection goes on" in (state.message or "")
    assert len(collector.history()) == 4 and collector.status().state == "up"
    holder.execute("ROLLBACK")
    holder.close()
    clock.now += store_module.RETRY_SECONDS + 1
    collector.scrape_once()
    assert store.flush()  # the retry: writable again
    clock.now += 1
    collector.scrape_once()
    assert store.flush()
    assert store.state.writable
    assert len(store.read(collector.target, 0, clock.now).rows) >= 2
    store.close()


def test_a_full_disk_turns_history_read_only_and_collection_goes_on(tmp_path: Path) -> None:
    clock = Clock()
    store = HistoryStore(tmp_path, clock=clock, hard_limit_bytes=48 * 1024)
    collector = make(FakeServer(), clock)
    collector.use_store(store)
    for _ in range(200):
        clock.now += 1
        collector.scrape_once()
        if not store.state.writable:
            break
        assert store.flush()
    state = store.state
    assert not state.writable and "is full" in (state.message or "")
    for _ in range(5):
        clock.now += 1
        collector.scrape_once()
    assert collector.status().state == "up" and collector.history()[-1].ts == clock.now
    store.close()


def test_a_corrupt_file_turns_history_off_with_a_message_and_collection_goes_on(tmp_path: Path) -> None:
    (tmp_path / store_module.FILE_NAME).write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    store = HistoryStore(tmp_path)
    assert not store.state.writable and "corrupt" in (store.state.message or "")
    clock = Clock()
    collector = make(FakeServer(), clock)
    assert collector.use_store(store) is None
    collector.scrape_once()
    assert collector.status().state == "up" and len(collector.history()) == 1
    store.close()


def test_a_second_process_on_the_same_directory_reads_and_does_not_write(tmp_path: Path) -> None:
    clock = Clock()
    first = HistoryStore(tmp_path, clock=clock)
    first.record("http://a:1", synth.scrape(clock.now, gen=1))
    assert first.flush()
    second = HistoryStore(tmp_path, clock=clock)
    assert not second.state.writable and "is written by process" in (second.state.message or "")
    second.record("http://a:1", synth.scrape(clock.now + 1, gen=2))  # dropped: not the writer
    assert [r.ts for r in second.read("http://a:1", 0, clock.now + 10).rows] == [clock.now]
    second.close()
    first.close()


def test_a_restarted_collector_shows_the_minutes_before_its_restart(tmp_path: Path) -> None:
    clock = Clock()
    server = FakeServer()
    before = make(server, clock)
    store = HistoryStore(tmp_path, clock=clock)
    before.use_store(store)
    for _ in range(30):
        before.scrape_once()
        clock.now += 1
    store.close()
    again = HistoryStore(tmp_path, clock=clock)
    after: Collector = make(server, clock)
    extent = after.use_store(again)
    assert extent is not None and extent[0] == 1000.0
    assert [s.ts for s in after.history()] == [s.ts for s in before.history()]
    assert after.status().info is not None and after.status().info.model == "tiny"
    after.scrape_once()
    assert len(after.history()) == 31
    again.close()


class _TextServer(FakeServer):
    """A FakeServer that remembers the /metrics text it sent each time."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def __call__(self, request):  # type: ignore[no-untyped-def]
        response = super().__call__(request)
        if request.url.path == "/metrics" and self.mode == "up":
            self.sent.append(response.text)
        return response


def test_the_metrics_text_around_an_outage_is_kept_and_comes_back_in_the_recording(tmp_path: Path) -> None:
    clock = Clock()
    server = _TextServer()
    store = HistoryStore(tmp_path, clock=clock)
    collector = make(server, clock)
    collector.use_store(store)
    times = []
    for mode in ["up"] * 10 + ["down"] * 3 + ["up"] * 5:
        server.mode = mode
        collector.scrape_once()
        times.append(clock.now)
        clock.now += 1
    clock.now += 400  # well past the recovery's five minutes
    collector.scrape_once()
    late = clock.now
    assert store.flush()
    kept = store.texts(collector.target, 0, clock.now)
    up_times = [t for t, m in zip(times, ["up"] * 10 + ["down"] * 3 + ["up"] * 5) if m == "up"]
    assert sorted(kept) == up_times and late not in kept  # before and after the outage, not later
    assert [kept[t] for t in up_times] == server.sent[:15]
    target = StoredTarget(store, collector.target, range_s=clock.now - 999, end=clock.now)
    records = target.recent_records()
    assert [r.metrics for r in records if r.ts in kept] == server.sent[:15]  # the server's own words
    assert next(r for r in records if r.ts == late).metrics != server.sent[-1]  # written back from numbers
    assert [r.error is not None for r in records].count(True) == 3
    store.close()


def test_serve_takes_the_history_flags_off_streamlits_line() -> None:
    from diagnostics.ui.serve import history_args

    spec, rest = history_args(["--server.port", "8600", "--data-dir", "/tmp/h", "--history-max-mib=64",
                               "--history-retention", "2d"])
    assert rest == ["--server.port", "8600"] and spec.data_dir == Path("/tmp/h") and spec.problem is None
    assert spec.policy.max_bytes == 64 << 20 and spec.policy.retention_seconds == 2 * 86400
    assert history_args(["--no-history"])[0].data_dir is None
    assert "at least 1 MiB" in (history_args(["--history-max-mib", "0.5"])[0].problem or "")
    assert "--history-retention" in (history_args(["--history-retention", "soon"])[0].problem or "")


def _raw_chunks(path: Path) -> list[tuple[float, float, int]]:
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT start_ts, end_ts, num_rows FROM chunks WHERE tier = 0 ORDER BY start_ts").fetchall()
    conn.close()
    return [(float(a), float(b), int(n)) for a, b, n in rows]


def test_batches_are_rewritten_as_one_chunk_when_their_span_ends_even_across_a_crash(tmp_path: Path) -> None:
    clock = Clock()
    clock.now = 6000.0  # a span boundary (spans of 60 s here)
    url = "http://fake:8000"
    # The writer's own clock stalled: only the flushes commit, however long the host takes (a real-time
    # batch deadline gave one more chunk when a busy host stalled the writer 1.3 s).
    first = HistoryStore(tmp_path, _small_policy(), clock=clock, monotonic=lambda: 0.0)
    for t in range(90):
        first.record(url, synth.scrape(clock.now + t, gen=float(t)))
        if t % 5 == 4:
            assert first.flush()
    chunks = _raw_chunks(first.path)
    assert chunks[0] == (6000.0, 6059.0, 60)  # the first minute: one chunk
    assert len(chunks) == 7 and sum(n for *_, n in chunks) == 90  # then six 5 s batches
    first._writable = False  # noqa: SLF001 - killed: nothing more is written
    first._lock_file.close()  # noqa: SLF001
    second = HistoryStore(tmp_path, _small_policy(), clock=clock, monotonic=lambda: 0.0)
    for t in range(90, 125):
        second.record(url, synth.scrape(clock.now + t, gen=float(t)))
        if t % 5 == 4:
            assert second.flush()
    chunks = _raw_chunks(second.path)
    assert chunks[:2] == [(6000.0, 6059.0, 60), (6060.0, 6119.0, 60)]  # the batches before the crash too
    assert sum(n for *_, n in chunks) == 125
    second.close()


def test_the_cli_names_the_targets_a_store_holds_and_says_when_it_has_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    store = HistoryStore(tmp_path, clock=clock)
    for url in ("http://a:1", "http://b:2"):
        for t in range(5):
            store.record(url, synth.scrape(clock.now + t, gen=float(t)))
    store.close()
    until = str(clock.now + 10)
    assert main(["diagnose", "--data-dir", str(tmp_path), "--since", "1m", "--until", until]) == 3
    said = capsys.readouterr().err
    assert "--url is needed" in said and "http://a:1, http://b:2" in said
    assert main(["status", "--data-dir", str(tmp_path), "--since", "1m", "--until", until, "--url", "http://b:2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "up"
    assert main(["diagnose", "--data-dir", str(tmp_path), "--since", "1m", "--until", until, "--url",
                 "http://c:3"]) == 3
    assert "no history of http://c:3" in capsys.readouterr().err
    empty = tmp_path / "nothing-here"
    assert main(["record", "--from-store", "--data-dir", str(empty), "-o", str(tmp_path / "x.jsonl")]) == 3
    assert "does not exist yet" in capsys.readouterr().err and not empty.exists()


def test_only_the_configured_targets_are_kept(tmp_path: Path) -> None:
    from diagnostics.collector import history_store, shared_collector, stop_all, use_history_store

    store = HistoryStore(tmp_path)
    use_history_store(store, ["http://127.0.0.1:9"])
    try:
        kept = shared_collector("http://127.0.0.1:9")
        typed = shared_collector("http://127.0.0.1:10")
        assert kept.store is store and typed.store is None
        assert history_store("http://127.0.0.1:9/") is store and history_store("http://127.0.0.1:10") is None
    finally:
        stop_all()
        use_history_store(None)
        store.close()


def _maintained_within_cap(store: HistoryStore, policy: StorePolicy) -> sqlite3.Connection:
    """Flush, run the writer's maintenance (it runs every minute), and check the file's used pages are
    within the size cap; the connection, to look at what was kept."""
    assert store.flush()
    store._maintain()  # noqa: SLF001
    conn = sqlite3.connect(store.path)
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    used = (conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]) * page
    assert used <= policy.max_bytes
    return conn


def test_past_the_size_cap_the_coarsest_tiers_oldest_chunks_go_first(tmp_path: Path) -> None:
    import random
    from array import array

    from diagnostics.core.metrics.catalog import Snapshot
    from diagnostics.core.metrics.derive import Scrape
    from diagnostics.core.store import Row

    rng = random.Random(7)
    base = read_recording(HERE / "healthy_bursty.jsonl.gz").scrapes()[-1].snapshot  # 289 numbers
    assert base is not None

    def noisy(ts: float) -> Row:  # numbers that do not compress: ~2 KB a row
        values = array("d", (rng.random() for _ in base.values))
        return Row(Scrape(ts, Snapshot(base.layout, values, base.cache_config, base.process_start_time_seconds)))

    policy = StorePolicy(max_bytes=1 << 20)
    clock = Clock()
    clock.now = 40 * 86400.0
    store = HistoryStore(tmp_path, policy, clock=clock)
    url = "http://fake:8000"
    day = 86400.0
    store.write_rows(url, 3, [noisy(clock.now - 29 * day + i * 1800) for i in range(600)])  # ~12 days
    store.write_rows(url, 1, [noisy(clock.now - 3600 + i * 15) for i in range(200)])
    conn = _maintained_within_cap(store, policy)
    (kept_1,) = conn.execute("SELECT sum(num_rows) FROM chunks WHERE tier = 1").fetchone()
    oldest_3, kept_3 = conn.execute("SELECT min(start_ts), sum(num_rows) FROM chunks WHERE tier = 3").fetchone()
    assert kept_1 == 200  # the finer tier untouched
    assert 0 < kept_3 < 600 and oldest_3 > clock.now - 29 * day  # the oldest coarse rows went
    conn.close()
    store.close()


def test_a_crash_rebuild_writes_each_aggregate_once(tmp_path: Path) -> None:
    """900 scrapes a second apart, the writer stopped as a kill would, reopened: the 10 s tier holds
    the first scrape and one row per interval (ts 9, 19, …, 899): 91 distinct rows, not the open
    intervals written twice. (A sceptic's mutation of the rebuild passed the ≥ 90 check.)"""
    from diagnostics.core.store import StorePolicy, Tier
    from diagnostics.sources.store import HistoryStore
    from tests.unit import synth
    from tests.unit.test_collector import Clock

    policy = StorePolicy(tiers=(Tier(0.0, 1200.0, 60.0), Tier(10.0, 7200.0, 600.0), Tier(60.0, 86400.0, 3600.0)),
                         batch_seconds=1.0)
    clock = Clock()
    start, url = clock.now, "http://fake:8000"
    first = HistoryStore(tmp_path, policy, clock=clock)
    for t in range(900):
        clock.now = start + t
        first.record(url, synth.scrape(clock.now, gen=10.0 * t))
    assert first.flush()
    first._writable = False
    first._lock_file.close()
    HistoryStore(tmp_path, policy, clock=clock).close()
    reader = HistoryStore(tmp_path, policy, write=False)
    ts = [row.ts for row in reader._rows(reader._conn(), 1, 1, None, None)]
    assert len(ts) == len(set(ts)) == 91


def test_a_store_file_its_writer_has_not_given_tables_yet_is_not_yet_there_not_a_failure(tmp_path: Path) -> None:
    """A reader that opens the file in the moment between its writer creating it and creating its
    tables (a collector starting beside a dashboard) hears "does not exist yet", as before the file
    existed, with no message on its state; once the writer has made it a store, the same reader reads."""
    (tmp_path / FILE_NAME).touch()  # what sqlite3.connect leaves before the schema is written
    reader = HistoryStore(tmp_path, write=False)
    with pytest.raises(StoreError, match="does not exist yet"):
        reader.targets()
    assert reader.state.message is None
    scrapes = read_recording(HERE / RECORDINGS[0]).scrapes()[:3]
    writer = HistoryStore(tmp_path, clock=lambda: scrapes[-1].ts)
    for scrape in scrapes:
        writer.record("http://a:8000", scrape)
    writer.close()
    assert reader.targets() == ["http://a:8000"]
    assert reader.state.message is None


def test_flush_says_when_it_gave_up_and_what_was_queued_is_written_once_the_writer_gets_there(tmp_path: Path) -> None:
    """Issue 42: a writer held by another process's exclusive lock (busy timeout 2 s) does not answer a
    0.1 s flush: flush says so (False) instead of returning as if done. The lock released, the next flush
    answers and every row queued is in the store; a store opened read-only has no writer to flush."""
    clock = Clock()
    url = "http://fake:8000"
    store = HistoryStore(tmp_path, _small_policy(), clock=clock, busy_timeout_seconds=2.0, monotonic=lambda: 0.0)
    store.record(url, synth.scrape(clock.now, gen=0.0))
    assert store.flush()
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    for t in range(1, 4):
        store.record(url, synth.scrape(clock.now + t, gen=float(t)))
    assert store.flush(timeout=0.1) is False  # the writer waits on the lock
    holder.execute("ROLLBACK")
    holder.close()
    assert store.flush()
    if store.state.writable:
        assert len(store.read(url, clock.now - 1, clock.now + 10).rows) == 4
    else:  # the lock outlasted the busy timeout: the store says so rather than pretending
        assert "locked" in (store.state.message or "")
    store.close()
    assert HistoryStore(tmp_path, _small_policy(), clock=clock, write=False).flush() is False


def test_a_range_carries_the_server_info_stored_last_before_its_end(tmp_path: Path) -> None:
    """Issue 42: the server was upgraded at second 50 (its info stored then); a range ending at 30 shows the
    version it ran then, one ending at 70 the new one, and a range before any info the first one stored."""
    clock = Clock()
    url = "http://fake:8000"
    store = HistoryStore(tmp_path, _small_policy(), clock=clock, monotonic=lambda: 0.0)
    for t in range(80):
        info = {"version": "0.31.0"} if t == 5 else {"version": "0.32.0"} if t == 50 else None
        store.record(url, synth.scrape(clock.now + t, gen=float(t)), info=info)
    assert store.flush()
    assert store.read(url, clock.now, clock.now + 30).info == {"version": "0.31.0"}
    assert store.read(url, clock.now, clock.now + 70).info == {"version": "0.32.0"}
    assert store.read(url, clock.now, clock.now + 2).info == {"version": "0.31.0"}  # before any: the first
    store.close()


def test_a_read_over_the_row_cap_is_aggregated_to_it(tmp_path: Path) -> None:
    """Issue 42: 80 rows asked with a cap of 20 come back as at most 20 (4 s aggregates), over the same span."""
    clock = Clock()
    url = "http://fake:8000"
    store = HistoryStore(tmp_path, _small_policy(), clock=clock, monotonic=lambda: 0.0)
    for t in range(80):
        store.record(url, synth.scrape(clock.now + t, gen=float(t)))
    assert store.flush()
    whole = store.read(url, clock.now, clock.now + 79)
    capped = store.read(url, clock.now, clock.now + 79, max_rows=20)
    assert len(whole.rows) == 80 and 0 < len(capped.rows) <= 20
    assert capped.rows[0].ts >= clock.now and capped.rows[-1].ts <= clock.now + 79
    store.close()


def test_a_range_from_the_raw_tiers_retention_edge_is_read_at_full_resolution(tmp_path: Path) -> None:
    """Issue 42: retention drops whole chunks, so the raw tier's oldest row can sit up to one chunk (60 s
    here) after the start of "the last 20 minutes" while the 10 s aggregates reach further back. A read
    from 50 s before the raw tier's oldest row still comes from it, every scrape; from 70 s before, more
    than a chunk is missing, and the aggregates that hold it answer."""
    from diagnostics.core.store import Row

    clock = Clock()
    t0 = 3600.0  # on a chunk bound of every tier
    clock.now = t0 + 1000
    url = "http://fake:8000"
    store = HistoryStore(tmp_path, _small_policy(), clock=clock, monotonic=lambda: 0.0)
    store.write_rows(url, 1, [Row(synth.scrape(t0 + t, gen=float(t))) for t in range(0, 1000, 10)])
    store.write_rows(url, 0, [Row(synth.scrape(t0 + t, gen=float(t))) for t in range(100, 1000)])
    near = store.read(url, t0 + 50, t0 + 999)
    assert near.tier == 0 and len(near.rows) == 900 and near.rows[0].ts == t0 + 100
    far = store.read(url, t0 + 30, t0 + 999)
    assert far.tier == 1 and far.rows[0].ts == t0 + 30
    store.close()


def test_past_the_size_cap_the_kept_metrics_text_goes_before_any_number(tmp_path: Path) -> None:
    """Issue 42: the /metrics texts kept around outages are a convenience; the numbers are the history.
    1.5 MB of kept text over two hours and ~0.3 MB of 15 s aggregates under a 1 MiB cap: the oldest
    texts go, an hour at a time, and every aggregate stays."""
    import os

    from diagnostics.core.store import Row

    clock = Clock()
    clock.now = 10 * 86400.0
    policy = StorePolicy(max_bytes=1 << 20)
    store = HistoryStore(tmp_path, policy, clock=clock, monotonic=lambda: 0.0)
    url = "http://fake:8000"
    texts = tuple((clock.now - 7200 + i * 72, os.urandom(15_000)) for i in range(100))  # do not compress
    store.record_raw(url, texts)
    store.write_rows(url, 1, [Row(synth.scrape(clock.now - 3600 + i * 15, gen=float(i), usage=(i % 7) / 7))
                              for i in range(240)])
    conn = _maintained_within_cap(store, policy)
    assert conn.execute("SELECT sum(num_rows) FROM chunks WHERE tier = 1").fetchone()[0] == 240
    kept = [ts for (ts,) in conn.execute("SELECT ts FROM raw ORDER BY ts")]
    assert 0 < len(kept) < 100 and kept[-1] == texts[-1][0]  # the newest texts stay
    assert kept[0] > texts[0][0] + 3600  # the whole oldest hour went first
    conn.close()
    store.close()


def test_a_read_over_the_row_cap_even_in_the_coarsest_tier_is_aggregated_to_it(tmp_path: Path) -> None:
    """Issue 42: two hours of 1 min aggregates (the coarsest tier here) asked for with a cap of 5 come back
    as at most 5 rows over the same span, with the same token increase: no tier meets the cap, so the read
    aggregates what the coarsest one holds."""
    from diagnostics.core.store import Row

    clock = Clock()
    t0 = 7200.0
    clock.now = t0 + 7200
    url = "http://fake:8000"
    store = HistoryStore(tmp_path, _small_policy(), clock=clock, monotonic=lambda: 0.0)
    rows = [Row(synth.scrape(t0 + 60 * i, gen=100.0 * i)) for i in range(120)]
    store.write_rows(url, 2, rows)
    got = store.read(url, t0, t0 + 7140, max_rows=5)
    assert got.tier == 2 and 0 < len(got.rows) <= 5
    history = [r.scrape for r in got.rows]
    assert counter_increase(history, "generation_tokens") == (100.0 * 119, 7140.0)
    store.close()
