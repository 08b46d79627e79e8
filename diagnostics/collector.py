"""One background collector per target per process, shared by every browser session and the CLI.

A plain daemon thread (it never calls Streamlit) scrapes ``/metrics`` once per interval, whatever
the number of readers, and keeps a bounded, timestamped history of :class:`Scrape` beside the
target's state (up / down since T / stale / not vLLM). A failure is recorded as an error scrape, so
a server that goes away and comes back keeps the history on both sides of the gap.
"""

from __future__ import annotations

import hashlib
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import ServerInfo, TargetState, TargetStatus
from diagnostics.core.targets import normalize_url
from diagnostics.errors import BadPayload, NotVllm, TargetError, TargetHTTPError
from diagnostics.recording import Record
from diagnostics.sources.dcgm_http import DcgmReader, split_gpu_metrics_url
from diagnostics.sources.store import HistoryStore, StoreError
from diagnostics.sources.vllm_http import VllmClient

MIN_INTERVAL_SECONDS = 0.25
DEFAULT_INTERVAL_SECONDS = 1.0
DEFAULT_RETENTION_SECONDS = 3600.0
DEFAULT_RAW_RETENTION_SECONDS = 900.0
INFO_REFRESH_SECONDS = 60.0
HEALTH_EVERY_SECONDS = 5.0
STALE_AFTER_INTERVALS = 3
RAW_AROUND_OUTAGE_SECONDS = 300.0  # the /metrics text the history store keeps before and after an outage

GpuReader = Callable[[], GpuReading]
Sink = Callable[[Record], None]


class Collector:
    """Scrapes one target on a fixed cadence and keeps what it saw."""

    def __init__(
        self,
        client: VllmClient,
        *,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        raw_retention_seconds: float = DEFAULT_RAW_RETENTION_SECONDS,
        gpu_reader: GpuReader | None = None,
        gpu_source: str | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        """``clock`` stamps the scrapes; ``monotonic`` and ``sleep`` pace the loop (a test injects
        fake ones to run intervals without waiting; ``sleep`` defaults to a wait that ``stop`` ends).
        ``gpu_reader`` reads GPU health beside each scrape (NVML, or a dcgm-exporter at the GPU metrics
        URL, named by ``gpu_source``)."""
        if interval_seconds < MIN_INTERVAL_SECONDS:
            raise ValueError(f"interval must be at least {MIN_INTERVAL_SECONDS} s")
        self.client = client
        self.target = client.base_url
        self.interval_seconds = interval_seconds
        self.retention_seconds = retention_seconds
        self._gpu_reader = gpu_reader
        self.gpu_source = gpu_source
        self._clock = clock
        self._history: deque[Scrape] = deque(maxlen=int(retention_seconds / interval_seconds) + 1)
        self._gpus: deque[tuple[float, GpuReading]] = deque(maxlen=self._history.maxlen)
        # The raw text of recent scrapes, compressed, for "save snapshot" (parsed history cannot
        # be turned back into a recording).
        self.raw_retention_seconds = min(raw_retention_seconds, retention_seconds)
        self._raw: deque[tuple[float, bytes | None, str | None, ErrorKind | None, GpuReading | None]] = deque()
        self._lock = threading.Lock()
        self._sinks: list[Sink] = []
        self.sink_errors: list[str] = []  # sinks dropped because they raised (see _emit)
        self._stop = threading.Event()
        self._monotonic = monotonic
        self._sleep = sleep or self._stop.wait
        self._thread: threading.Thread | None = None
        self._state: TargetState = "starting"
        self._since: float | None = None
        self._error: str | None = None
        self._last_ok: float | None = None
        self._last_attempt: float | None = None
        self._info: ServerInfo | None = None
        self._info_ts: float | None = None
        self._info_dirty = False
        self._info_error: str | None = None
        self._health_ts: float | None = None
        self._engine_dead: str | None = None
        self._num_scrapes = 0
        self._num_failures = 0
        self._store: HistoryStore | None = None
        self._store_info_dirty = False
        self._store_info_changed = False
        self._keep_raw_until = float("-inf")  # scrapes up to here also give the store their text

    # -- readers ---------------------------------------------------------------------------

    def history(self) -> list[Scrape]:
        """A copy of the retained scrapes, oldest first."""
        with self._lock:
            return list(self._history)

    def recent_records(self, seconds: float | None = None) -> list[Record]:
        """The last ``seconds`` of scrapes as recording records (the first one carries info)."""
        with self._lock:
            raw = list(self._raw)
            info = self._info_payload()
        if seconds is not None and raw:
            raw = [r for r in raw if r[0] >= raw[-1][0] - seconds]
        records = []
        for i, (ts, blob, error, kind, gpus) in enumerate(raw):
            metrics = zlib.decompress(blob).decode("utf-8") if blob is not None else None
            records.append(
                Record(ts, self.target, metrics=metrics, error=error, error_kind=kind, info=info if i == 0 else None,
                       gpus=_gpus_json(gpus), gpu_source=gpus.source if gpus is not None else None)
            )
        return records

    def gpu_history(self) -> list[tuple[float, GpuReading]]:
        with self._lock:
            return list(self._gpus)

    def use_gpu_reader(self, reader: GpuReader | None, source: str | None) -> None:
        """Read GPU health from ``reader`` from the next scrape on (a GPU metrics URL given after the
        collector started); the readings kept so far stay."""
        with self._lock:
            old, self._gpu_reader, self.gpu_source = self._gpu_reader, reader, source
        close = getattr(old, "close", None)
        if callable(close):
            close()  # the previous exporter's HTTP client

    def status(self) -> TargetStatus:
        """The target's state now; *stale* when the last good scrape is older than three intervals
        though no failure was seen (the collector itself is stuck or the scrape hangs)."""
        with self._lock:
            state = self._state
            since = self._since
            if state == "up" and self._last_ok is not None:
                age = self._clock() - self._last_ok
                if age > STALE_AFTER_INTERVALS * max(self.interval_seconds, self.client_timeout):
                    state, since = "stale", self._last_ok
            return TargetStatus(
                target=self.target,
                state=state,
                since=since,
                error=self._error,
                last_ok_ts=self._last_ok,
                last_attempt_ts=self._last_attempt,
                info=self._info,
                num_scrapes=self._num_scrapes,
                num_failures=self._num_failures,
                info_error=self._info_error,
            )

    @property
    def client_timeout(self) -> float:
        return self.client.timeout_seconds

    def add_sink(self, sink: Sink) -> None:
        """Call ``sink`` with each new record (the recording writer); the next record carries info."""
        with self._lock:
            self._sinks.append(sink)
            self._info_dirty = True

    def remove_sink(self, sink: Sink) -> None:
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    def use_store(self, store: HistoryStore, preload: bool = True) -> tuple[float, float] | None:
        """Write every scrape to ``store`` from now on (the writer batches them off this thread), and
        first, with ``preload``, take back what it holds of this target's last retention (a
        restarted dashboard shows the minutes before its restart). Returns how far back the store's
        history of this target goes (None: nothing yet)."""
        extent = None
        if preload:
            try:
                extent = store.extent(self.target)
                if extent is not None:
                    now = self._clock()
                    got = store.read(self.target, now - self.retention_seconds, now,
                                     max_rows=int(self.retention_seconds / self.interval_seconds) + 2)
                    with self._lock:
                        known = self._history[0].ts if self._history else float("inf")
                        older = [r for r in got.rows if r.ts < known]
                        self._history.extendleft(reversed([r.scrape for r in older]))
                        self._gpus.extendleft(reversed([(r.ts, r.gpus) for r in older if r.gpus is not None]))
                        if self._info is None and got.info is not None:
                            self._info = ServerInfo.from_json(got.info.get("version"), got.info.get("models"))
            except StoreError:
                extent = None  # the store says why in its state; collection goes on without it
        with self._lock:
            self._store = store
            self._store_info_dirty = True
        return extent

    @property
    def store(self) -> HistoryStore | None:
        return self._store

    def _to_store(self, scrape: Scrape, gpus: GpuReading | None, blob: bytes | None = None,
                  outage_began: bool = False) -> None:
        """Hand the scrape to the store; around an outage (from ``RAW_AROUND_OUTAGE_SECONDS`` before its
        first failure to as long after the recovery) with its ``/metrics`` text, so the incident can be
        taken back out as a recording of what the server said."""
        store = self._store
        if store is None:
            return
        with self._lock:
            info = self._info_payload() if self._store_info_dirty or self._store_info_changed else None
            if info is not None:
                self._store_info_dirty = self._store_info_changed = False
            before: tuple[tuple[float, bytes], ...] = ()
            if outage_began:
                self._keep_raw_until = float("inf")
                before = tuple((ts, b) for ts, b, *_ in self._raw
                               if b is not None and ts >= scrape.ts - RAW_AROUND_OUTAGE_SECONDS)
            keep = blob if blob is not None and scrape.ts <= self._keep_raw_until else None
        store.record_raw(self.target, before)
        store.record(self.target, scrape, gpus, info, keep)

    # -- the loop --------------------------------------------------------------------------

    def start(self) -> Collector:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"collector {self.target}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_tick = self._monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_tick += self.interval_seconds
            delay = next_tick - self._monotonic()
            if delay < 0:
                # Fell behind (slow server): skip the missed ticks rather than bursting.
                next_tick = self._monotonic()
                delay = 0
            self._sleep(delay)

    def scrape_once(self) -> Scrape:
        """One collection attempt; never raises for target errors (they become state)."""
        ts = self._clock()
        try:
            text = self.client.metrics_text()
            snapshot = parse_snapshot(text)
        except NotVllm as exc:
            return self._failed(ts, "not_vllm", exc)
        except (TargetError, BadPayload) as exc:
            return self._failed(ts, "down", exc)
        ts = self._clock()
        with self._lock:
            recovering = self._state != "up"
        if recovering:
            self._info_ts = None  # after an outage it may be another server: re-read /version
        engine_dead = self._check_health(ts)
        info_changed = self._refresh_info(ts)
        scrape = Scrape(ts, snapshot)
        gpus = self._read_gpus()
        with self._lock:
            outage_began = False
            if engine_dead is not None:
                self._error = engine_dead
                if self._state != "down":
                    outage_began = self._state == "up"
                    self._state, self._since = "down", ts
            else:
                if recovering:
                    self._state, self._since = "up", ts
                    if self._keep_raw_until == float("inf"):
                        self._keep_raw_until = ts + RAW_AROUND_OUTAGE_SECONDS
                self._error = None
            self._last_ok = ts
            self._last_attempt = ts
            self._num_scrapes += 1
            self._append(scrape, gpus)
            blob = zlib.compress(text.encode("utf-8"), 1)
            self._append_raw(ts, blob, None, None, gpus)
            if info_changed:
                self._store_info_changed = True
            info_payload = None
            if info_changed or self._info_dirty:
                info_payload = self._info_payload()
                self._info_dirty = False
            sinks = list(self._sinks)
        self._to_store(scrape, gpus, blob, outage_began)
        self._emit(sinks, Record(ts, self.target, metrics=text, info=info_payload, gpus=_gpus_json(gpus),
                                 gpu_source=gpus.source if gpus is not None else None))
        return scrape

    def _failed(self, ts: float, state: TargetState, exc: TargetError) -> Scrape:
        message = str(exc)
        scrape = Scrape(ts, None, message, exc.kind)
        with self._lock:
            outage_began = self._state == "up"
            if self._state != state:
                self._state, self._since = state, ts
            self._error = message
            self._last_attempt = ts
            self._num_scrapes += 1
            self._num_failures += 1
            self._append(scrape, None)
            self._append_raw(ts, None, message, exc.kind, None)
            sinks = list(self._sinks)
        self._to_store(scrape, None, outage_began=outage_began)
        self._emit(sinks, Record(ts, self.target, error=message, error_kind=exc.kind))
        return scrape

    def _append(self, scrape: Scrape, gpus: GpuReading | None) -> None:
        self._history.append(scrape)
        if gpus is not None:
            self._gpus.append((scrape.ts, gpus))
        horizon = scrape.ts - self.retention_seconds
        while self._history and self._history[0].ts < horizon:
            self._history.popleft()
        while self._gpus and self._gpus[0][0] < horizon:
            self._gpus.popleft()

    def _append_raw(self, ts: float, blob: bytes | None, error: str | None, kind: ErrorKind | None,
                    gpus: GpuReading | None) -> None:
        self._raw.append((ts, blob, error, kind, gpus))
        horizon = ts - self.raw_retention_seconds
        while self._raw and self._raw[0][0] < horizon:
            self._raw.popleft()

    def _check_health(self, ts: float) -> str | None:
        """Every few seconds: a 503 from ``/health`` means the engine died behind a live frontend."""
        if self._health_ts is not None and ts - self._health_ts < HEALTH_EVERY_SECONDS:
            return self._engine_dead
        self._health_ts = ts
        try:
            self.client.health()
            self._engine_dead = None
        except TargetHTTPError as exc:
            self._engine_dead = f"engine unhealthy: {exc}"
        except TargetError:
            self._engine_dead = None
        return self._engine_dead

    def _refresh_info(self, ts: float) -> bool:
        if self._info_ts is not None and ts - self._info_ts < INFO_REFRESH_SECONDS:
            return False
        self._info_ts = ts
        try:
            info = self.client.info()
        except TargetError as exc:
            with self._lock:
                self._info_error = str(exc)
            return False
        with self._lock:
            self._info_error = None
            # /v1/models stamps "created" with the request time: compare what it means.
            changed = self._info is None or (info.version, info.model, info.max_model_len) != (
                self._info.version,
                self._info.model,
                self._info.max_model_len,
            )
            self._info = info
        return changed

    def _info_payload(self) -> dict[str, Any] | None:
        if self._info is None:
            return None
        return {"version": self._info.version_json, "models": self._info.models_json}

    def _read_gpus(self) -> GpuReading | None:
        with self._lock:
            reader, source = self._gpu_reader, self.gpu_source
        if reader is None:
            return None
        try:
            return reader()
        except Exception as exc:  # noqa: BLE001 - a GPU reader failure must never stop collection
            return GpuReading(unavailable=f"GPU read failed: {type(exc).__name__}", source=source)

    def _emit(self, sinks: list[Sink], record: Record) -> None:
        """Hand the record to every sink. A sink that fails (a recording file closed or on a full
        disk) is dropped with its error kept in ``sink_errors``: it must never stop collection."""
        for sink in sinks:
            try:
                sink(record)
            except Exception as exc:  # noqa: BLE001 - one broken sink must not kill the collector
                self.sink_errors.append(f"{getattr(sink, '__qualname__', type(sink).__name__)}: "
                                        f"{type(exc).__name__}: {exc}")
                self.remove_sink(sink)


_REGISTRY: dict[tuple[str, str], Collector] = {}
_REGISTRY_LOCK = threading.Lock()
_STORE: list[HistoryStore] = []  # the process's history store (serve's --data-dir), when one is open
_STORED: list[frozenset[str] | None] = [None]  # the targets it keeps (None: every target)


def use_history_store(store: HistoryStore | None, targets: Iterable[str] | None = None) -> None:
    """Give the shared collectors of ``targets`` (normalised URLs; None: every target) started from
    now on this history store (``store`` None: none)."""
    with _REGISTRY_LOCK:
        _STORE[:] = [store] if store is not None else []
        _STORED[0] = frozenset(targets) if targets is not None else None


def history_store(url: str | None = None) -> HistoryStore | None:
    """The process's history store, if :func:`use_history_store` opened one (and, given ``url``,
    only if it keeps that target's history)."""
    with _REGISTRY_LOCK:
        store = _STORE[0] if _STORE else None
        if store is None or url is None or _STORED[0] is None:
            return store
        try:
            return store if normalize_url(url) in _STORED[0] else None
        except ValueError:
            return None


def _gpus_json(reading: GpuReading | None) -> list[dict[str, Any]] | None:
    """A reading as the recording file holds it (devices only; no reading, no key)."""
    return [d.to_json() for d in reading.devices] if reading is not None and reading.devices else None


def _registry_key(url: str, api_key: str | None) -> tuple[str, str]:
    digest = hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""
    return normalize_url(url), digest


def shared_collector(
    url: str,
    api_key: str | None = None,
    *,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    retention_seconds: float = DEFAULT_RETENTION_SECONDS,
    gpu_reader: GpuReader | None = None,
    gpu_metrics_url: str | None = None,
) -> Collector:
    """The process-wide collector for ``url``, started on first use (and again if it was
    stopped). Later callers share it, and its interval, whatever they ask for.

    ``gpu_metrics_url`` (a dcgm-exporter ``/metrics``) wins over ``gpu_reader`` (NVML): it is what
    the operator named. A caller that names another GPU metrics URL than the collector's switches it
    (one collector per vLLM target, whoever asks). Raises ``ValueError`` for a GPU metrics URL
    that cannot be used."""
    key = _registry_key(url, api_key)
    wanted = split_gpu_metrics_url(gpu_metrics_url) if gpu_metrics_url else None
    with _REGISTRY_LOCK:
        collector = _REGISTRY.get(key)
        if collector is None or not collector.running:
            dcgm = DcgmReader(gpu_metrics_url) if gpu_metrics_url else None
            client = VllmClient(url, api_key)
            collector = Collector(
                client,
                interval_seconds=interval_seconds,
                retention_seconds=retention_seconds,
                gpu_reader=dcgm or gpu_reader,
                gpu_source=dcgm.url if dcgm is not None else "NVML" if gpu_reader else None,
            )
            _REGISTRY[key] = collector
            if _STORE and (_STORED[0] is None or key[0] in _STORED[0]):
                collector.use_store(_STORE[0])
            collector.start()
        elif wanted is not None and collector.gpu_source != "".join(wanted):
            # Built only when the URL changes: pages ask on every refresh.
            dcgm = DcgmReader("".join(wanted))
            collector.use_gpu_reader(dcgm, dcgm.url)
        return collector


def register(collector: Collector, api_key: str | None = None) -> Collector:
    """Make ``collector`` the shared one for its target (tests and embedded targets), started."""
    with _REGISTRY_LOCK:
        _REGISTRY[_registry_key(collector.target, api_key)] = collector
    return collector.start()


def stop_all() -> None:
    """Stop every shared collector (tests, process exit)."""
    with _REGISTRY_LOCK:
        for collector in _REGISTRY.values():
            collector.stop()
        _REGISTRY.clear()
