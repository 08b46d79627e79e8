"""The embedded history store: one SQLite file (WAL) per data directory, written off the scrape path.

The collector hands each scrape to :meth:`HistoryStore.record` (a bounded queue, never blocking); a
writer thread commits what came in every ``batch_seconds`` as one chunk per target (so a killed
process loses at most that batch), feeds the coarser tiers' aggregates
(:mod:`diagnostics.core.store.downsample`) and writes each of their chunks when its span is over,
prunes each tier at its retention and, past the size cap, the oldest chunks of the coarsest tier
first. A coarse tier's open chunk lives in memory and is rebuilt from the finer tier on open.

Only one process writes a data directory (an advisory lock beside the file); another dashboard on
the same directory reads it. A database that is locked, full or corrupt turns history read-only with
a message (:attr:`HistoryStore.state`); the collector goes on collecting either way.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnostics.core.metrics.catalog import Layout
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import ServerInfo, TargetStatus
from diagnostics.core.store import (
    DEFAULT_POLICY,
    Downsampler,
    Row,
    StorePolicy,
    decode_chunk,
    downsample,
    downsample_within,
    encode_chunk,
)
from diagnostics.core.store.codec import exposition, layout_from_json, layout_to_json
from diagnostics.errors import DiagnosticsError
from diagnostics.recording import Record

FILE_NAME = "history.sqlite"
APP_DIR = "vllm-triage"
DATA_DIR_ENV = "VLLM_TRIAGE_DATA_DIR"
QUEUE_MAX = 20_000
RETRY_SECONDS = 60.0
MAINTAIN_SECONDS = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS targets (id INTEGER PRIMARY KEY, url TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS layouts (id INTEGER PRIMARY KEY, body TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS chunks (
    target INTEGER NOT NULL, tier INTEGER NOT NULL, start_ts REAL NOT NULL, end_ts REAL NOT NULL,
    num_rows INTEGER NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_by_time ON chunks (target, tier, end_ts);
CREATE TABLE IF NOT EXISTS infos (target INTEGER NOT NULL, ts REAL NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS raw (target INTEGER NOT NULL, ts REAL NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS raw_by_time ON raw (target, ts);
"""
RAW_RETENTION_SECONDS = 30 * 86400.0  # the /metrics text kept around outages (see Collector)


@dataclass(frozen=True, slots=True)
class _Item:
    url: str
    row: Row | None = None
    info: Mapping[str, Any] | None = None
    raw: tuple[tuple[float, bytes], ...] = ()
    flush: bool = False


class StoreError(DiagnosticsError):
    """The history store cannot be opened or read (corrupt, not a database, unreadable)."""


def default_data_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """Where history goes unless ``--data-dir`` says otherwise: ``$VLLM_TRIAGE_DATA_DIR`` (``off``:
    nowhere), else ``$XDG_STATE_HOME/vllm-triage``, else ``~/.local/state/vllm-triage``."""
    env = os.environ if env is None else env
    named = env.get(DATA_DIR_ENV)
    if named is not None:
        return None if named.strip().lower() in ("", "off", "none", "0") else Path(named).expanduser()
    state = env.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / APP_DIR


@dataclass(frozen=True, slots=True)
class StoreState:
    """Whether this process writes the store, and if not, why (for people)."""

    path: Path
    writable: bool
    message: str | None = None
    num_dropped: int = 0


@dataclass(slots=True)
class _Target:
    id: int
    pending: list[Row] = field(default_factory=list)
    samplers: list[Downsampler] = field(default_factory=list)
    open_rows: list[list[Row]] = field(default_factory=list)  # per coarse tier: aggregates not yet written
    span_rows: list[Row] = field(default_factory=list)  # the raw tier's current chunk span, written in batches
    raw: list[tuple[float, bytes]] = field(default_factory=list)  # /metrics texts to keep, not yet written


def _kind(exc: sqlite3.Error) -> str:
    return getattr(exc, "sqlite_errorname", "") or type(exc).__name__


def describe_error(path: Path, exc: sqlite3.Error | OSError) -> str:
    """A store failure in words, with what happens next."""
    if isinstance(exc, OSError):
        return f"history store {path} cannot be used ({exc.strerror or exc}): history is read-only; live collection goes on"
    name = _kind(exc)
    if name in ("SQLITE_BUSY", "SQLITE_LOCKED"):
        why = "is locked by another process"
    elif name == "SQLITE_FULL":
        why = "is full (the disk or its size limit)"
    elif name in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        why = "is corrupt (move it aside to start a new one)"
    elif name == "SQLITE_READONLY":
        why = "cannot be written (read-only file or directory)"
    else:
        why = f"failed ({name}: {exc})"
    return f"history store {path} {why}: history is read-only; live collection goes on"


class HistoryStore:
    """One data directory's store: the writer (when this process holds the directory) and the reads."""

    def __init__(self, data_dir: str | Path, policy: StorePolicy = DEFAULT_POLICY, *, write: bool = True,
                 clock: Callable[[], float] = time.time, busy_timeout_seconds: float = 2.0,
                 hard_limit_bytes: int | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``hard_limit_bytes`` stands for the disk's own limit (tests fill it); the policy's
        ``max_bytes`` is what pruning keeps to. ``monotonic`` is the writer's own clock, which decides
        when a batch is committed without a flush (``policy.batch_seconds``); a test that stalls it
        commits only on :meth:`flush`."""
        problems = policy.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.policy = policy
        self.dir = Path(data_dir)
        self.path = self.dir / FILE_NAME
        self._clock = clock
        self._monotonic = monotonic
        self._timeout = busy_timeout_seconds
        self._hard_limit = hard_limit_bytes
        self._write_lock = threading.Lock()  # one transaction at a time on the writer connection
        self._lock = threading.RLock()  # guards the read connection and the caches
        self._layouts: dict[int, tuple[Layout, int]] = {}  # id(layout) → (layout, row id)
        self._layout_rows: dict[int, Layout] = {}
        self._queue: queue.Queue[_Item | None] = queue.Queue(QUEUE_MAX)
        self._num_dropped = 0
        self._message: str | None = None
        self._writable = False
        self._retry_at: float | None = None
        self._lock_file: Any = None
        self._writer: sqlite3.Connection | None = None
        self._targets: dict[str, _Target] = {}
        self._thread: threading.Thread | None = None
        self._flushed = threading.Condition()
        self._num_flushes = 0
        self._last_maintain = 0.0
        self.writer_cpu_seconds = 0.0  # the writer thread's own CPU time (bench/store.py reads it)
        self.num_written = 0
        self._reader: sqlite3.Connection | None = None
        self._unborn = False  # the file exists without the tables: its writer is creating it
        if write:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self._message = describe_error(self.path, exc)
                return
        if write:
            self._open_writer()
        self._open_reader()

    # -- opening ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False)
        return conn

    def _open_writer(self) -> None:
        try:
            handle = open(self.dir / (FILE_NAME + ".lock"), "a+")
        except OSError as exc:
            self._message = describe_error(self.path, exc)
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            self._message = (f"history store {self.path} is written by {holder}: this process reads it "
                             "(its own scrapes are not stored)")
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}")
        handle.flush()
        self._lock_file = handle
        try:
            conn = self._connect()
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('format', '1')")
            if self._hard_limit is not None:
                page = conn.execute("PRAGMA page_size").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count={max(1, self._hard_limit // page)}")
        except sqlite3.Error as exc:
            self._message = describe_error(self.path, exc)
            if _kind(exc) in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or isinstance(exc, sqlite3.DatabaseError) and \
                    "quick_check" in str(exc):
                self._message = f"history store {self.path} is corrupt ({exc}): history is off; " \
                                "move the file aside to start a new one; live collection goes on"
            return
        self._writer = conn
        self._writable = True
        self._message = None
        self._rebuild_open_chunks()
        self._thread = threading.Thread(target=self._run, name=f"history store {self.path}", daemon=True)
        self._thread.start()

    def _open_reader(self) -> None:
        self._unborn = False
        if not self.path.exists():
            return
        try:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=self._timeout,
                                   isolation_level=None, check_same_thread=False)
            if conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'chunks'").fetchone()[0] == 0:
                # The file is there but its writer has not created the tables yet (or it is not a
                # store yet): nothing to read, no failure; asked again on the next read.
                conn.close()
                self._unborn = True
                return
            conn.execute("SELECT count(*) FROM chunks").fetchone()
        except sqlite3.Error as exc:
            if self._message is None:
                self._message = describe_error(self.path, exc)
            return
        self._reader = conn

    @property
    def state(self) -> StoreState:
        return StoreState(self.path, self._writable, self._message, self._num_dropped)

    # -- writing ---------------------------------------------------------------------------

    def record(self, target: str, scrape: Scrape, gpus: GpuReading | None = None,
               info: Mapping[str, Any] | None = None, raw: bytes | None = None) -> None:
        """Queue one scrape of ``target`` (never blocks; dropped, and counted, when the writer is far
        behind or history is read-only); ``raw``: its ``/metrics`` text, zlib-compressed, to keep too."""
        self._put(_Item(target, Row(scrape, gpus), info, ((scrape.ts, raw),) if raw is not None else ()))

    def record_raw(self, target: str, texts: tuple[tuple[float, bytes], ...]) -> None:
        """Queue ``/metrics`` texts (time, zlib-compressed text) already taken, to keep beside the
        numbers (the minutes before an outage)."""
        if texts:
            self._put(_Item(target, raw=texts))

    def _put(self, item: _Item) -> None:
        if not self._writable:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._num_dropped += 1

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the writer has taken everything queued so far (committed it, or failed and said so in
        :attr:`state`): True; False when there is no writer, or it did not get there within ``timeout``
        (tests, clean shutdown)."""
        if self._thread is None or not self._thread.is_alive():
            return False
        with self._flushed:
            target = self._num_flushes + 1
            self._queue.put(_Item("", flush=True))
            return self._flushed.wait_for(lambda: self._num_flushes >= target, timeout)

    def close(self) -> None:
        """Commit what is queued, write the coarse tiers' open chunks, and let go of the directory."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(30)
        for conn in (self._writer, self._reader):
            if conn is not None:
                conn.close()
        self._writer = self._reader = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
        self._writable = False

    def _run(self) -> None:
        batch = self.policy.batch_seconds
        now = self._monotonic
        deadline = now() + batch
        stopping = False
        while not stopping:
            flush_now = False
            item: _Item | None
            try:
                item = self._queue.get(timeout=min(batch, max(0.01, deadline - now())))
            except queue.Empty:
                item = _Item("")
            began = time.thread_time()
            if item is None:
                stopping = flush_now = True
            elif item.flush:
                flush_now = True
            elif item.row is not None or item.raw:
                self._take(item)
            if flush_now or now() >= deadline:
                self._commit(final=stopping)
                deadline = now() + batch
            self.writer_cpu_seconds += time.thread_time() - began
            if flush_now:
                with self._flushed:
                    self._num_flushes += 1
                    self._flushed.notify_all()

    def _take(self, item: _Item) -> None:
        if not self._writable:
            return
        try:
            target = self._target(item.url)
            if item.info is not None and item.row is not None:
                assert self._writer is not None
                self._writer.execute("INSERT INTO infos VALUES (?, ?, ?)",
                                     (target.id, item.row.ts, json.dumps(dict(item.info))))
        except sqlite3.Error as exc:
            self._fail(exc)
            return
        if item.row is not None:
            target.pending.append(item.row)
        target.raw.extend(item.raw)

    def _target(self, url: str) -> _Target:
        found = self._targets.get(url)
        if found is None:
            assert self._writer is not None
            self._writer.execute("INSERT OR IGNORE INTO targets (url) VALUES (?)", (url,))
            (tid,) = self._writer.execute("SELECT id FROM targets WHERE url = ?", (url,)).fetchone()
            found = self._targets[url] = _Target(tid, [], [Downsampler(t.interval_seconds) for t in self.policy.tiers[1:]],
                                                [[] for _ in self.policy.tiers[1:]])
        return found

    def _layout_id(self, layout: Layout) -> int:
        with self._lock:
            known = self._layouts.get(id(layout))
            if known is not None and known[0] is layout:
                return known[1]
        body = layout_to_json(layout)
        assert self._writer is not None
        self._writer.execute("INSERT OR IGNORE INTO layouts (body) VALUES (?)", (body,))
        (lid,) = self._writer.execute("SELECT id FROM layouts WHERE body = ?", (body,)).fetchone()
        with self._lock:
            self._layouts[id(layout)] = (layout, lid)
            self._layout_rows[lid] = layout
        return int(lid)

    def _write_chunk(self, target: _Target, tier: int, rows: list[Row], level: int = 6) -> None:
        if not rows:
            return
        assert self._writer is not None
        body = encode_chunk(rows, self._layout_id, level)
        self._writer.execute("INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?)",
                             (target.id, tier, rows[0].ts, rows[-1].ts, len(rows), body))

    def _write_raw(self, target: _Target, rows: list[Row]) -> None:
        """A batch as its own small chunk (what a kill may cost is one batch); when a chunk span is
        over, its batches are replaced by one chunk of the whole span (compressed far better)."""
        if not rows:
            return
        span = self.policy.tiers[0].chunk_seconds
        assert self._writer is not None
        current = target.span_rows
        if current and int(rows[-1].ts // span) != int(current[0].ts // span):
            first_span = int(current[0].ts // span)
            done = current + [r for r in rows if int(r.ts // span) == first_span]
            later = [r for r in rows if int(r.ts // span) != first_span]
            self._writer.execute("DELETE FROM chunks WHERE target = ? AND tier = 0 AND start_ts >= ? AND end_ts <= ?",
                                 (target.id, done[0].ts, done[-1].ts))
            self._write_chunk(target, 0, done)
            self._write_chunk(target, 0, later, level=1)
            target.span_rows = later
        else:
            self._write_chunk(target, 0, rows, level=1)  # rewritten whole when its span is over
            current.extend(rows)

    def write_rows(self, url: str, tier: int, rows: list[Row]) -> None:
        """Write rows straight into a tier, one chunk per chunk span (importing history that was
        aggregated elsewhere: ``bench/store.py`` builds 30 days so). Synchronous."""
        if self._writer is None:
            raise StoreError(self._message or f"history store {self.path} is not written by this process")
        span = self.policy.tiers[tier].chunk_seconds
        with self._write_lock:
            target = self._target(url)
            self._writer.execute("BEGIN IMMEDIATE")
            chunk: list[Row] = []
            for row in rows:
                if chunk and int(row.ts // span) != int(chunk[0].ts // span):
                    self._write_chunk(target, tier, chunk)
                    chunk = []
                chunk.append(row)
            self._write_chunk(target, tier, chunk)
            self._writer.execute("COMMIT")

    def _feed(self, target: _Target, rows: list[Row], final: bool) -> None:
        """Push rows through the coarse tiers, writing each chunk whose span is over."""
        for k, tier in enumerate(self.policy.tiers[1:]):
            sampler = target.samplers[k]
            emitted: list[Row] = []
            for row in rows:
                emitted.extend(sampler.push(row))
            if final:
                emitted.extend(sampler.flush())
            open_rows = target.open_rows[k]
            open_rows.extend(emitted)
            span = tier.chunk_seconds
            while open_rows and (final or int(open_rows[0].ts // span) != int(open_rows[-1].ts // span)):
                first_span = int(open_rows[0].ts // span)
                cut = next((i for i, r in enumerate(open_rows) if int(r.ts // span) != first_span), len(open_rows))
                self._write_chunk(target, k + 1, open_rows[:cut])
                del open_rows[:cut]
            rows = emitted

    def _commit(self, final: bool = False) -> None:
        if not self._writable:
            if self._retry_at is not None and self._clock() >= self._retry_at and self._writer is not None:
                self._retry_at = None
                self._writable, self._message = True, None
            else:
                return
        assert self._writer is not None
        try:
            self._write_lock.acquire()
            self._writer.execute("BEGIN IMMEDIATE")
            for target in self._targets.values():
                rows, target.pending = target.pending, []
                texts, target.raw = target.raw, []
                if texts:
                    self._writer.execute("DELETE FROM raw WHERE target = ? AND ts >= ? AND ts <= ?",
                                         (target.id, min(t for t, _ in texts), max(t for t, _ in texts)))
                    self._writer.executemany("INSERT INTO raw VALUES (?, ?, ?)",
                                             [(target.id, ts, body) for ts, body in texts])
                self._write_raw(target, rows)
                self.num_written += len(rows)
                self._feed(target, rows, final)
            self._writer.execute("COMMIT")
            if final or self._clock() - self._last_maintain >= MAINTAIN_SECONDS:
                self._maintain()
            if final:
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            try:
                self._writer.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            self._fail(exc)
        finally:
            self._write_lock.release()

    def _fail(self, exc: sqlite3.Error) -> None:
        self._writable = False
        self._message = describe_error(self.path, exc)
        for target in self._targets.values():
            target.pending.clear()
            target.raw.clear()
        # Locked or full may pass (the other process lets go, pruning or an operator frees space).
        if _kind(exc) in ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR"):
            self._retry_at = self._clock() + RETRY_SECONDS
        kept: list[_Item | None] = []
        while True:  # the scrapes queued cannot be written now; a flush or the close still has to be seen
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None or item.flush:
                kept.append(item)
        for item in kept:
            self._queue.put(item)

    def _maintain(self) -> None:
        """Drop what aged out of each tier, then prune to the size cap (coarsest, oldest first)."""
        assert self._writer is not None
        now = self._clock()
        self._last_maintain = now
        conn = self._writer
        for k, tier in enumerate(self.policy.tiers):
            conn.execute("DELETE FROM chunks WHERE tier = ? AND end_ts < ?", (k, now - tier.retention_seconds))
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        while self._used_bytes(conn, page) > self.policy.max_bytes:  # the kept text goes first
            oldest = conn.execute("SELECT min(ts) FROM raw").fetchone()[0]
            if oldest is None:
                break
            conn.execute("DELETE FROM raw WHERE ts <= ?", (oldest + 3600,))
        for k in reversed(range(len(self.policy.tiers))):
            while self._used_bytes(conn, page) > self.policy.max_bytes:
                oldest = conn.execute("SELECT min(end_ts) FROM chunks WHERE tier = ?", (k,)).fetchone()[0]
                if oldest is None:
                    break
                conn.execute("DELETE FROM chunks WHERE tier = ? AND end_ts <= ?", (k, oldest))
        conn.execute("DELETE FROM infos WHERE ts < ?", (now - self.policy.retention_seconds,))
        conn.execute("DELETE FROM raw WHERE ts < ?", (now - min(RAW_RETENTION_SECONDS, self.policy.retention_seconds),))

    @staticmethod
    def _used_bytes(conn: sqlite3.Connection, page: int) -> int:
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int((count - free) * page)

    def _rebuild_open_chunks(self) -> None:
        """After a restart: the coarse tiers' open chunks again, from the finer tiers' rows."""
        assert self._writer is not None
        for (url,) in self._writer.execute("SELECT url FROM targets").fetchall():
            target = self._target(url)
            tiers = self.policy.tiers
            last_raw = self._last_end(self._writer, target.id, 0)
            if last_raw is not None:
                # The raw tier's last span, batch by batch: rewritten whole when the span is over.
                span = tiers[0].chunk_seconds
                target.span_rows = self._rows(self._writer, target.id, 0, (last_raw // span) * span, None)
            ends = [self._last_end(self._writer, target.id, k) for k in range(len(tiers))]
            feed = self._rows(self._writer, target.id, 0, ends[1] if len(tiers) > 1 else None, None, exclusive=True)
            for k in range(1, len(tiers)):
                sampler = target.samplers[k - 1]
                if ends[k] is not None:
                    sampler.last_ts = ends[k]
                emitted: list[Row] = []
                for row in feed:
                    emitted.extend(sampler.push(row))
                target.open_rows[k - 1] = emitted
                if k + 1 < len(tiers):
                    feed = [r for r in self._rows(self._writer, target.id, k, ends[k + 1], None, exclusive=True)]
                    feed += emitted
            # The rows are aggregated again; the open chunks are written as their spans end.

    # -- reading ---------------------------------------------------------------------------

    def _layout(self, conn: sqlite3.Connection, lid: int) -> Layout:
        with self._lock:
            found = self._layout_rows.get(lid)
        if found is None:
            row = conn.execute("SELECT body FROM layouts WHERE id = ?", (lid,)).fetchone()
            if row is None:
                raise StoreError(f"history store {self.path}: layout {lid} is missing")
            found = layout_from_json(row[0])
            with self._lock:
                self._layout_rows[lid] = found
                self._layouts[id(found)] = (found, lid)
        return found

    @staticmethod
    def _last_end(conn: sqlite3.Connection, tid: int, tier: int) -> float | None:
        row = conn.execute("SELECT max(end_ts) FROM chunks WHERE target = ? AND tier = ?", (tid, tier)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def _rows(self, conn: sqlite3.Connection, tid: int, tier: int, start: float | None, end: float | None,
              exclusive: bool = False) -> list[Row]:
        lo = float("-inf") if start is None else start
        hi = float("inf") if end is None else end
        out: list[Row] = []
        for (body,) in conn.execute(
            "SELECT body FROM chunks WHERE target = ? AND tier = ? AND end_ts >= ? AND start_ts <= ? "
            "ORDER BY start_ts", (tid, tier, lo, hi)
        ):
            try:
                rows = decode_chunk(body, lambda lid: self._layout(conn, lid))
            except ValueError as exc:
                raise StoreError(f"history store {self.path}: {exc}") from None
            out.extend(r for r in rows if (lo < r.ts if exclusive else lo <= r.ts) and r.ts <= hi)
        out.sort(key=lambda r: r.ts)
        return out

    def _conn(self) -> sqlite3.Connection:
        if self._reader is None:
            self._open_reader()
        if self._reader is None:
            if not self.path.exists() or self._unborn:
                raise StoreError(f"history store {self.path} does not exist yet")
            raise StoreError(self._message or f"history store {self.path} cannot be opened")
        return self._reader

    def targets(self) -> list[str]:
        """The targets the store holds history of."""
        with self._lock:
            conn = self._conn()
            return [u for (u,) in conn.execute("SELECT url FROM targets ORDER BY id")]

    def extent(self, url: str) -> tuple[float, float] | None:
        """The oldest and newest time stored for ``url`` (None: nothing)."""
        with self._lock:
            conn = self._conn()
            row = conn.execute("SELECT min(c.start_ts), max(c.end_ts) FROM chunks c JOIN targets t ON t.id = c.target "
                               "WHERE t.url = ?", (url,)).fetchone()
        return None if row is None or row[0] is None else (float(row[0]), float(row[1]))

    def read(self, url: str, start: float, end: float, max_rows: int | None = None) -> StoredRange:
        """``url``'s rows from ``start`` to ``end``: from the finest tier that reaches back to
        ``start`` within ``max_rows`` (the policy's by default), each coarse tier's unwritten tail
        aggregated from the finer tier, and aggregated further if still over ``max_rows``."""
        limit = max_rows or self.policy.max_read_rows
        try:
            with self._lock:
                conn = self._conn()
                found = conn.execute("SELECT id FROM targets WHERE url = ?", (url,)).fetchone()
                if found is None:
                    return StoredRange(url, start, end, [], None, 0)
                tid = found[0]
                tier = self._choose(conn, tid, start, end, limit)
                rows = self._tier_rows(conn, tid, tier, start, end)
                info = conn.execute("SELECT body FROM infos WHERE target = ? AND ts <= ? ORDER BY ts DESC LIMIT 1",
                                    (tid, end)).fetchone() or conn.execute(
                    "SELECT body FROM infos WHERE target = ? ORDER BY ts LIMIT 1", (tid,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"history store {self.path} cannot be read ({_kind(exc)}: {exc})") from None
        if len(rows) > limit:
            rows = downsample_within(rows, end - start, limit)
        return StoredRange(url, start, end, rows, json.loads(info[0]) if info else None, tier)

    def texts(self, url: str, start: float, end: float) -> dict[float, str]:
        """The ``/metrics`` texts kept of ``url`` from ``start`` to ``end``, by scrape time."""
        try:
            with self._lock:
                conn = self._conn()
                found = conn.execute("SELECT id FROM targets WHERE url = ?", (url,)).fetchone()
                if found is None:
                    return {}
                got = conn.execute("SELECT ts, body FROM raw WHERE target = ? AND ts >= ? AND ts <= ? ORDER BY ts",
                                   (found[0], start, end)).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"history store {self.path} cannot be read ({_kind(exc)}: {exc})") from None
        return {float(ts): zlib.decompress(body).decode("utf-8") for ts, body in got}

    def _choose(self, conn: sqlite3.Connection, tid: int, start: float, end: float, limit: int) -> int:
        tiers = self.policy.tiers
        for k, tier in enumerate(tiers):
            row = conn.execute("SELECT min(start_ts), coalesce(sum(num_rows), 0) FROM chunks WHERE target = ? AND "
                               "tier = ? AND end_ts >= ? AND start_ts <= ?", (tid, k, start, end)).fetchone()
            oldest, count = row
            if k and tier.interval_seconds:
                count = max(count, (end - start) / tier.interval_seconds)
            reaches = oldest is not None and oldest <= start + max(tier.interval_seconds, tier.chunk_seconds)
            coarser = conn.execute("SELECT min(start_ts) FROM chunks WHERE target = ? AND tier > ?", (tid, k)).fetchone()
            nothing_older = coarser[0] is None or (oldest is not None and oldest <= coarser[0])
            if count <= limit and (reaches or nothing_older):
                return k
        return len(tiers) - 1

    def _tier_rows(self, conn: sqlite3.Connection, tid: int, tier: int, start: float, end: float) -> list[Row]:
        rows = self._rows(conn, tid, tier, start, end)
        if tier == 0:
            return rows
        last = self._last_end(conn, tid, tier)
        if last is None or last < end:
            tail_from = start if last is None else max(start, last)
            tail = [r for r in self._tier_rows(conn, tid, tier - 1, tail_from, end) if r.ts > tail_from]
            rows += downsample(tail, self.policy.tiers[tier].interval_seconds)
        return rows


@dataclass(frozen=True, slots=True)
class StoredRange:
    """What a range read returned: the rows, the server info stored last before its end, the tier."""

    target: str
    start: float
    end: float
    rows: list[Row]
    info: dict[str, Any] | None
    tier: int


class StoredTarget:
    """A target's history over a range, read from the store, with the reader side of a collector
    (``history``, ``status``, ``gpu_history``, ``recent_records``): the pages and the CLI take it
    where they take a collector or a Prometheus-backed instance. ``end`` None: the range ends now
    and is read again at most every ``refresh_seconds``."""

    def __init__(self, store: HistoryStore, url: str, *, range_s: float, end: float | None = None,
                 refresh_seconds: float = 2.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.url = url
        self.range_s = range_s
        self.end = end
        self.target = f"{url} (history store)"
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._read: StoredRange | None = None
        self._read_at: float | None = None
        self._error: str | None = None

    def refresh(self) -> StoredRange | None:
        end = self.end if self.end is not None else self._clock()
        self._read_at = self._clock()
        try:
            self._read = self.store.read(self.url, end - self.range_s, end)
            self._error = None
        except StoreError as exc:
            self._error = str(exc)
        return self._read

    def _rows(self) -> list[Row]:
        if self._read is None or (self.end is None and (self._read_at is None or
                                                        self._clock() - self._read_at >= self._refresh_seconds)):
            self.refresh()
        return self._read.rows if self._read is not None else []

    def history(self) -> list[Scrape]:
        return [r.scrape for r in self._rows()]

    def gpu_history(self) -> list[tuple[float, GpuReading]]:
        return [(r.ts, r.gpus) for r in self._rows() if r.gpus is not None]

    @property
    def info(self) -> ServerInfo | None:
        payload = self._read.info if self._read is not None else None
        return ServerInfo.from_json(payload.get("version"), payload.get("models")) if payload else None

    def recent_records(self, seconds: float | None = None) -> list[Record]:
        """The range (its last ``seconds``) as an ordinary recording's records."""
        rows = self._rows()
        if seconds is not None and rows:
            rows = [r for r in rows if r.ts >= rows[-1].ts - seconds]
        payload = self._read.info if self._read is not None else None
        texts: dict[float, str] = {}
        if rows:
            try:
                texts = self.store.texts(self.url, rows[0].ts, rows[-1].ts)
            except StoreError:
                texts = {}  # the numbers are there: written back as text
        out = []
        for i, row in enumerate(rows):
            s = row.scrape
            gpus = [d.to_json() for d in row.gpus.devices] if row.gpus is not None and row.gpus.devices else None
            source = row.gpus.source if row.gpus is not None and gpus else None
            info = payload if i == 0 else None
            if s.snapshot is None:
                out.append(Record(s.ts, self.url, error=s.error, error_kind=s.error_kind, info=info))
            else:
                text = texts.get(s.ts) if s.peak is None else None  # an aggregate is no scrape's text
                out.append(Record(s.ts, self.url, metrics=text if text is not None else exposition(s.snapshot),
                                  info=info, gpus=gpus, gpu_source=source))
        return out

    def status(self) -> TargetStatus:
        rows = self._rows()
        history = [r.scrape for r in rows]
        last = history[-1] if history else None
        ok = [s.ts for s in history if s.snapshot is not None]
        error = self._error or (last.error if last is not None else f"the history store has nothing of {self.url} "
                                "in this range")
        return TargetStatus(
            target=self.target,
            state="up" if last is not None and last.snapshot is not None and self._error is None else
            "stale" if self._error and history else "down",
            since=None,
            error=None if last is not None and last.snapshot is not None and self._error is None else error,
            last_ok_ts=ok[-1] if ok else None,
            last_attempt_ts=last.ts if last is not None else None,
            info=self.info,
            num_scrapes=len(history),
            num_failures=len(history) - len(ok),
        )
