"""The rules engine: observed symptoms → findings with evidence and concrete `vllm serve` changes.

Input is a window of scrapes (live or recorded), what is known of the server's settings, optional
latency budgets and optional startup-log text. Output is a list of :class:`Finding` sorted by
severity. A rule that cannot run because a metric is absent says so in an ``info`` finding; a
symptom that came and went inside the window is still reported, with its time range.

Thresholds live in :class:`Thresholds` (table-driven tests vary them); the knob table rows each
finding rests on are in :mod:`diagnostics.core.knobs`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from diagnostics.core.catalog import CacheConfig, Histogram, Snapshot
from diagnostics.core.derive import (
    Scrape,
    counter_steps,
    histogram_delta,
    histogram_quantile,
    last_snapshot,
    restarted,
)
from diagnostics.core.info import ServerInfo
from diagnostics.core.logs import LogFacts, parse_log

Severity = Literal["critical", "warning", "info"]
Direction = Literal["increase", "decrease", "set"]
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True, slots=True)
class Suggestion:
    flag: str
    direction: Direction
    value: float | int | str | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"flag": self.flag, "direction": self.direction, "value": self.value, "why": self.why}


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    severity: Severity
    title: str
    evidence: dict[str, Any]
    suggestions: tuple[Suggestion, ...] = ()
    checks: tuple[str, ...] = ()
    time_range: tuple[float, float] | None = None
    knobs: tuple[str, ...] = ()
    chart: str | None = None  # the concept the page draws beside the evidence

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "suggestions": [s.to_json() for s in self.suggestions],
            "checks": list(self.checks),
            "time_range": list(self.time_range) if self.time_range else None,
            "knobs": list(self.knobs),
        }


@dataclass(frozen=True, slots=True)
class Budgets:
    ttft_ms: float | None = None
    itl_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """The server's current flags, as far as they are known (None = unknown)."""

    model: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    block_size: int | None = None
    tensor_parallel_size: int | None = None

    @classmethod
    def known(
        cls, config: CacheConfig | None, info: ServerInfo | None, log: LogFacts | None = None, **overrides: Any
    ) -> Settings:
        args = log.non_default_args if log is not None else {}
        settings = cls(
            model=(info.model if info else None) or _first_str(args.get("served_model_name")) or args.get("model"),
            max_model_len=(info.max_model_len if info else None) or _int(args.get("max_model_len")),
            max_num_seqs=_int(args.get("max_num_seqs")),
            max_num_batched_tokens=_int(args.get("max_num_batched_tokens")),
            gpu_memory_utilization=(config.gpu_memory_utilization if config else None)
            or _float(args.get("gpu_memory_utilization")),
            cache_dtype=(config.cache_dtype if config else None) or args.get("kv_cache_dtype"),
            enable_prefix_caching=config.enable_prefix_caching if config else _bool(args.get("enable_prefix_caching")),
            block_size=(config.block_size if config else None) or _int(args.get("block_size")),
            tensor_parallel_size=_int(args.get("tensor_parallel_size")),
        )
        return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def _first_str(value: Any) -> str | None:
    if isinstance(value, list) and value:
        return str(value[0])
    return str(value) if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Thresholds:
    kv_full_perc: float = 0.95  # KV usage counted as "near full"
    kv_low_perc: float = 0.80  # below this the KV cache is not what limits admission
    queue_min_seconds: float = 3.0  # waiting at the cap for at least this long
    stall_min_seconds: float = 5.0  # running > 0 and no new token for at least this long
    stall_min_scrapes: int = 3
    hol_spike_factor: float = 3.0  # interval ITL p90 over the window's median interval ITL p50
    hol_spike_min_seconds: float = 0.010
    hol_min_prefill_tokens: float = 512.0  # tokens prefilled (not from cache) in the spike interval
    hol_min_spikes: int = 2
    hol_coincide_fraction: float = 0.5
    sharing_hit_rate_low: float = 0.05
    episode_merge_seconds: float = 10.0
    max_gpu_memory_utilization: float = 0.95


# -- helpers over history --------------------------------------------------------------------------


def _ok(history: Sequence[Scrape]) -> list[tuple[Scrape, Snapshot]]:
    return [(s, s.snapshot) for s in history if s.snapshot is not None]


def _episodes(points: Sequence[tuple[float, bool]], merge_seconds: float = 0.0) -> list[tuple[float, float]]:
    """Contiguous runs of True as ``(first ts, last ts)``, merging runs closer than ``merge_seconds``."""
    runs: list[tuple[float, float]] = []
    start: float | None = None
    last: float | None = None
    for ts, flag in points:
        if flag:
            if start is None:
                start = ts
            last = ts
        elif start is not None and last is not None:
            runs.append((start, last))
            start = last = None
    if start is not None and last is not None:
        runs.append((start, last))
    merged: list[tuple[float, float]] = []
    for run in runs:
        if merged and run[0] - merged[-1][1] <= merge_seconds:
            merged[-1] = (merged[-1][0], run[1])
        else:
            merged.append(run)
    return merged


def _increments(
    history: Sequence[Scrape], pick: Callable[[Snapshot], float | None]
) -> list[tuple[float, float | None]]:
    """Per scrape carrying the counter: its increase since the previous one (None for the first)."""
    steps = counter_steps(history, pick)
    return ([(steps[0][0], None)] if steps else []) + [(t1, inc) for _, t1, inc in steps]


def _span(history: Sequence[Scrape]) -> dict[str, float]:
    return {"start": history[0].ts, "end": history[-1].ts, "seconds": round(history[-1].ts - history[0].ts, 3)}


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _absent(concept: str, rule: str, why: str) -> Finding:
    return Finding(
        id=f"absent:{rule}",
        severity="info",
        title=f"Cannot check {rule.replace('_', ' ')}: this server does not expose {concept}",
        evidence={"missing": concept},
        checks=(why,),
    )


def _mean_from(hist: Histogram | None) -> float | None:
    if hist is None or hist.count <= 0 or math.isnan(hist.sum):
        return None
    return hist.sum / hist.count


# -- rules -----------------------------------------------------------------------------------------


def rule_outage(history: Sequence[Scrape], t: Thresholds) -> list[Finding]:
    """Failed scrapes: the server was unreachable, timed out, answered errors, or its engine died."""
    points = [(s.ts, s.snapshot is None) for s in history]
    findings = []
    for start, end in _episodes(points):
        errors = sorted({s.error or "failed" for s in history if s.snapshot is None and start <= s.ts <= end})
        ongoing = history[-1].snapshot is None and history[-1].ts == end
        engine_dead = any("503" in e or "unhealthy" in e for e in errors)
        title = ("Engine dead (/health 503)" if engine_dead else "Server unreachable") + (
            f" since {_fmt_s(end - start)} ago" if ongoing else f" for {_fmt_s(end - start)}, then recovered"
        )
        findings.append(
            Finding(
                id="server_down",
                severity="critical",
                title=title,
                evidence={"failed_scrapes": sum(1 for s in history if s.snapshot is None and start <= s.ts <= end),
                          "errors": errors[:5], "ongoing": ongoing, "window": _span(history)},
                checks=(
                    "Is the process alive? Read the last lines of its log: an OOM, EngineDeadError or a traceback "
                    "names the cause (python -m diagnostics diagnose --log FILE parses it).",
                    "After a restart, compare the flags with the last good run before changing anything.",
                ),
                time_range=(start, end),
                knobs=("down",),
            )
        )
    ok = _ok(history)
    for (_, a), (scrape, b) in zip(ok, ok[1:]):
        if restarted(a, b):
            findings.append(
                Finding(
                    id="server_restarted",
                    severity="info",
                    title="The server restarted inside the window",
                    evidence={"process_start_time_seconds": b.process_start_time_seconds, "seen_at": scrape.ts},
                    time_range=(scrape.ts, scrape.ts),
                )
            )
    return findings


def rule_stall(history: Sequence[Scrape], t: Thresholds) -> list[Finding]:
    """Requests running, no token produced for several intervals, while the server still answers."""
    ok = _ok(history)
    if not any(snap.has("generation_tokens") for _, snap in ok):
        return [_absent("vllm:generation_tokens_total", "silent_stall", "Token production cannot be followed.")]
    increments = dict(_increments(history, lambda s: s.value("generation_tokens")))
    points = []
    for scrape, snap in ok:
        running = snap.value("num_requests_running") or 0
        inc = increments.get(scrape.ts)
        points.append((scrape.ts, running > 0 and inc is not None and inc == 0))
    findings = []
    for start, end in _episodes(points):
        # The stall began at the last scrape that still saw tokens move.
        before = [ts for ts, _ in points if ts < start]
        began = before[-1] if before else start
        in_run = [ts for ts, flag in points if flag and start <= ts <= end]
        if end - began < t.stall_min_seconds or len(in_run) < t.stall_min_scrapes:
            continue
        running = max((snap.value("num_requests_running") or 0) for s, snap in ok if start <= s.ts <= end)
        ongoing = ok[-1][0].ts == end
        findings.append(
            Finding(
                id="silent_stall",
                severity="critical",
                title=f"Silent stall: {running:.0f} requests running, no token for {_fmt_s(end - began)}"
                + (" (ongoing)" if ongoing else ", then tokens resumed"),
                evidence={"num_requests_running": running, "seconds_without_tokens": round(end - began, 3),
                          "scrapes": len(in_run), "ongoing": ongoing, "window": _span(history)},
                checks=(
                    "The frontend still answers /metrics (and /health), but the engine produces nothing: dump the "
                    "EngineCore stacks (py-spy dump --pid <EngineCore pid>) before restarting.",
                    "Look for a stopped or swapping process, a hung GPU (nvidia-smi), or a stuck collective (TP/PP).",
                ),
                time_range=(began, end),
                knobs=("stall",),
                chart="generation_tokens",
            )
        )
    return findings


def _suggest_more_kv(settings: Settings, t: Thresholds, demand_tokens: float | None) -> list[Suggestion]:
    out = []
    util = settings.gpu_memory_utilization
    if util is None or util < t.max_gpu_memory_utilization:
        target = min(t.max_gpu_memory_utilization, round((util or 0.9) + 0.05, 2))
        out.append(Suggestion("--gpu-memory-utilization", "increase", target,
                              "More of the GPU for the KV cache, if nothing else shares the GPU."))
    if settings.cache_dtype in (None, "auto", "bfloat16", "float16", "half"):
        out.append(Suggestion("--kv-cache-dtype", "set", "fp8",
                              "Halves KV bytes per token, so twice the tokens fit; check accuracy on your evals."))
    value = int(math.ceil(demand_tokens * 1.25 / 256) * 256) if demand_tokens else None
    if settings.max_model_len and value and value < settings.max_model_len:
        out.append(Suggestion("--max-model-len", "decrease", value,
                              f"Requests here use about {demand_tokens:,.0f} tokens (p99 prompt + output); a "
                              "shorter maximum lets the scheduler reserve less per sequence."))
    out.append(Suggestion("--tensor-parallel-size", "increase", None,
                          "With more GPUs, each holds a slice of the weights and KV heads: more room for KV."))
    return out


def rule_kv_pressure(history: Sequence[Scrape], settings: Settings, t: Thresholds) -> list[Finding]:
    """Preemptions while the KV cache is near full: more KV capacity or fewer sequences, never more."""
    ok = _ok(history)
    if not any(snap.has("num_preemptions") for _, snap in ok):
        if any(snap.has("num_requests_swapped") for _, snap in ok):
            return []  # V0: swapped requests; not judged here
        return [_absent("vllm:num_preemptions_total", "kv_pressure", "Preemption cannot be counted (vLLM < 0.8.5).")]
    incs = _increments(history, lambda s: s.value("num_preemptions"))
    points = [(ts, (inc or 0) > 0) for ts, inc in incs]
    episodes = _episodes(points, t.episode_merge_seconds)
    if not episodes:
        return []
    total = sum(inc or 0 for _, inc in incs)
    usage = [snap.value("kv_cache_usage_perc") for _, snap in ok]
    max_usage = max((u for u in usage if u is not None), default=None)
    waiting = max((snap.value("num_requests_waiting") or 0) for _, snap in ok)
    first_ts = episodes[0][0]
    running_at_onset = next(
        ((snap.value("num_requests_running") or 0) for s, snap in ok if s.ts >= first_ts), None
    )
    seconds = max(history[-1].ts - history[0].ts, 1e-9)
    prompt_p99 = histogram_quantile(0.99, histogram_delta(history, "request_prompt_tokens"))
    gen_p99 = histogram_quantile(0.99, histogram_delta(history, "request_generation_tokens"))
    demand = (prompt_p99 or 0) + (gen_p99 or 0) or None
    suggestions = _suggest_more_kv(settings, t, demand)
    if running_at_onset:
        suggestions.append(
            Suggestion("--max-num-seqs", "decrease", max(1, int(running_at_onset * 0.75)),
                       f"Preemption began with {running_at_onset:.0f} running; fewer concurrent sequences need "
                       "fewer blocks (the opposite of raising it).")
        )
    near_full = max_usage is not None and max_usage >= t.kv_full_perc
    severe = near_full and waiting > 0 and total / seconds >= 1.0
    return [
        Finding(
            id="kv_pressure",
            severity="critical" if severe else "warning",
            title=f"KV-cache pressure: {total:.0f} preemptions"
            + (f", KV usage up to {max_usage * 100:.0f} %" if max_usage is not None else "")
            + (f", up to {waiting:.0f} waiting" if waiting else ""),
            evidence={"preemptions": total, "preemptions_per_second": round(total / seconds, 4),
                      "max_kv_cache_usage_perc": max_usage, "max_num_requests_waiting": waiting,
                      "num_requests_running_at_onset": running_at_onset, "episodes": len(episodes),
                      "window": _span(history)},
            suggestions=tuple(suggestions),
            checks=(
                "Confirm preemptions line up with KV usage near 100 % on the chart (not a one-off burst).",
                "Do not raise --max-num-seqs for this: more sequences need more blocks and preempt more.",
                "Check the KV capacity against the workload (tokens per request × concurrency) before and after.",
            ),
            time_range=(episodes[0][0], episodes[-1][1]),
            knobs=("preemption",),
            chart="kv_cache_usage_perc",
        )
    ]


def rule_queue_at_cap(
    history: Sequence[Scrape], settings: Settings, t: Thresholds, stalls: Sequence[tuple[float, float]] = ()
) -> list[Finding]:
    """Waiting requests while running sits at its cap and the KV cache has room: raise --max-num-seqs.

    Intervals inside a stall are left out: when no token moves, the cap is not what queues."""
    ok = _ok(history)
    if not any(snap.has("num_requests_waiting") for _, snap in ok):
        return [_absent("vllm:num_requests_waiting", "queueing", "Queueing cannot be seen.")]
    running = [snap.value("num_requests_running") or 0 for _, snap in ok]
    cap = settings.max_num_seqs or (max(running) if running else 0)
    if cap <= 0:
        return []
    points = []
    for scrape, snap in ok:
        by_reason = snap.by_label("num_requests_waiting_by_reason") or {}
        waiting = by_reason.get("capacity", snap.value("num_requests_waiting") or 0)
        usage = snap.value("kv_cache_usage_perc")
        at_cap = (snap.value("num_requests_running") or 0) >= cap
        stalled = any(a <= scrape.ts <= b for a, b in stalls)
        points.append((scrape.ts, waiting > 0 and at_cap and not stalled and (usage is None or usage < t.kv_low_perc)))
    episodes = [e for e in _episodes(points, 2.0) if e[1] - e[0] >= t.queue_min_seconds]
    if not episodes:
        return []
    in_ep = [(s, snap) for s, snap in ok if any(a <= s.ts <= b for a, b in episodes)]
    peak_waiting = max(snap.value("num_requests_waiting") or 0 for _, snap in in_ep)
    max_usage = max((snap.value("kv_cache_usage_perc") or 0) for _, snap in in_ep)
    seconds = sum(b - a for a, b in episodes)
    target = int(cap + peak_waiting)
    known = settings.max_num_seqs is not None
    return [
        Finding(
            id="queue_at_cap",
            severity="warning",
            title=f"Queueing at the concurrency cap: {cap:.0f} running, up to {peak_waiting:.0f} waiting, "
            f"KV usage ≤ {max_usage * 100:.0f} %",
            evidence={"num_requests_running_cap": cap, "cap_known_from_flags": known,
                      "max_num_requests_waiting": peak_waiting, "max_kv_cache_usage_perc": max_usage,
                      "seconds_queued_at_cap": round(seconds, 3), "window": _span(history)},
            suggestions=(
                Suggestion("--max-num-seqs", "increase", target,
                           f"Running sat at {cap:.0f} for {_fmt_s(seconds)} with up to {peak_waiting:.0f} waiting while "
                           f"the KV cache stayed ≤ {max_usage * 100:.0f} % full: the cap, not memory, is what queues."),
            ),
            checks=(
                "Confirm KV usage stays below ~90 % after raising the cap; if it fills, this turns into preemption.",
                "A larger batch raises ITL: keep the new cap within your ITL budget (the defended batch size).",
                "If waiting is 'deferred' rather than 'capacity', the cause is LoRA or KV-transfer limits instead.",
            ),
            time_range=(episodes[0][0], episodes[-1][1]),
            knobs=("queue-at-cap",),
            chart="num_requests_waiting",
        )
    ]


def _interval_itl(history: Sequence[Scrape]) -> list[tuple[float, float | None, float | None, float]]:
    """Per interval between scrapes: (ts, ITL p50, ITL p90, computed prefill tokens)."""
    ok = _ok(history)
    out = []
    for (_, a), (b_scrape, b) in zip(ok, ok[1:]):
        ha, hb = a.histogram("inter_token_latency_seconds"), b.histogram("inter_token_latency_seconds")
        if ha is None or hb is None or ha.bounds != hb.bounds or hb.count < ha.count or restarted(a, b):
            continue
        delta = Histogram(hb.bounds, tuple(y - x for x, y in zip(ha.cumulative, hb.cumulative)), 0.0,
                          hb.count - ha.count)
        prompt = _delta(a, b, "prompt_tokens")
        cached = _delta(a, b, "prefix_cache_hits") or 0.0
        computed = max(0.0, (prompt or 0.0) - cached)
        out.append((b_scrape.ts, histogram_quantile(0.5, delta), histogram_quantile(0.9, delta), computed))
    return out


def _delta(a: Snapshot, b: Snapshot, concept: str) -> float | None:
    va, vb = a.value(concept), b.value(concept)
    if va is None or vb is None:
        return None
    return vb - va if vb >= va else vb


def rule_head_of_line(history: Sequence[Scrape], settings: Settings, t: Thresholds) -> list[Finding]:
    """ITL spikes that coincide with large prefills: lower the chunked-prefill budget, not the batch."""
    intervals = _interval_itl(history)
    if not intervals:
        return []
    p50s = [p50 for _, p50, _, _ in intervals if p50 is not None]
    if len(p50s) < 3:
        return []
    baseline = statistics.median(p50s)
    # The frontend updates the token counters and the ITL histogram asynchronously, so a prefill and
    # the ITL spike it causes can land in neighbouring scrape intervals: a prefill counts for its
    # own interval and the ones on either side.
    spikes = []
    for i, (ts, _, p90, _) in enumerate(intervals):
        if p90 is not None and p90 > t.hol_spike_factor * baseline and p90 - baseline > t.hol_spike_min_seconds:
            prefilled = max(intervals[j][3] for j in range(max(0, i - 1), min(len(intervals), i + 2)))
            spikes.append((ts, p90, prefilled))
    coinciding = [s for s in spikes if s[2] >= t.hol_min_prefill_tokens]
    if len(coinciding) < t.hol_min_spikes or len(coinciding) < t.hol_coincide_fraction * len(spikes):
        return []
    worst = max(p90 for _, p90, _ in coinciding)
    min_tokens = min(tokens for _, _, tokens in coinciding)
    current = settings.max_num_batched_tokens
    if current:
        value = max(256, current // 2)
    else:
        # Unknown budget: chunks of a quarter of the smallest blocking prefill, as a power of two.
        value = max(256, 2 ** int(math.log2(max(256.0, min_tokens / 4))))
    return [
        Finding(
            id="head_of_line_blocking",
            severity="warning",
            title=f"Head-of-line blocking: ITL spikes to {worst * 1000:.0f} ms (baseline {baseline * 1000:.0f} ms) "
            f"whenever large prompts are prefilled",
            evidence={"itl_baseline_p50_seconds": baseline, "itl_spike_p90_seconds": worst,
                      "spike_intervals": len(spikes), "spikes_with_prefill": len(coinciding),
                      "min_prefill_tokens_in_spike": min_tokens, "window": _span(history)},
            suggestions=(
                Suggestion("--max-num-batched-tokens", "decrease", value,
                           "A smaller chunked-prefill budget splits long prompts into smaller chunks, so each step "
                           "that carries a prefill delays the decoding sequences less (vLLM: 'Smaller values (e.g., "
                           "2048) achieve better ITL')."),
            ),
            checks=(
                "This is the chunk size, not the batch size: do not lower --max-num-seqs for it.",
                "Chunked prefill is on by default in V1; make sure it was not disabled.",
                "A smaller chunk raises TTFT of the long prompts: check the TTFT budget after the change.",
            ),
            time_range=(coinciding[0][0], coinciding[-1][0]),
            knobs=("head-of-line",),
            chart="inter_token_latency_seconds",
        )
    ]


def rule_slow_decode(
    history: Sequence[Scrape], settings: Settings, budgets: Budgets, hol_fired: bool, t: Thresholds
) -> list[Finding]:
    """ITL over the budget without prefill pressure: the batch is larger than the budget defends."""
    ok = _ok(history)
    if not any(snap.has("inter_token_latency_seconds") for _, snap in ok):
        return [_absent("vllm:inter_token_latency_seconds", "decode_speed", "Decode latency cannot be measured.")]
    p95 = histogram_quantile(0.95, histogram_delta(history, "inter_token_latency_seconds"))
    if p95 is None:
        return []
    if budgets.itl_ms is None:
        return [Finding(id="itl_budget_unset", severity="info",
                        title=f"ITL p95 is {p95 * 1000:.0f} ms; no ITL budget given, so decode speed is not judged",
                        evidence={"itl_p95_seconds": p95, "window": _span(history)},
                        checks=("Pass --itl-budget-ms (CLI) or set the budget on the Diagnose page.",))]
    if p95 * 1000 <= budgets.itl_ms or hol_fired:
        return []
    # The defended batch size: the largest running level whose intervals kept ITL within budget.
    running_by_ts = {s.ts: snap.value("num_requests_running") or 0 for s, snap in ok}
    within = [running_by_ts.get(ts, 0) for ts, p50, _, _ in _interval_itl(history)
              if p50 is not None and p50 * 1000 <= budgets.itl_ms]
    defended = int(max(within)) if within and max(within) > 0 else None
    peak = max(running_by_ts.values(), default=0)
    suggestions = [
        Suggestion("--max-num-seqs", "decrease", defended,
                   (f"ITL stayed within {budgets.itl_ms:g} ms up to {defended} running; it peaked at {peak:.0f}."
                    if defended else "Fewer sequences per step make each decode step shorter.")),
        Suggestion("--quantization", "set", None,
                   "Smaller weights are read faster each step, if measured accuracy allows (a quantized checkpoint)."),
    ]
    if settings.cache_dtype in (None, "auto", "bfloat16", "float16", "half"):
        suggestions.append(Suggestion("--kv-cache-dtype", "set", "fp8",
                                      "Fewer KV bytes read per decode step, if accuracy allows."))
    return [
        Finding(
            id="slow_decode",
            severity="warning",
            title=f"Decode slower than the budget: ITL p95 {p95 * 1000:.0f} ms > {budgets.itl_ms:g} ms",
            evidence={"itl_p95_seconds": p95, "itl_budget_ms": budgets.itl_ms, "peak_num_requests_running": peak,
                      "defended_num_requests_running": defended, "window": _span(history)},
            suggestions=tuple(suggestions),
            checks=(
                "First --max-num-seqs against the batch size your ITL budget defends; only then weigh "
                "quantization or fp8 KV, on measured numbers.",
                "Rule out a CPU-bound host (GPU utilisation low while ITL is high).",
            ),
            time_range=(history[0].ts, history[-1].ts),
            knobs=("decode-slow",),
            chart="inter_token_latency_seconds",
        )
    ]


def rule_ttft(history: Sequence[Scrape], settings: Settings, budgets: Budgets, t: Thresholds) -> list[Finding]:
    """TTFT over budget, split into queue-dominated and prefill-dominated (different knobs)."""
    ok = _ok(history)
    if not any(snap.has("time_to_first_token_seconds") for _, snap in ok):
        return [_absent("vllm:time_to_first_token_seconds", "ttft", "TTFT cannot be measured.")]
    p95 = histogram_quantile(0.95, histogram_delta(history, "time_to_first_token_seconds"))
    if p95 is None or budgets.ttft_ms is None or p95 * 1000 <= budgets.ttft_ms:
        return []
    queue = _mean_from(histogram_delta(history, "request_queue_time_seconds"))
    prefill = _mean_from(histogram_delta(history, "request_prefill_time_seconds"))
    usage = max((snap.value("kv_cache_usage_perc") or 0) for _, snap in ok)
    evidence = {"ttft_p95_seconds": p95, "ttft_budget_ms": budgets.ttft_ms, "mean_queue_seconds": queue,
                "mean_prefill_seconds": prefill, "max_kv_cache_usage_perc": usage, "window": _span(history)}
    if queue is not None and prefill is not None and queue >= prefill:
        if usage < t.kv_low_perc:
            cap = settings.max_num_seqs or max((snap.value("num_requests_running") or 0) for _, snap in ok)
            waiting = max((snap.value("num_requests_waiting") or 0) for _, snap in ok)
            suggestion = Suggestion("--max-num-seqs", "increase", int(cap + waiting) if cap else None,
                                    "Requests wait for a slot while the KV cache has room.")
        else:
            suggestion = _suggest_more_kv(settings, t, None)[0]
        return [Finding(
            id="ttft_queue_dominated", severity="warning",
            title=f"TTFT p95 {p95 * 1000:.0f} ms > {budgets.ttft_ms:g} ms, mostly queue time "
            f"({queue * 1000:.0f} ms queued vs {prefill * 1000:.0f} ms prefill on average)",
            evidence=evidence, suggestions=(suggestion,),
            checks=("A capacity problem: see the queueing and KV-pressure findings for which resource is short.",),
            time_range=(history[0].ts, history[-1].ts), knobs=("ttft-queue",), chart="time_to_first_token_seconds",
        )]
    current = settings.max_num_batched_tokens
    suggestions = [Suggestion("--max-num-batched-tokens", "increase", current * 2 if current else None,
                              "More prefill tokens per step shorten long prompts' prefill (at some ITL cost).")]
    if settings.enable_prefix_caching is False:
        suggestions.append(Suggestion("--enable-prefix-caching", "set", None,
                                      "Repeated prefixes are then served from cache instead of recomputed."))
    return [Finding(
        id="ttft_prefill_dominated", severity="warning",
        title=f"TTFT p95 {p95 * 1000:.0f} ms > {budgets.ttft_ms:g} ms, mostly prefill time",
        evidence=evidence, suggestions=tuple(suggestions),
        checks=("Check the prefix-cache hit rate: shared system prompts should hit.",
                "A larger prefill budget can raise ITL for running sequences (head-of-line blocking)."),
        time_range=(history[0].ts, history[-1].ts), knobs=("ttft-prefill",), chart="time_to_first_token_seconds",
    )]


def rule_sharing(history: Sequence[Scrape], settings: Settings, t: Thresholds) -> list[Finding]:
    """Parallel samples (n > 1) without block sharing: prefix caching off, or on but never hitting."""
    n_hist = histogram_delta(history, "request_params_n")
    if n_hist is None:
        return []
    le1 = next((c for b, c in zip(n_hist.bounds, n_hist.cumulative) if b >= 1.0), 0.0)
    parallel = n_hist.cumulative[-1] - le1
    if parallel <= 0:
        return []
    mean_n = _mean_from(n_hist)
    evidence: dict[str, Any] = {"requests_with_n_gt_1": parallel, "mean_n": mean_n,
                                "enable_prefix_caching": settings.enable_prefix_caching, "window": _span(history)}
    checks = (
        "Verify sharing is actually happening before touching batch size or memory utilization.",
        "vLLM V1 shares the prompt's full blocks across the n samples through the prefix cache; the partial last "
        "block is each sample's own.",
    )
    if settings.enable_prefix_caching is False:
        return [Finding(
            id="sharing_disabled", severity="warning",
            title=f"{parallel:.0f} requests sampled n > 1 (mean n {mean_n:.1f}) with prefix caching off: each "
            "sample holds its own copy of the prompt's blocks",
            evidence=evidence,
            suggestions=(Suggestion("--enable-prefix-caching", "set", None,
                                    "The n samples of one prompt then share its full blocks instead of n copies."),),
            checks=checks, time_range=(history[0].ts, history[-1].ts), knobs=("sharing-wasted",),
            chart="kv_cache_usage_perc",
        )]
    hits = sum(inc or 0 for _, inc in _increments(history, lambda s: s.value("prefix_cache_hits")))
    queries = sum(inc or 0 for _, inc in _increments(history, lambda s: s.value("prefix_cache_queries")))
    prompt_p50 = histogram_quantile(0.5, histogram_delta(history, "request_prompt_tokens"))
    block = settings.block_size or 16
    if queries > 0 and hits / queries < t.sharing_hit_rate_low and prompt_p50 is not None and prompt_p50 >= 2 * block:
        evidence.update({"prefix_cache_hit_rate": hits / queries, "prompt_tokens_p50": prompt_p50})
        return [Finding(
            id="sharing_not_happening", severity="warning",
            title=f"n > 1 sampling but the prefix-cache hit rate is {hits / queries * 100:.1f} %: samples are not "
            "sharing prompt blocks",
            evidence=evidence, checks=checks, time_range=(history[0].ts, history[-1].ts),
            knobs=("sharing-wasted",), chart="prefix_cache_hit_rate",
        )]
    return []


_LOG_RULES: dict[str, tuple[str, str]] = {
    "kv_too_small": ("KV cache too small for --max-model-len: the server cannot start", "kv-too-small-for-context"),
    "no_kv_memory": ("No memory left for the KV cache: the server cannot start", "wont-start"),
    "autofit_impossible": ("Not enough memory to auto-fit any context length", "wont-start"),
    "free_memory_low": ("Less free device memory than --gpu-memory-utilization asks for", "wont-start"),
    "profiling_changed": ("GPU memory changed during profiling (another process on the GPU)", "wont-start"),
    "oom_model_load": ("Out of memory while loading the weights", "wont-start"),
    "oom_sampler": ("Out of memory warming up the sampler", "wont-start"),
    "cuda_oom": ("CUDA out of memory", "wont-start"),
    "engine_dead": ("Engine core died at startup", "down"),
}


def rule_log(log: LogFacts, settings: Settings, t: Thresholds) -> list[Finding]:
    findings = []
    for error in log.errors:
        title, knob = _LOG_RULES[error.kind]
        n = error.numbers
        util = settings.gpu_memory_utilization
        up = Suggestion("--gpu-memory-utilization", "increase",
                        min(t.max_gpu_memory_utilization, round((util or 0.9) + 0.05, 2)),
                        "Gives the KV cache more of the device.")
        suggestions: list[Suggestion]
        if error.kind == "kv_too_small":
            estimated = int(n["estimated_max_model_len"]) if "estimated_max_model_len" in n else None
            suggestions = [
                Suggestion("--max-model-len", "decrease", estimated,
                           f"vLLM estimates {estimated:,} tokens fit in the KV memory it has." if estimated
                           else "A shorter context needs fewer KV blocks per request."),
                up,
                Suggestion("--kv-cache-dtype", "set", "fp8", "Twice the tokens in the same KV memory."),
            ]
        elif error.kind in ("no_kv_memory", "autofit_impossible"):
            suggestions = [up, Suggestion("--quantization", "set", None, "Smaller weights leave room for KV."),
                           Suggestion("--tensor-parallel-size", "increase", None, "Spread the weights over GPUs.")]
        elif error.kind == "free_memory_low":
            free, total = n.get("free_gib"), n.get("total_gib")
            value = round(max(0.05, free / total - 0.02), 2) if free and total else None
            suggestions = [Suggestion("--gpu-memory-utilization", "decrease", value,
                                      f"Only {free} of {total} GiB is free on the device (another process holds "
                                      "the rest)." if free else "Ask for no more than is free.")]
        elif error.kind == "oom_model_load":
            suggestions = [
                Suggestion("--gpu-memory-utilization", "decrease", None, "vLLM: free memory for the weights."),
                Suggestion("--tensor-parallel-size", "increase", None, "Each GPU holds a slice of the weights."),
                Suggestion("--quantization", "set", None, "Smaller weights."),
            ]
        elif error.kind == "oom_sampler":
            reqs = int(n.get("num_reqs", 0)) or None
            suggestions = [Suggestion("--max-num-seqs", "decrease", reqs // 2 if reqs else None,
                                      "The sampler warm-up runs max-num-seqs dummy requests."),
                           Suggestion("--gpu-memory-utilization", "decrease", None, "Leave activation headroom.")]
        elif error.kind == "cuda_oom":
            suggestions = [up, Suggestion("--quantization", "set", None, "If it still does not fit at ~0.95."),
                           Suggestion("--tensor-parallel-size", "increase", None, "Or spread the model.")]
        else:
            suggestions = []
        findings.append(Finding(
            id=f"startup_{error.kind}", severity="critical", title=title,
            evidence={"log_line": error.line_no, "message": error.text, **{k: v for k, v in n.items()},
                      **({"vllm_version": log.version} if log.version else {})},
            suggestions=tuple(suggestions),
            checks=("Apply one change at a time and re-read the startup log's 'KV cache size' line.",),
            knobs=(knob,),
        ))
    return findings


def diagnose(
    history: Sequence[Scrape],
    *,
    info: ServerInfo | None = None,
    budgets: Budgets = Budgets(),
    log_text: str | None = None,
    settings: Settings | None = None,
    thresholds: Thresholds = Thresholds(),
) -> list[Finding]:
    """Every rule over the window; findings sorted by severity, then time."""
    log = parse_log(log_text) if log_text else None
    last = last_snapshot(history)
    config = last.snapshot.cache_config if last is not None and last.snapshot is not None else None
    known = settings or Settings.known(config, info, log)
    findings: list[Finding] = []
    if log is not None:
        findings += rule_log(log, known, thresholds)
    if history:
        findings += rule_outage(history, thresholds)
        if _ok(history):
            stalls = rule_stall(history, thresholds)
            findings += stalls
            findings += rule_kv_pressure(history, known, thresholds)
            findings += rule_queue_at_cap(history, known, thresholds, [f.time_range for f in stalls if f.time_range])
            hol = rule_head_of_line(history, known, thresholds)
            findings += hol
            findings += rule_slow_decode(history, known, budgets, bool(hol), thresholds)
            findings += rule_ttft(history, known, budgets, thresholds)
            findings += rule_sharing(history, known, thresholds)
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.time_range[0] if f.time_range else 0))


def exit_code(findings: Sequence[Finding]) -> int:
    """0 = nothing above info, 1 = a warning, 2 = a critical finding."""
    worst = min((SEVERITY_ORDER[f.severity] for f in findings), default=2)
    return {0: 2, 1: 1}.get(worst, 0)


@dataclass(frozen=True, slots=True)
class CommandDiff:
    before: str
    after: str


def command_diff(settings: Settings, suggestions: Sequence[Suggestion]) -> CommandDiff:
    """The `vllm serve` line before and after the suggested changes (unknown values shown as <…>)."""
    current: dict[str, str | None] = {}
    if settings.max_model_len:
        current["--max-model-len"] = str(settings.max_model_len)
    if settings.max_num_seqs:
        current["--max-num-seqs"] = str(settings.max_num_seqs)
    if settings.max_num_batched_tokens:
        current["--max-num-batched-tokens"] = str(settings.max_num_batched_tokens)
    if settings.gpu_memory_utilization is not None:
        current["--gpu-memory-utilization"] = f"{settings.gpu_memory_utilization:g}"
    if settings.cache_dtype and settings.cache_dtype != "auto":
        current["--kv-cache-dtype"] = settings.cache_dtype
    if settings.tensor_parallel_size:
        current["--tensor-parallel-size"] = str(settings.tensor_parallel_size)
    if settings.enable_prefix_caching is False:
        current["--no-enable-prefix-caching"] = None
    after = dict(current)
    for s in suggestions:
        if s.flag == "--enable-prefix-caching":
            after.pop("--no-enable-prefix-caching", None)
            after["--enable-prefix-caching"] = None
            continue
        if s.value is not None:
            after[s.flag] = f"{s.value:g}" if isinstance(s.value, float) else str(s.value)
        else:
            old = current.get(s.flag)
            arrow = {"increase": "↑", "decrease": "↓", "set": ""}[s.direction]
            after[s.flag] = f"<{old}{arrow}>" if old else f"<{'value' if s.direction == 'set' else arrow}>"

    def line(flags: dict[str, str | None]) -> str:
        parts = [f"vllm serve {settings.model or '<model>'}"]
        parts += [k if v is None else f"{k} {v}" for k, v in flags.items()]
        return " ".join(parts)

    return CommandDiff(line(current), line(after))
