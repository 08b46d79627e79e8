"""How a run of scrapes is written down: one compressed chunk, columnar (pure).

A snapshot is already columnar in memory (a shared :class:`Layout` and one array of floats), so a
chunk stores a run of same-layout scrapes as a matrix, column by column: the first row, then each
number's change since the scrape before (an exact integer difference for the whole-number columns —
counters and bucket counts, so an unchanged bucket is zero bytes and a counter's step one or two —
the XOR of the bits for the rest), byte-shuffled (the k-th byte of every number together) and
zlib-compressed, with a small JSON header for the rest (time,
error, cache config, LoRA state, GPU readings). Layouts are written once by the adapter and named
here by an integer. :func:`exposition` writes a snapshot back as Prometheus text, so a stored range
becomes an ordinary recording that parses to the same snapshots.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from diagnostics.core.metrics.catalog import (
    CACHE_CONFIG,
    COUNTERS,
    GENERATION_REQUEST_BYTES,
    GENERATION_REQUESTS,
    LABELLED_COUNTERS,
    LABELLED_GAUGES,
    LORA_INFO,
    CacheConfig,
    EngineKey,
    Layout,
    LoraInfo,
    Snapshot,
    layout_of,
    layout_shape,
)
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.gpu import GpuDevice, GpuReading
from diagnostics.core.metrics.parse import HTTP_REQUEST_SIZE_SUM, HTTP_REQUESTS, PROCESS_START

FORMAT = 1
_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True, slots=True)
class Row:
    """One stored scrape (or aggregate) and the GPU reading taken beside it."""

    scrape: Scrape
    gpus: GpuReading | None = None

    @property
    def ts(self) -> float:
        return self.scrape.ts


# -- layouts -------------------------------------------------------------------------------

def layout_to_json(layout: Layout) -> str:
    """A layout as the text the adapter stores once (and :func:`layout_from_json` reads back)."""
    shape, has_config = layout_shape(layout)
    return json.dumps({"shape": [list(_jsonable(e)) for e in shape], "config": has_config}, separators=(",", ":"))


def _jsonable(entry: tuple[object, ...]) -> list[Any]:
    return [list(x) if isinstance(x, tuple) else x for x in entry]


def layout_from_json(text: str) -> Layout:
    obj = json.loads(text)
    shape: list[tuple[object, ...]] = []
    for entry in obj["shape"]:
        kind = entry[0]
        if kind == "s":
            shape.append(("s", entry[1], entry[2], _key(entry[3])))
        elif kind == "l":
            shape.append(("l", entry[1], entry[2], sys.intern(entry[3]), _key(entry[4])))
        else:
            shape.append(("h", entry[1], entry[2], _key(entry[3]), tuple(float(b) for b in entry[4])))
    return layout_of(tuple(shape), bool(obj["config"]))


def _key(pair: Sequence[str]) -> EngineKey:
    return (sys.intern(pair[0]), sys.intern(pair[1]))


# -- chunks --------------------------------------------------------------------------------

def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


def _shuffle(data: bytes) -> bytes:
    return b"".join(data[k::8] for k in range(8))


def _unshuffle(data: bytes) -> bytes:
    n = len(data) // 8
    out = bytearray(len(data))
    for k in range(8):
        out[k::8] = data[k * n:(k + 1) * n]
    return bytes(out)


def _values_bytes(snapshot: Snapshot) -> bytes:
    values = snapshot.values
    if not _LITTLE:
        values = array("d", values)
        values.byteswap()
    return values.tobytes()


def _gpus_json(reading: GpuReading | None) -> dict[str, Any] | None:
    if reading is None:
        return None
    return {"devices": [d.to_json() for d in reading.devices], "unavailable": reading.unavailable,
            "source": reading.source}


def _gpus_from(obj: dict[str, Any] | None) -> GpuReading | None:
    if obj is None:
        return None
    devices = tuple(d for d in (GpuDevice.from_json(e) for e in obj.get("devices", [])) if d is not None)
    return GpuReading(devices, obj.get("unavailable"), obj.get("source"))


def _segments(header: list[list[Any]]) -> list[tuple[int, int, int]]:
    """Runs of consecutive scrapes with the same layout: ``(first row, rows, width)``."""
    out: list[tuple[int, int, int]] = []
    key: tuple[Any, int] | None = None
    for i, entry in enumerate(header):
        if entry[1] is None:
            continue
        if key == (entry[1], entry[9]) and out and out[-1][0] + out[-1][1] == i:
            first, k, n = out[-1]
            out[-1] = (first, k + 1, n)
        else:
            out.append((i, 1, entry[9]))
        key = (entry[1], entry[9])
    return out


def _encode_segment(matrix: np.ndarray) -> bytes:
    """One run of same-layout scrapes (rows × values): the first row as it is, then per column the
    difference from the row before — an exact integer difference where the column holds only whole
    numbers (counters, bucket counts: a few significant bytes), the XOR of the bits elsewhere —
    column by column, byte-shuffled."""
    rows, width = matrix.shape
    whole = np.all(np.isfinite(matrix) & (matrix == np.round(matrix)) & (np.abs(matrix) < 2.0 ** 52)
                   & ~(np.signbit(matrix) & (matrix == 0)), axis=0)  # -0.0 keeps its bits
    bits = matrix.view(np.uint64)
    deltas = np.bitwise_xor(bits[1:], bits[:-1])
    ints = matrix[:, whole].astype(np.int64)
    step = ints[1:] - ints[:-1]
    deltas[:, whole] = ((step << 1) ^ (step >> 63)).view(np.uint64)  # zigzag: small either way
    columns = np.ascontiguousarray(deltas.T).view(np.uint8).reshape(-1, 8)
    return (matrix[0].astype("<f8").tobytes() + np.packbits(whole).tobytes()
            + np.ascontiguousarray(columns.T).tobytes())


def _decode_segment(data: bytes, pos: int, rows: int, width: int) -> tuple[np.ndarray, int]:
    first = np.frombuffer(data, "<f8", width, pos).astype(np.float64)
    pos += 8 * width
    mask_len = (width + 7) // 8
    whole = np.unpackbits(np.frombuffer(data, np.uint8, mask_len, pos))[:width].astype(bool)
    pos += mask_len
    size = 8 * width * (rows - 1)
    planes = np.frombuffer(data, np.uint8, size, pos).reshape(8, -1)
    pos += size
    deltas = np.ascontiguousarray(planes.T).view(np.uint64).reshape(width, rows - 1).T
    bits = np.bitwise_xor.accumulate(np.vstack([first.view(np.uint64)[None, :], deltas]), axis=0)
    out = bits.view(np.float64).copy()
    if whole.any():
        z = deltas[:, whole]
        step = (z >> np.uint64(1)).view(np.int64) ^ -(z & np.uint64(1)).view(np.int64)
        ints = np.empty((rows, int(whole.sum())), np.int64)
        ints[0] = first[whole].astype(np.int64)
        ints[1:] = ints[0] + np.cumsum(step, axis=0)
        out[:, whole] = ints.astype(np.float64)
    return out, pos


def encode_chunk(rows: Iterable[Row], layout_id: Callable[[Layout], int], level: int = 6) -> bytes:
    """Rows (oldest first) → one chunk's bytes; ``layout_id`` names each distinct layout."""
    header: list[list[Any]] = []
    configs: list[dict[str, str]] = []
    config_index: dict[int, int] = {}
    values: list[Snapshot | None] = []
    peaks: list[bytes] = []
    for row in rows:
        scrape = row.scrape
        snap = scrape.snapshot
        gpus = _gpus_json(row.gpus)
        values.append(snap)
        if snap is None:
            header.append([scrape.ts, None, None, None, None, scrape.error,
                           str(scrape.error_kind) if scrape.error_kind else None, gpus, 0, 0])
            continue
        lid = layout_id(snap.layout)
        cfg = None
        if snap.cache_config is not None:
            cfg = config_index.get(id(snap.cache_config))
            if cfg is None:
                cfg = config_index[id(snap.cache_config)] = len(configs)
                configs.append(dict(snap.cache_config.raw))
        lora = None if snap.lora is None else [snap.lora.max_lora, list(snap.lora.running), list(snap.lora.waiting)]
        has_peak = 0
        if scrape.peak is not None and len(scrape.peak.values) == len(snap.values):
            peaks.append(_xor(_values_bytes(scrape.peak), _values_bytes(snap)))
            has_peak = 1
        header.append([scrape.ts, lid, cfg, snap.process_start_time_seconds, lora, None, None, gpus, has_peak,
                       len(snap.values)])
    planes = []
    for first, k, n in _segments(header):
        joined = b"".join(v.values.tobytes() for v in values[first:first + k] if v is not None)
        matrix = np.frombuffer(joined, np.float64).reshape(k, n)
        planes.append(_encode_segment(matrix))
    head = json.dumps({"v": FORMAT, "rows": header, "configs": configs}, separators=(",", ":")).encode()
    body = struct.pack("<I", len(head)) + head + b"".join(planes) + _shuffle(b"".join(peaks))
    return zlib.compress(body, level)


def decode_chunk(data: bytes, layout_by_id: Callable[[int], Layout]) -> list[Row]:
    """A chunk's rows, oldest first (raises ``ValueError`` for bytes that are not a chunk)."""
    try:
        body = zlib.decompress(data)
        (size,) = struct.unpack_from("<I", body)
        head = json.loads(body[4:4 + size])
    except (zlib.error, struct.error, ValueError) as exc:
        raise ValueError(f"not a history chunk: {exc}") from None
    if head.get("v") != FORMAT:
        raise ValueError(f"history chunk format {head.get('v')!r} is not {FORMAT}")
    header = head["rows"]
    pos = 4 + size
    matrices: dict[int, array[float]] = {}
    try:
        for first, k, n in _segments(header):
            matrix, pos = _decode_segment(body, pos, k, n)
            for i in range(k):
                matrices[first + i] = array("d", matrix[i].tobytes())
    except ValueError as exc:
        raise ValueError(f"not a history chunk: {exc}") from None
    peak_values = _unshuffle(body[pos:])
    configs = [CacheConfig.from_labels(c) for c in head["configs"]]
    out: list[Row] = []
    peak_pos = 0
    for i, (ts, lid, cfg, start, lora, error, kind, gpus, has_peak, n) in enumerate(header):
        reading = _gpus_from(gpus)
        if lid is None:
            out.append(Row(Scrape(ts, None, error, ErrorKind(kind) if kind else ErrorKind.UNKNOWN), reading))
            continue
        layout = layout_by_id(lid)
        lora_info = None if lora is None else LoraInfo(lora[0], tuple(lora[1]), tuple(lora[2]))
        config = configs[cfg] if cfg is not None else None
        values = matrices[i]
        snap = Snapshot(layout, values, config, start, lora_info)
        peak = None
        if has_peak:
            width = 8 * n
            raw = _xor(peak_values[peak_pos:peak_pos + width], values.tobytes())
            peak_pos += width
            peak = Snapshot(layout, _array(raw), config, start, lora_info)
        out.append(Row(Scrape(ts, snap, peak=peak), reading))
    return out


def _array(raw: bytes) -> array[float]:
    values = array("d")
    values.frombytes(raw)
    if not _LITTLE:
        values.byteswap()
    return values


# -- back to text --------------------------------------------------------------------------

def _labels(key: EngineKey, extra: dict[str, str] | None = None) -> str:
    labels = dict(extra or {})
    if key[0]:
        labels["model_name"] = key[0]
    if key[1]:
        labels["engine"] = key[1]
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _line(name: str, labels: str, value: float) -> str:
    return f"{name}{{{labels}}} {_number(value)}" if labels else f"{name} {_number(value)}"


def exposition(snapshot: Snapshot) -> str:
    """A snapshot as Prometheus text that :func:`~diagnostics.core.metrics.catalog.parse_snapshot`
    reads back to the same layout and numbers (the ``vllm:`` families the dashboard reads, the
    process start time and the generation handlers' ``http_requests_total`` and
    ``http_request_size_bytes_sum``)."""
    layout, v = snapshot.layout, snapshot.values
    lines: list[tuple[int, str]] = []
    for concept, offsets in layout.scalars.items():
        name = layout.spellings[concept] + ("_total" if concept in COUNTERS else "")
        lines.extend((o, _line(name, _labels(key), v[o])) for key, o in offsets.items())
    for concept, per_label in layout.labelled.items():
        spelling = layout.spellings[concept]
        if concept in LABELLED_COUNTERS:
            label = LABELLED_COUNTERS[concept][1]
            name = {GENERATION_REQUESTS: HTTP_REQUESTS, GENERATION_REQUEST_BYTES: HTTP_REQUEST_SIZE_SUM}.get(
                spelling, spelling + "_total")
        else:
            label, name = LABELLED_GAUGES[concept][1], spelling
        for value, offsets in per_label.items():
            extra = {"handler": "/v1/completions", label: value} if name == HTTP_REQUESTS else {label: value}
            lines.extend((o, _line(name, _labels(key, extra), v[o])) for key, o in offsets.items())
    for concept, per_engine in layout.histograms.items():
        name = layout.spellings[concept]
        for key, (bounds, o) in per_engine.items():
            block = [_line(name + "_bucket", _labels(key, {"le": _number(b)}), v[o + i]) for i, b in enumerate(bounds)]
            n = len(bounds)
            if not math.isnan(v[o + n]):
                block.append(_line(name + "_sum", _labels(key), v[o + n]))
            block.append(_line(name + "_count", _labels(key), v[o + n + 1]))
            lines.append((o, "\n".join(block)))
    lines.sort(key=lambda item: item[0])
    out = [text for _, text in lines]
    if snapshot.cache_config is not None:
        out.append(_line(CACHE_CONFIG, ",".join(f'{k}="{_escape(x)}"' for k, x in snapshot.cache_config.raw.items()),
                         1.0))
    if snapshot.lora is not None:
        lora = snapshot.lora
        out.append(_line(LORA_INFO, f'max_lora="{"" if lora.max_lora is None else lora.max_lora}",'
                         f'running_lora_adapters="{",".join(lora.running)}",'
                         f'waiting_lora_adapters="{",".join(lora.waiting)}"', 1.0))
    if snapshot.process_start_time_seconds is not None:
        out.append(_line(PROCESS_START, "", snapshot.process_start_time_seconds))
    return "\n".join(out) + "\n"
