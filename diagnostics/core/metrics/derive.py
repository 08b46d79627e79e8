"""Derived series over a history of scrapes: counter rates with reset detection, windowed hit rate,
histogram quantiles from bucket deltas, and the current state the CLI and pages show.

Semantics follow Prometheus: a drop is a counter reset (the new value is the increase since the
restart), so a server restart gives neither a negative rate nor a spike; that rule lives in
:func:`counter_step` and :func:`histogram_step`, and every consumer (rates here, the chart series,
the diagnosis) calls them. ``histogram_quantile`` interpolates linearly inside the bucket and
answers the highest finite bound when the rank falls in the +Inf bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diagnostics.core.metrics.catalog import CacheConfig, EngineKey, Histogram, Snapshot
from diagnostics.core.metrics.failure import ErrorKind


@dataclass(frozen=True, slots=True)
class Scrape:
    """One collection attempt: a snapshot, or the error that replaced it (``error`` for people,
    ``error_kind`` for rules; a failed scrape without a kind is of unknown cause).

    ``peak``: on an aggregate of several scrapes (the history store's coarser tiers), each value's
    maximum over them, in the snapshot's layout (a gauge's spike that the last value would hide);
    None for a scrape as it was taken."""

    ts: float
    snapshot: Snapshot | None
    error: str | None = None
    error_kind: ErrorKind | None = None
    peak: Snapshot | None = None


def window(history: Sequence[Scrape], seconds: float, end: float | None = None) -> list[Scrape]:
    """The scrapes with ``end - seconds <= ts <= end`` (``end`` defaults to the last scrape)."""
    if not history:
        return []
    end_ts = history[-1].ts if end is None else end
    start_ts = end_ts - seconds
    return [s for s in history if start_ts <= s.ts <= end_ts]


def counter_step(prev: float, cur: float, restart: bool) -> float:
    """A counter's increase between two samples: a drop, or a restart of the process in between
    (``restart``), is a reset, and the increase is then the new value. Never negative."""
    return cur if restart or cur < prev else cur - prev


def histogram_step(prev_snap: Snapshot, prev: Histogram, cur_snap: Snapshot, cur: Histogram) -> Histogram | None:
    """The observations a histogram gained between two snapshots (buckets, sum and count).

    A drop of the count or of any bucket, or a restart, is a reset: the delta is then the new
    histogram itself. None when the bucket bounds differ (no delta exists across layouts).
    """
    if cur.bounds != prev.bounds:
        return None
    if (
        cur.count < prev.count
        or any(c < p for c, p in zip(cur.cumulative, prev.cumulative))
        or restarted(prev_snap, cur_snap)
    ):
        return cur
    return Histogram(
        cur.bounds, tuple(c - p for c, p in zip(cur.cumulative, prev.cumulative)), cur.sum - prev.sum,
        cur.count - prev.count,
    )


def increase(values: Sequence[float], restarts: Sequence[bool] | None = None) -> float:
    """Total increase of a counter sampled in order (see :func:`counter_step`).

    ``restarts[i]`` marks a known restart between sample i-1 and i (the process start time
    changed), which is a reset even when the new value happens to be larger.
    """
    total = 0.0
    for i in range(1, len(values)):
        prev, cur = values[i - 1], values[i]
        if math.isnan(prev) or math.isnan(cur):
            continue
        total += counter_step(prev, cur, restarts is not None and restarts[i])
    return total


def restarted(prev: Snapshot, cur: Snapshot) -> bool:
    """The server process changed between two snapshots (when it exposes its start time)."""
    a, b = prev.process_start_time_seconds, cur.process_start_time_seconds
    return a is not None and b is not None and a != b


def _points(scrapes: Sequence[Scrape], pick: Callable[[Snapshot], float | None]) -> list[tuple[float, float, bool]]:
    """``(ts, value, restarted since the previous point)`` for the scrapes that carry the value."""
    out: list[tuple[float, float, bool]] = []
    prev: Snapshot | None = None
    for scrape in scrapes:
        if scrape.snapshot is None:
            continue
        value = pick(scrape.snapshot)
        if value is not None:
            out.append((scrape.ts, value, prev is not None and restarted(prev, scrape.snapshot)))
            prev = scrape.snapshot
    return out


def counter_increase(
    scrapes: Sequence[Scrape], concept: str, engine: EngineKey | None = None
) -> tuple[float, float] | None:
    """``(increase, seconds covered)`` of a counter concept over the scrapes; None when absent or
    when fewer than two scrapes carry it."""
    points = _points(scrapes, lambda s: s.value(concept, engine))
    if len(points) < 2:
        return None
    return increase([p[1] for p in points], [p[2] for p in points]), points[-1][0] - points[0][0]


def counter_rate(scrapes: Sequence[Scrape], concept: str, engine: EngineKey | None = None) -> float | None:
    """Per-second rate of a counter over the scrapes (None when it cannot be computed)."""
    inc = counter_increase(scrapes, concept, engine)
    if inc is None or inc[1] <= 0:
        return None
    return inc[0] / inc[1]


def prefix_cache_hit_rate(scrapes: Sequence[Scrape], engine: EngineKey | None = None) -> float | None:
    """Δhits / Δqueries over the scrapes (tokens); None when no tokens were queried or absent.

    On V0 servers, which have no token counters, the last value of the lifetime
    ``gpu_prefix_cache_hit_rate`` gauge is the best available answer.
    """
    hits = counter_increase(scrapes, "prefix_cache_hits", engine)
    queries = counter_increase(scrapes, "prefix_cache_queries", engine)
    if hits is None or queries is None:
        points = _points(scrapes, lambda s: s.value("gpu_prefix_cache_hit_rate", engine))
        return points[-1][1] if points else None
    if queries[0] <= 0:
        return None
    return min(1.0, hits[0] / queries[0])


def histogram_delta(scrapes: Sequence[Scrape], concept: str, engine: EngineKey | None = None) -> Histogram | None:
    """Bucket-wise increase of a histogram over the scrapes (resets handled per bucket).

    A change of bucket bounds (a restart with ``--custom-histogram-buckets``) starts the
    accumulation over from the new layout.
    """
    found: list[tuple[Snapshot, Histogram]] = []
    for s in scrapes:
        if s.snapshot is not None and (h := s.snapshot.histogram(concept, engine)) is not None:
            found.append((s.snapshot, h))
    if len(found) < 2:
        return None
    bounds = found[0][1].bounds
    acc = [0.0] * len(bounds)
    acc_sum = 0.0
    acc_count = 0.0
    for (prev_snap, prev), (cur_snap, cur) in zip(found, found[1:]):
        step = histogram_step(prev_snap, prev, cur_snap, cur)
        if step is None:
            bounds = cur.bounds
            acc = [0.0] * len(bounds)
            acc_sum = acc_count = 0.0
            continue
        acc = [a + d for a, d in zip(acc, step.cumulative)]
        acc_sum += step.sum
        acc_count += step.count
    return Histogram(bounds, tuple(acc), acc_sum, acc_count)


def histogram_quantile(q: float, hist: Histogram | None) -> float | None:
    """Prometheus ``histogram_quantile`` on cumulative buckets; None when there are no observations."""
    if hist is None or len(hist.bounds) < 2:
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    # Enforce monotonicity as Prometheus does (float drift between bucket increases).
    cumulative = []
    running = 0.0
    for c in hist.cumulative:
        running = max(running, c)
        cumulative.append(running)
    total = cumulative[-1]
    if not total > 0:
        return None
    rank = q * total
    idx = next(i for i, c in enumerate(cumulative) if c >= rank)
    if idx == len(cumulative) - 1:
        return hist.bounds[-2]
    upper = hist.bounds[idx]
    if idx == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = hist.bounds[idx - 1], cumulative[idx - 1]
    in_bucket = cumulative[idx] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


@dataclass(frozen=True, slots=True)
class Quantile:
    """A quantile from bucket counts, with the honesty the buckets allow.

    ``value`` is Prometheus's linear interpolation inside the bucket the rank falls in, between
    ``lower`` and ``upper``. In the first bucket nothing is known below its bound, so ``bound`` is
    "below" (read "< upper"); in the +Inf bucket only that it is above the last finite bound
    (``bound`` "above", read "> lower"). Elsewhere ``bound`` is None and ``value`` is a number.
    """

    value: float
    lower: float
    upper: float
    bound: str | None = None

    def reported(self) -> tuple[float, str | None]:
        """What a report may state: the number, or the bucket edge with "<" / ">"."""
        if self.bound == "below":
            return self.upper, "<"
        if self.bound == "above":
            return self.lower, ">"
        return self.value, None

    def over(self, threshold: float) -> bool:
        """Certainly or by interpolation above ``threshold``; never for a first-bucket bound."""
        if self.bound == "below":
            return False
        if self.bound == "above":
            return self.lower >= threshold
        return self.value > threshold


def quantile_estimate(q: float, hist: Histogram | None) -> Quantile | None:
    """:func:`histogram_quantile` with the bucket it came from; None when there are no observations."""
    value = histogram_quantile(q, hist)
    if value is None or hist is None or not 0 <= q <= 1:
        return None
    finite = hist.bounds[:-1]
    if value >= finite[-1] and hist.cumulative[-2] < q * hist.cumulative[-1]:
        return Quantile(value, finite[-1], math.inf, "above")
    idx = next((i for i, b in enumerate(finite) if value <= b), len(finite) - 1)
    if idx == 0:
        return Quantile(value, 0.0, finite[0], "below")
    return Quantile(value, finite[idx - 1], finite[idx])


def count_above(hist: Histogram | None, threshold: float) -> float:
    """Observations certainly above ``threshold``: those above the smallest bucket bound that is
    ≥ ``threshold`` (a bucket cannot say where inside it an observation fell, so this is a lower
    bound, never an interpolation). 0 for no histogram."""
    if hist is None or not hist.cumulative:
        return 0.0
    total = hist.cumulative[-1]
    at_or_below = next((c for b, c in zip(hist.bounds, hist.cumulative) if b >= threshold), total)
    return max(0.0, total - at_or_below)


def merge_histograms(hists: Sequence[Histogram | None]) -> Histogram | None:
    """The bucket-wise sum of interval deltas of one layout (others are skipped); None when empty."""
    present = [h for h in hists if h is not None]
    if not present:
        return None
    merged = present[0]
    for h in present[1:]:
        if h.bounds == merged.bounds:
            merged = merged.plus(h)
    return merged


def windowed_quantiles(
    scrapes: Sequence[Scrape], concept: str, qs: Sequence[float] = (0.5, 0.95, 0.99)
) -> dict[float, Quantile | None] | None:
    """Quantiles of the observations made inside the window; None when the server lacks the
    histogram, ``{q: None}`` when it has it but nothing was observed in the window."""
    if not any(s.snapshot is not None and s.snapshot.has(concept) for s in scrapes):
        return None
    delta = histogram_delta(scrapes, concept)
    return {q: quantile_estimate(q, delta) for q in qs}


def last_snapshot(history: Sequence[Scrape]) -> Scrape | None:
    for scrape in reversed(history):
        if scrape.snapshot is not None:
            return scrape
    return None


@dataclass(frozen=True, slots=True)
class SpecDecode:
    """Speculative decoding over a window, from vLLM's counters (``SpecDecodingProm``):
    acceptance rate = accepted / drafted tokens; mean accepted length = 1 + accepted / drafts (the
    tokens one verification step emits); per position, the share of drafts whose i-th token was
    accepted."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...]

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def num_speculative_tokens(self) -> int | None:
        return round(self.draft_tokens / self.drafts) if self.drafts else None

    @property
    def per_position_rate(self) -> tuple[float, ...]:
        return tuple(a / self.drafts for a in self.accepted_per_position) if self.drafts else ()


def labelled_increase(scrapes: Sequence[Scrape], concept: str) -> dict[str, float] | None:
    """How much each label of a labelled counter rose over the scrapes (reset-aware); None when the
    server does not export it."""
    labels: set[str] = set()
    for scrape in scrapes:
        if scrape.snapshot is not None:
            labels.update(scrape.snapshot.by_label(concept) or {})
    if not labels:
        return None
    out = {}
    for label in sorted(labels):
        points = _points(scrapes, _label_of(concept, label))
        out[label] = increase([p[1] for p in points], [p[2] for p in points]) if len(points) > 1 else 0.0
    return out


def labels_total(concept: str) -> Callable[[Snapshot], float | None]:
    """A labelled counter summed over its labels, as series builders pick it (None when absent)."""
    def pick(snap: Snapshot) -> float | None:
        values = snap.by_label(concept)
        return None if values is None else sum(values.values())
    return pick


def _label_of(concept: str, label: str) -> Callable[[Snapshot], float | None]:
    return lambda snap: (snap.by_label(concept) or {}).get(label)


SOURCE_NAMES = {"local_cache_hit": "local prefix cache", "local_compute": "computed",
                "external_kv_transfer": "external KV transfer"}


@dataclass(frozen=True, slots=True)
class PromptSources:
    """Where the window's prompt tokens came from (vLLM 0.16+ ``prompt_tokens_by_source``), counted
    at each request's first prefill only — a preempted request's recompute is not counted as a hit —
    and which cache tier supplied the hits (0.32+ ``prompt_tokens_cached_by_source``)."""

    by_source: dict[str, float]
    cached_by_tier: dict[str, float] | None

    @property
    def total(self) -> float:
        return sum(self.by_source.values())

    def share(self, source: str) -> float | None:
        return self.by_source.get(source, 0.0) / self.total if self.total else None


def prompt_sources(scrapes: Sequence[Scrape]) -> PromptSources | None:
    by_source = labelled_increase(scrapes, "prompt_tokens_by_source")
    if by_source is None:
        return None
    return PromptSources(by_source, labelled_increase(scrapes, "prompt_tokens_cached_by_source"))


def hit_rate_source(snapshot: Snapshot | None) -> str:
    """What the prefix hit rate is computed from, in words a reader can check."""
    if snapshot is not None and snapshot.has("prefix_cache_hits"):
        return ("prefix-cache hit tokens / queried tokens of new requests (vLLM counts a preempted request's "
                "re-hits apart, so recompute is not shown as sharing)")
    if snapshot is not None and snapshot.has("gpu_prefix_cache_hit_rate"):
        return "V0's lifetime block hit rate (it counts re-hits of preempted requests too)"
    return "not exported"


@dataclass(frozen=True, slots=True)
class Roofline:
    """What vLLM estimates each GPU did over a window (``estimated_*_per_gpu``, --enable-mfu-metrics):
    FLOP/s and memory bytes/s, and their ratio, the arithmetic intensity."""

    flops_per_second: float
    read_bytes_per_second: float
    write_bytes_per_second: float

    @property
    def bytes_per_second(self) -> float:
        return self.read_bytes_per_second + self.write_bytes_per_second

    @property
    def flops_per_byte(self) -> float | None:
        return self.flops_per_second / self.bytes_per_second if self.bytes_per_second else None


def roofline(scrapes: Sequence[Scrape]) -> Roofline | None:
    """None when the counters are absent or did not move (the server runs without --enable-mfu-metrics)."""
    rates = [counter_rate(scrapes, c) for c in
             ("estimated_flops_per_gpu", "estimated_read_bytes_per_gpu", "estimated_write_bytes_per_gpu")]
    flops, read, write = rates
    if flops is None or read is None or write is None or not (flops or read or write):
        return None
    return Roofline(flops, read, write)


def spec_decode(scrapes: Sequence[Scrape]) -> SpecDecode | None:
    """The window's speculative-decoding counters (None when the server does not speculate)."""
    drafts = counter_increase(scrapes, "spec_decode_num_drafts")
    tokens = counter_increase(scrapes, "spec_decode_num_draft_tokens")
    accepted = counter_increase(scrapes, "spec_decode_num_accepted_tokens")
    if drafts is None or tokens is None or accepted is None:
        return None
    by_position = labelled_increase(scrapes, "spec_decode_num_accepted_tokens_per_pos") or {}
    per_pos = tuple(by_position[p] for p in sorted(by_position, key=lambda p: int(p) if p.isdigit() else 0))
    return SpecDecode(drafts[0], tokens[0], accepted[0], per_pos)


@dataclass(frozen=True, slots=True)
class EngineState:
    """One engine of a data-parallel server: its gauges now and its token rates over the window."""

    engine: str
    model_name: str
    kv_cache_usage_perc: float | None
    num_requests_running: float | None
    num_requests_waiting: float | None
    generation_tokens_rate: float | None
    prompt_tokens_rate: float | None


@dataclass(frozen=True, slots=True)
class DerivedState:
    """What the engine is doing now: gauges from the last good scrape, rates and quantiles over
    the window. Every field is None when the server does not expose it."""

    ts: float | None
    window_seconds: float
    kv_cache_usage_perc: float | None
    kv_cache_used_blocks: float | None
    kv_cache_used_tokens: float | None
    num_requests_running: float | None
    num_requests_waiting: float | None
    num_requests_waiting_by_reason: dict[str, float] | None
    num_requests_swapped: float | None
    prefix_cache_hit_rate: float | None
    prefix_cache_queries_rate: float | None
    prefix_cache_hits_rate: float | None
    num_preemptions_rate: float | None
    num_preemptions_in_window: float | None
    prompt_tokens_rate: float | None
    generation_tokens_rate: float | None
    request_success_rate: dict[str, float] | None
    quantiles: dict[str, dict[float, Quantile | None] | None]
    cache_config: CacheConfig | None
    engines: tuple[EngineState, ...] = ()  # one per engine label, when the server has more than one
    asleep: dict[str, str] | None = None  # engine index → sleep state, for engines put to sleep now
    prompt_sources: PromptSources | None = None  # where prompt tokens came from (0.16+)
    roofline: Roofline | None = None  # vLLM's per-GPU work estimate (--enable-mfu-metrics)
    spec_decode: SpecDecode | None = None  # speculative decoding over the window

    def quantile(self, concept: str, q: float) -> Quantile | None:
        values = self.quantiles.get(concept)
        return None if values is None else values.get(q)


@dataclass(frozen=True, slots=True)
class SinceStart:
    """What the server's own counters say since its process started: the first scrape already knows
    it, before the dashboard has two scrapes to take a rate from."""

    started_at: float | None
    num_preemptions: float | None
    prefix_cache_hit_rate: float | None
    requests_finished: dict[str, float] | None


def since_start(snapshot: Snapshot) -> SinceStart:
    hits, queries = snapshot.value("prefix_cache_hits"), snapshot.value("prefix_cache_queries")
    rate = hits / queries if hits is not None and queries else None
    return SinceStart(snapshot.process_start_time_seconds, snapshot.value("num_preemptions"), rate,
                      snapshot.by_label("request_success"))


LATENCY_CONCEPTS = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
)


def _labelled_rates(scrapes: Sequence[Scrape], concept: str) -> dict[str, float] | None:
    by_label = [(s.ts, s.snapshot.by_label(concept)) for s in scrapes if s.snapshot is not None]
    present = [(ts, m) for ts, m in by_label if m is not None]
    if len(present) < 2 or present[-1][0] <= present[0][0]:
        return None
    labels = sorted({label for _, m in present for label in m})
    seconds = present[-1][0] - present[0][0]
    return {label: increase([m[label] for _, m in present if label in m]) / seconds for label in labels}


def derive_state(history: Sequence[Scrape], window_seconds: float = 60.0, end: float | None = None) -> DerivedState:
    """The derived state at ``end`` (default: the last scrape) over the trailing window."""
    scrapes = window(history, window_seconds, end)
    last = last_snapshot(scrapes)
    snap = last.snapshot if last is not None else None
    config = snap.cache_config if snap is not None else None

    def gauge(concept: str) -> float | None:
        return snap.value(concept) if snap is not None else None

    usage = gauge("kv_cache_usage_perc")
    blocks = tokens = None
    if usage is not None and config is not None and config.num_gpu_blocks:
        # vLLM's usage excludes the null block: usage = 1 - free / (num_gpu_blocks - 1).
        blocks = usage * (config.num_gpu_blocks - 1)
        if config.block_size:
            tokens = blocks * config.block_size
    preempt = counter_increase(scrapes, "num_preemptions")
    return DerivedState(
        ts=last.ts if last is not None else None,
        window_seconds=window_seconds,
        kv_cache_usage_perc=usage,
        kv_cache_used_blocks=blocks,
        kv_cache_used_tokens=tokens,
        num_requests_running=gauge("num_requests_running"),
        num_requests_waiting=gauge("num_requests_waiting"),
        num_requests_waiting_by_reason=snap.by_label("num_requests_waiting_by_reason") if snap else None,
        num_requests_swapped=gauge("num_requests_swapped"),
        prefix_cache_hit_rate=prefix_cache_hit_rate(scrapes),
        prefix_cache_queries_rate=counter_rate(scrapes, "prefix_cache_queries"),
        prefix_cache_hits_rate=counter_rate(scrapes, "prefix_cache_hits"),
        num_preemptions_rate=counter_rate(scrapes, "num_preemptions"),
        num_preemptions_in_window=preempt[0] if preempt is not None else None,
        prompt_tokens_rate=counter_rate(scrapes, "prompt_tokens"),
        generation_tokens_rate=counter_rate(scrapes, "generation_tokens"),
        request_success_rate=_labelled_rates(scrapes, "request_success"),
        quantiles={c: windowed_quantiles(scrapes, c) for c in LATENCY_CONCEPTS},
        cache_config=config,
        engines=_engine_states(scrapes, snap),
        asleep={key[1] or "0": level for key, level in snap.asleep().items()} if snap is not None else None,
        prompt_sources=prompt_sources(scrapes),
        roofline=roofline(scrapes),
        spec_decode=spec_decode(scrapes),
    )


def _engine_states(scrapes: Sequence[Scrape], snap: Snapshot | None) -> tuple[EngineState, ...]:
    if snap is None or len(snap.engines) < 2:
        return ()
    return tuple(
        EngineState(key[1], key[0], snap.value("kv_cache_usage_perc", key), snap.value("num_requests_running", key),
                    snap.value("num_requests_waiting", key), counter_rate(scrapes, "generation_tokens", key),
                    counter_rate(scrapes, "prompt_tokens", key))
        for key in snap.engines
    )


def counter_steps(
    scrapes: Sequence[Scrape], pick: Callable[[Snapshot], float | None]
) -> list[tuple[float, float, float]]:
    """``(previous ts, ts, increase)`` between consecutive scrapes that carry the counter (see
    :func:`counter_step`)."""
    points = [p for p in _points(scrapes, pick) if not math.isnan(p[1])]
    return [(t0, t1, counter_step(v0, v1, restart)) for (t0, v0, _), (t1, v1, restart) in zip(points, points[1:])]
