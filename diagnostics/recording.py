"""Recordings: the incident-snapshot format shared by the app, the CLI and every later feature.

JSON Lines, gzip-compressed when the name ends in ``.gz``; one object per line::

    {"ts": 1795990768.1, "target": "http://127.0.0.1:8000", "metrics": "<full /metrics text>"}
    {"ts": 1795990769.1, "target": "http://127.0.0.1:8000", "error": "cannot reach …", "error_kind": "unreachable"}

``error_kind`` is one of :class:`~diagnostics.core.metrics.failure.ErrorKind`'s values; recordings
made before it existed carry the message only, and the kind is read from the adapter's wording of
that time (:func:`legacy_error_kind`). Optional keys: ``info`` (``{"version": <GET /version>,
"models": <GET /v1/models>}``, on the first line and whenever it changes), ``gpus`` (``[{"index", "name", "memory_used_bytes",
"memory_total_bytes", …}]``: each device's GPU health fields that were read, see
:meth:`~diagnostics.core.metrics.gpu.GpuDevice.to_json`) and ``gpu_source`` (where they were read:
``"NVML"``, or the dcgm-exporter URL given as the GPU metrics URL). Readers ignore unknown keys and report each malformed line with its
number; replay parses the same text with the same code as live collection, so it derives the
same series. No API key is ever written: records carry the base URL only.
"""

from __future__ import annotations

import gzip
import io
import json
import threading
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.history import Replay
from diagnostics.core.metrics.info import ServerInfo
from diagnostics.errors import BadPayload, BadRecording


@dataclass(frozen=True, slots=True)
class Record:
    """One line of a recording."""

    ts: float
    target: str
    metrics: str | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    info: Mapping[str, Any] | None = None
    gpus: Sequence[Mapping[str, Any]] | None = None
    gpu_source: str | None = None

    def to_json(self) -> str:
        obj: dict[str, Any] = {"ts": self.ts, "target": self.target}
        if self.metrics is not None:
            obj["metrics"] = self.metrics
        else:
            obj["error"] = self.error or "unknown error"
            obj["error_kind"] = str(self.error_kind or ErrorKind.UNKNOWN)
        if self.info is not None:
            obj["info"] = dict(self.info)
        if self.gpus is not None:
            obj["gpus"] = [dict(g) for g in self.gpus]
            if self.gpu_source is not None:
                obj["gpu_source"] = self.gpu_source
        return json.dumps(obj, separators=(",", ":"))


def decode_line(line: str, line_no: int) -> Record:
    """One JSON line → :class:`Record`; :class:`BadRecording` (with ``line_no``) when malformed."""
    try:
        obj = json.loads(line)
    except ValueError:
        raise BadRecording(f"line {line_no}: not JSON", line_no) from None
    if not isinstance(obj, dict):
        raise BadRecording(f"line {line_no}: not a JSON object", line_no)
    ts = obj.get("ts")
    target = obj.get("target")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise BadRecording(f"line {line_no}: missing or non-numeric 'ts'", line_no)
    if not isinstance(target, str):
        raise BadRecording(f"line {line_no}: missing 'target'", line_no)
    metrics = obj.get("metrics")
    error = obj.get("error")
    if not isinstance(metrics, str) and not isinstance(error, str):
        raise BadRecording(f"line {line_no}: needs a 'metrics' or an 'error' string", line_no)
    info = obj.get("info") if isinstance(obj.get("info"), dict) else None
    gpus = obj.get("gpus") if isinstance(obj.get("gpus"), list) else None
    gpu_source = obj.get("gpu_source") if isinstance(obj.get("gpu_source"), str) else None
    kind = None
    if not isinstance(metrics, str):
        stored = obj.get("error_kind")
        kind = ErrorKind(stored) if stored in _KIND_VALUES else legacy_error_kind(str(error))
    return Record(
        float(ts),
        target,
        metrics if isinstance(metrics, str) else None,
        error if isinstance(error, str) else None,
        kind,
        info,
        gpus,
        gpu_source,
    )


_KIND_VALUES = frozenset(kind.value for kind in ErrorKind)
# The messages the adapters wrote before recordings stored a kind (up to the recordings of
# 2026-05), frozen here: today's wording lives in the adapters, which name the kind themselves.
_LEGACY_KINDS: tuple[tuple[str, ErrorKind], ...] = (
    ("did not answer within", ErrorKind.TIMEOUT),
    ("engine unhealthy", ErrorKind.ENGINE_UNAVAILABLE),
    ("HTTP 503", ErrorKind.ENGINE_UNAVAILABLE),
    ("answered HTTP", ErrorKind.HTTP_STATUS),
    ("cannot reach", ErrorKind.UNREACHABLE),
    ("failed:", ErrorKind.UNREACHABLE),
    ("bad payload", ErrorKind.BAD_PAYLOAD),
    ("not UTF-8", ErrorKind.BAD_PAYLOAD),
    ("exceeds", ErrorKind.BAD_PAYLOAD),
    ("did not answer JSON", ErrorKind.BAD_PAYLOAD),
    ("no vllm: metrics", ErrorKind.NOT_VLLM),
    ("HTML page", ErrorKind.NOT_VLLM),
)


def legacy_error_kind(message: str) -> ErrorKind:
    """The kind of a failed scrape in a recording that stored only its message (see the module
    docstring); UNKNOWN for a message no adapter wrote."""
    return next((kind for text, kind in _LEGACY_KINDS if text in message), ErrorKind.UNKNOWN)


@dataclass(slots=True)
class Recording:
    """A read recording: the good records in order, and a message per line that was skipped."""

    records: list[Record]
    problems: list[str] = field(default_factory=list)

    def scrapes(self) -> list[Scrape]:
        """The records as scrapes (a payload that no longer parses becomes an error scrape)."""
        return list(scrapes_from_records(self.records))

    def info(self) -> ServerInfo | None:
        """The last server info the recording carries."""
        for record in reversed(self.records):
            if record.info is not None:
                return ServerInfo.from_json(record.info.get("version"), record.info.get("models"))
        return None

    @property
    def target(self) -> str | None:
        return self.records[-1].target if self.records else None

    def replay(self) -> Replay:
        """The recording as a history source (its scrapes parsed once, here)."""
        gpus = tuple((r.ts, reading) for r in self.records if (reading := GpuReading.from_json(r.gpus, r.gpu_source)) is not None)
        return Replay(self.target or "?", tuple(self.scrapes()), self.info(), gpus)


def scrapes_from_records(records: Iterable[Record]) -> Iterator[Scrape]:
    for record in records:
        if record.metrics is None:
            yield Scrape(record.ts, None, record.error, record.error_kind or ErrorKind.UNKNOWN)
            continue
        try:
            yield Scrape(record.ts, parse_snapshot(record.metrics))
        except BadPayload as exc:
            yield Scrape(record.ts, None, f"bad payload: {exc}", ErrorKind.BAD_PAYLOAD)


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, mode + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def read_lines(lines: Iterable[str]) -> Recording:
    """Parse recording lines (blank lines ignored). Raises :class:`BadRecording` only when no
    line at all is usable."""
    recording = Recording([])
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            recording.records.append(decode_line(line, line_no))
        except BadRecording as exc:
            recording.problems.append(f"{exc} (skipped)")
    if not recording.records:
        first = f": {recording.problems[0]}" if recording.problems else ""
        raise BadRecording(f"no usable record in this file{first}")
    recording.records.sort(key=lambda r: r.ts)
    return recording


def read_recording(source: str | Path | bytes) -> Recording:
    """Read a recording from a path or from the bytes of an uploaded file (gzip detected).

    A ``.gz`` file whose writer was killed has no end-of-stream marker: everything up to the
    last complete line is kept (the writer flushes each line) and ``problems`` says it was cut."""
    name = "upload" if isinstance(source, bytes) else str(source)
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
    except OSError as exc:
        raise BadRecording(f"cannot read {name}: {exc}") from None
    cut = False
    if data[:2] == b"\x1f\x8b":
        data, cut = _gunzip(data)
    if cut:
        data = data[: data.rfind(b"\n") + 1]
    try:
        recording = read_lines(data.decode("utf-8").splitlines())
    except UnicodeDecodeError:
        raise BadRecording("not a text recording (not UTF-8)") from None
    if cut:
        recording.problems.append(
            f"the file was cut off (its writer stopped without closing it): read up to the last complete line, "
            f"{len(recording.records)} records")
    return recording


def _gunzip(data: bytes) -> tuple[bytes, bool]:
    """The decompressed bytes of one or more gzip members, and whether the stream was cut short
    (no end-of-stream marker, or corrupt from some point on: what came before is kept)."""
    out: list[bytes] = []
    chunk = 1 << 16
    while data:
        member = zlib.decompressobj(wbits=31)
        rest = b""
        try:
            for i in range(0, len(data), chunk):
                out.append(member.decompress(data[i:i + chunk]))
                if member.eof:
                    rest = member.unused_data + data[i + chunk:]
                    break
        except zlib.error:
            if not out:
                raise BadRecording("not a readable gzip file") from None
            return b"".join(out), True
        if not member.eof:
            return b"".join(out), True
        data = rest
    return b"".join(out), False


def encode_recording(records: Iterable[Record], compress: bool = True) -> bytes:
    """Records → the bytes of a ``.jsonl.gz`` (or ``.jsonl``) file, for a download button."""
    data = "".join(record.to_json() + "\n" for record in records).encode("utf-8")
    return gzip.compress(data, compresslevel=6) if compress else data


class RecordingWriter:
    """Appends records to a ``.jsonl`` or ``.jsonl.gz`` file, flushing each line so a crash keeps
    what was collected. Thread-safe: the collector thread calls :meth:`write`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle = _open_text(self.path, "w")
        self._lock = threading.Lock()
        self.num_records = 0

    def write(self, record: Record) -> None:
        with self._lock:
            self._handle.write(record.to_json() + "\n")
            self._handle.flush()
            self.num_records += 1

    def close(self) -> None:
        with self._lock:
            self._handle.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
