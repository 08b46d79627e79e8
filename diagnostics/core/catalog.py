"""The metric catalog: concepts the dashboard asks for, and every spelling vLLM has used for them.

Consumers never name a metric; they ask a :class:`Snapshot` for a concept (``kv_cache_usage_perc``,
``prefix_cache_hits``, ``inter_token_latency_seconds``…) and get it from whichever spelling the
server exposes. A concept the server does not expose is absent (``None``), never 0. Spellings are
tried in order, newest first; version ranges are in ``shared/reference/metric-version-ranges.txt``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from diagnostics.core.parse import PROCESS_START, Sample, parse_vllm_samples

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
}

LABELLED_GAUGES: dict[str, tuple[tuple[str, ...], str]] = {
    "num_requests_waiting_by_reason": (("vllm:num_requests_waiting_by_reason",), "reason"),
}

LABELLED_COUNTERS: dict[str, tuple[tuple[str, ...], str]] = {
    "request_success": (("vllm:request_success",), "finished_reason"),
    "admission_rejections": (("vllm:admission_rejections",), "reason"),
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
    "iteration_tokens": ("vllm:iteration_tokens_total", "vllm:iteration_tokens"),
    "request_prompt_tokens": ("vllm:request_prompt_tokens",),
    "request_generation_tokens": ("vllm:request_generation_tokens",),
    "request_params_n": ("vllm:request_params_n",),
}

# Concepts drawn as Δnumerator / Δdenominator of two counters over a window: derived, never scraped.
RATIOS: dict[str, tuple[str, str]] = {
    "prefix_cache_hit_rate": ("prefix_cache_hits", "prefix_cache_queries"),
}

# Concepts whose server total is a mean across engines rather than a sum.
MEAN_CONCEPTS = frozenset({"kv_cache_usage_perc", "cpu_cache_usage_perc", "gpu_prefix_cache_hit_rate"})

CACHE_CONFIG = "vllm:cache_config_info"


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
class Snapshot:
    """One scrape, by concept. Per-engine values keyed by :data:`EngineKey`; totals on demand."""

    gauges: Mapping[str, Mapping[EngineKey, float]]
    counters: Mapping[str, Mapping[EngineKey, float]]
    labelled: Mapping[str, Mapping[str, Mapping[EngineKey, float]]]
    histograms: Mapping[str, Mapping[EngineKey, Histogram]]
    cache_config: CacheConfig | None
    spellings: Mapping[str, str]
    process_start_time_seconds: float | None = None

    @property
    def engines(self) -> tuple[EngineKey, ...]:
        keys: set[EngineKey] = set()
        for per_engine in (*self.gauges.values(), *self.counters.values()):
            keys.update(per_engine)
        return tuple(sorted(keys))

    def has(self, concept: str) -> bool:
        return concept in self.spellings

    def value(self, concept: str, engine: EngineKey | None = None) -> float | None:
        """A gauge or counter: one engine's value, or the server total (None when absent)."""
        per_engine = self.gauges.get(concept)
        if per_engine is None:
            per_engine = self.counters.get(concept)
        if not per_engine:
            return None
        if engine is not None:
            return per_engine.get(engine)
        total = sum(per_engine.values())
        return total / len(per_engine) if concept in MEAN_CONCEPTS else total

    def by_label(self, concept: str, engine: EngineKey | None = None) -> dict[str, float] | None:
        """A labelled gauge or counter as ``{label value: value}`` (summed over engines)."""
        per_label = self.labelled.get(concept)
        if per_label is None:
            return None
        out: dict[str, float] = {}
        for label, per_engine in per_label.items():
            if engine is None:
                out[label] = sum(per_engine.values())
            elif engine in per_engine:
                out[label] = per_engine[engine]
        return out

    def histogram(self, concept: str, engine: EngineKey | None = None) -> Histogram | None:
        per_engine = self.histograms.get(concept)
        if not per_engine:
            return None
        if engine is not None:
            return per_engine.get(engine)
        hists = list(per_engine.values())
        total = hists[0]
        for other in hists[1:]:
            if other.bounds == total.bounds:
                total = total.plus(other)
        return total


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


def _plateau_shared(values: list[float]) -> tuple[float, ...]:
    """Cumulative counts plateau: let equal neighbours share one float object."""
    out: list[float] = []
    prev: float | None = None
    for v in values:
        if prev is not None and v == prev:
            v = prev
        out.append(v)
        prev = v
    return tuple(out)


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
        cumulative = _plateau_shared([c for _, c in pairs])
        out[key] = Histogram(bounds, cumulative, sums.get(key, math.nan), counts.get(key, cumulative[-1]))
    return out


def snapshot_from_samples(samples: Iterable[Sample]) -> Snapshot:
    """Group parsed samples into concepts, choosing each concept's spelling by presence."""
    names: dict[str, list[Sample]] = {}
    process_start: float | None = None
    for sample in samples:
        if sample.name == PROCESS_START:
            process_start = sample.value
            continue
        names.setdefault(sample.name, []).append(sample)

    spellings: dict[str, str] = {}
    gauges: dict[str, dict[EngineKey, float]] = {}
    for concept, candidates in GAUGES.items():
        name, found = _first_present(candidates, names, ("",))
        if name is not None and found is not None:
            spellings[concept] = name
            gauges[concept] = {_engine_key(s.labels): s.value for s in found}

    counters: dict[str, dict[EngineKey, float]] = {}
    for concept, candidates in COUNTERS.items():
        name, found = _first_present(candidates, names, ("_total", ""))
        if name is not None and found is not None:
            spellings[concept] = name
            per_engine: dict[EngineKey, float] = {}
            for s in found:
                key = _engine_key(s.labels)
                per_engine[key] = per_engine.get(key, 0.0) + s.value
            counters[concept] = per_engine

    labelled: dict[str, dict[str, dict[EngineKey, float]]] = {}
    for table, suffixes in ((LABELLED_GAUGES, ("",)), (LABELLED_COUNTERS, ("_total", ""))):
        for concept, (candidates, label) in table.items():
            name, found = _first_present(candidates, names, suffixes)
            if name is not None and found is not None:
                spellings[concept] = name
                per_label: dict[str, dict[EngineKey, float]] = {}
                for s in found:
                    per_label.setdefault(s.labels.get(label, ""), {})[_engine_key(s.labels)] = s.value
                labelled[concept] = per_label

    histograms: dict[str, dict[EngineKey, Histogram]] = {}
    for concept, candidates in HISTOGRAMS.items():
        name, _ = _first_present(candidates, names, ("_bucket",))
        if name is not None:
            hists = _histogram_from(name, names)
            if hists:
                spellings[concept] = name
                histograms[concept] = hists

    cache_config = None
    info = names.get(CACHE_CONFIG)
    if info:
        engine0 = min(info, key=lambda s: s.labels.get("engine", ""))
        cache_config = _shared_config(engine0.labels)
        spellings["cache_config"] = CACHE_CONFIG

    return Snapshot(gauges, counters, labelled, histograms, cache_config, spellings, process_start)


def parse_snapshot(text: str) -> Snapshot:
    """Prometheus text → :class:`Snapshot` (raises ``BadMetricsPayload`` on malformed lines)."""
    return snapshot_from_samples(parse_vllm_samples(text))
