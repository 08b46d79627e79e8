"""The KV cache: preemption because it is full, the changes that give it more room on this server,
and n > 1 samples that hold copies of one prompt's blocks instead of sharing them."""

from __future__ import annotations

import math
from typing import Any

from diagnostics.core.diagnosis.causes import Differential, Ruling, differential
from diagnostics.core.diagnosis.context import Context, episodes
from diagnostics.core.diagnosis.rules.common import absent, exposes, max_gauge, mean_from, whole
from diagnostics.core.diagnosis.types import Finding, KnownFlags, Suggestion, Thresholds
from diagnostics.core.metrics.catalog import Snapshot
from diagnostics.core.metrics.derive import counter_increase, histogram_delta, histogram_quantile, labelled_increase
from diagnostics.core.text import fmt_bytes

# vLLM's own defaults, for a server whose flags are not known.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
VLLM_DEFAULT_BLOCK_SIZE = 16


def more_kv_capacity(flags: KnownFlags, t: Thresholds) -> Suggestion | None:
    """The change that gives the KV cache more room on *this* server: raise the pin when the KV size
    is pinned (vLLM then ignores --gpu-memory-utilization for it), else the utilization."""
    if flags.num_gpu_blocks_override:
        blocks = flags.num_gpu_blocks_override
        return Suggestion("--num-gpu-blocks-override", "increase", int(math.ceil(blocks * t.kv_pin_raise_factor)),
                          f"The KV cache is pinned at {blocks:,} blocks by --num-gpu-blocks-override: neither "
                          "--gpu-memory-utilization nor --kv-cache-dtype changes it while the override is set "
                          "(raise it within the device's memory, or drop it).")
    if flags.kv_cache_memory_bytes:
        size = flags.kv_cache_memory_bytes
        value = int(math.ceil(size * t.kv_pin_raise_factor / 2**20)) * 2**20
        return Suggestion("--kv-cache-memory-bytes", "increase", value,
                          f"The KV cache is pinned at {fmt_bytes(size)} by --kv-cache-memory-bytes, so "
                          "--gpu-memory-utilization is ignored for its size (raise it within the device's "
                          "memory, or drop it; on the CPU backend VLLM_CPU_KVCACHE_SPACE sets it too).")
    util = flags.gpu_memory_utilization
    if util is not None and util >= t.max_gpu_memory_utilization:
        return None
    return Suggestion("--gpu-memory-utilization", "increase",
                      min(t.max_gpu_memory_utilization,
                          round((util or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION) + t.gpu_memory_utilization_step, 2)),
                      "More of the device for the KV cache, if nothing else shares it.")


def suggest_more_kv(flags: KnownFlags, t: Thresholds, demand_tokens: float | None) -> list[Suggestion]:
    """Every change that fits more tokens in the KV cache here, the most direct first;
    ``demand_tokens`` (a long request's prompt + output) sizes a shorter --max-model-len."""
    out = [s for s in (more_kv_capacity(flags, t),) if s is not None]
    if flags.cache_dtype in (None, "auto", "bfloat16", "float16", "half"):
        out.append(Suggestion("--kv-cache-dtype", "set", "fp8",
                              "Halves KV bytes per token, so twice the tokens fit; check accuracy on your evals."))
    if not flags.num_gpu_blocks_override:
        out.append(Suggestion("--tensor-parallel-size", "increase", None,
                              "With more GPUs, each holds a slice of the weights and KV heads: more room for KV."))
    step = t.max_model_len_step_tokens
    value = int(math.ceil(demand_tokens * t.max_model_len_headroom / step) * step) if demand_tokens else None
    if flags.max_model_len and value and value < flags.max_model_len:
        out.append(Suggestion("--max-model-len", "decrease", value,
                              f"A trade-off, not more room: V1 allocates KV blocks as tokens arrive, so a shorter "
                              f"maximum frees nothing for the requests it still admits; it only turns away those "
                              f"longer than {value:,} tokens (p99 prompt + output here: {demand_tokens:,.0f})."))
    return out


def _running_at_onset(ctx: Context, episode: tuple[float, float]) -> tuple[float | None, str | None]:
    """How many sequences one engine ran when preemption began, and from what. The running gauge's
    highest per-engine reading at the two scrapes around the onset (the last before the first
    preemption episode, the first in it); where both read 0, the sequences the engine decoded per
    step in the intervals ending at them (tokens generated, less accepted speculative drafts, per
    engine step: its own counters, a mean a little below the batch's peak); where those give
    nothing, the earliest reading above 0 in the episode. vLLM 0.32's gauges can read 0 running
    while the engine preempts (a real 60-request burst on 12 blocks read 0 at every scrape from its
    start to past the episode's end: ``recording-kv-pressure-gauges-zero-0.32.0.jsonl.gz``), and a
    reading of 0 beside preemption is no reading. (None, None) where nothing says."""
    start, end = episode
    ok = ctx.ok
    onset = next((i for i, (s, _) in enumerate(ok) if s.ts >= start), len(ok) - 1)
    bracket = range(max(onset - 1, 0), onset + 1)
    gauge = max(_running(ok[i][1]) for i in bracket)
    if gauge:
        return gauge, "gauge"
    batches = [b for i in bracket if i > 0 and (b := _decoded_per_step(ctx, i)) is not None]
    if batches:
        return float(round(max(batches))), "tokens per step"
    later = next((r for s, snap in ok[onset:] if s.ts <= end and (r := _running(snap))), None)
    return (later, "gauge") if later else (None, None)


def _running(snap: Snapshot) -> float:
    """The running gauge's highest per-engine reading (--max-num-seqs holds per engine)."""
    return max((snap.value("num_requests_running", e) or 0.0 for e in snap.engines), default=0.0)


def _decoded_per_step(ctx: Context, i: int) -> float | None:
    """Sequences decoded per engine step in the interval ending at good scrape ``i``: the tokens it
    generated (less accepted speculative drafts) per ``iteration_tokens`` observation."""
    iv = ctx.intervals[i - 1]
    steps = iv.iteration_tokens.count if iv.iteration_tokens is not None else 0
    if steps <= 0 or not iv.generation_tokens:
        return None
    accepted = counter_increase([ctx.ok[i - 1][0], ctx.ok[i][0]], "spec_decode_num_accepted_tokens")
    return (iv.generation_tokens - (accepted[0] if accepted is not None else 0.0)) / steps


def kv_pressure(ctx: Context) -> list[Finding]:
    """Preemptions while the KV cache is near full: more KV capacity or fewer sequences, never more."""
    t, ok = ctx.thresholds, ctx.ok
    if not exposes(ctx, "num_preemptions"):
        if exposes(ctx, "num_requests_swapped"):
            return []  # V0: swapped requests; not judged here
        return [absent("vllm:num_preemptions_total", "kv_pressure", "Preemption cannot be counted (vLLM < 0.8.5).")]
    found = episodes([(iv.end, (iv.num_preemptions or 0) > 0) for iv in ctx.intervals], t.episode_merge_seconds)
    if not found:
        return []
    total = sum(iv.num_preemptions or 0 for iv in ctx.intervals)
    usage = [snap.value("kv_cache_usage_perc") for _, snap in ok]
    max_usage = max((u for u in usage if u is not None), default=None)
    waiting = max_gauge(ctx, "num_requests_waiting")
    running_at_onset, onset_basis = _running_at_onset(ctx, found[0])
    seconds = max(ctx.history[-1].ts - ctx.history[0].ts, 1e-9)
    prompt_p99 = histogram_quantile(0.99, histogram_delta(ctx.history, "request_prompt_tokens"))
    gen_p99 = histogram_quantile(0.99, histogram_delta(ctx.history, "request_generation_tokens"))
    demand = (prompt_p99 or 0) + (gen_p99 or 0) or None
    suggestions = suggest_more_kv(ctx.flags, t, demand)
    if running_at_onset:
        suggestions.append(
            Suggestion("--max-num-seqs", "decrease", max(1, int(running_at_onset * t.kv_fewer_seqs_share)),
                       f"Preemption began with {'about ' if onset_basis == 'tokens per step' else ''}"
                       f"{running_at_onset:.0f} running"
                       + (" (sequences decoded per engine step: the running gauge read 0 around the onset)"
                          if onset_basis == "tokens per step" else "")
                       + "; fewer concurrent sequences need fewer blocks (the opposite of raising it).")
        )
    near_full = max_usage is not None and max_usage >= t.kv_full_perc
    # Critical is a server that spends much of its time recomputing: one preemption a second over the
    # window, or preemptions for half of the requests it finished (a window a slow drain made long
    # dilutes the rate, never the share).
    finished = sum((labelled_increase(ctx.history, "request_success") or {}).values())
    share = total / finished if finished >= t.kv_critical_min_finished else None
    severe = near_full and waiting > 0 and (total / seconds >= t.kv_critical_preemptions_per_second
                                            or (share is not None and share >= t.kv_critical_preempted_share))
    diff = _sized_by(ctx, total)
    return [
        Finding(
            id="kv_pressure",
            severity="critical" if severe else "warning",
            title=f"KV-cache pressure: {total:.0f} preemptions"
            + (f", KV usage up to {max_usage * 100:.0f} %" if max_usage is not None else "")
            + (f", up to {waiting:.0f} waiting" if waiting else ""),
            evidence={"preemptions": total, "preemptions_per_second": round(total / seconds, 4),
                      "requests_finished": finished,
                      "preemptions_per_finished_request": round(share, 3) if share is not None else None,
                      "max_kv_cache_usage_perc": max_usage, "max_num_requests_waiting": waiting,
                      "num_requests_running_at_onset": running_at_onset,
                      "running_at_onset_basis": onset_basis, "episodes": len(found), **diff.evidence()},
            suggestions=tuple(suggestions),
            checks=(
                "Confirm preemptions line up with KV usage near 100 % on the chart (not a one-off burst).",
                "Do not raise --max-num-seqs for this: more sequences need more blocks and preempt more.",
                "Check the KV capacity against the workload (tokens per request × concurrency) before and after.",
                *diff.checks(),
            ),
            time_range=(found[0][0], found[-1][1]),
        )
    ]


def _sized_by(ctx: Context, preemptions: float) -> Differential:
    """Which flag sized the cache that ran out: vLLM preempts only when ``allocate_slots`` finds no free
    block, so the preemptions are the cache running out; a pin (--num-gpu-blocks-override or
    --kv-cache-memory-bytes) sized it when set, --gpu-memory-utilization otherwise. The suggestions
    (:func:`more_kv_capacity`) raise the flag named."""
    flags = ctx.flags
    pin = (f"--num-gpu-blocks-override {flags.num_gpu_blocks_override:,}" if flags.num_gpu_blocks_override else
           f"--kv-cache-memory-bytes {flags.kv_cache_memory_bytes:,}" if flags.kv_cache_memory_bytes else None)
    out = f"{preemptions:.0f} preemptions (vLLM preempts only when no KV block is free)"
    if pin:
        return differential("preemption", (Ruling("kv_pinned", "fits", f"{out}, in a cache pinned by {pin}"),
                                           Ruling("kv_small", "ruled_out", f"{pin} sized the cache, not the utilization")))
    util = f" {flags.gpu_memory_utilization:g}" if flags.gpu_memory_utilization else ""
    return differential("preemption", (Ruling("kv_pinned", "ruled_out", "neither --num-gpu-blocks-override nor "
                                                                         "--kv-cache-memory-bytes is set"),
                                       Ruling("kv_small", "fits", f"{out}, in a cache sized by "
                                                                  f"--gpu-memory-utilization{util}")))


_SHARING_CHECKS = (
    "Verify sharing is actually happening before touching batch size or memory utilization.",
    "vLLM V1 shares the prompt's full blocks across the n samples through the prefix cache; the partial last "
    "block is each sample's own.",
)


def _parallel_samples(ctx: Context) -> dict[str, Any] | None:
    """The evidence about requests sampled with n > 1 in the window; None when there were none."""
    n_hist = histogram_delta(ctx.history, "request_params_n")
    if n_hist is None:
        return None
    le1 = next((c for b, c in zip(n_hist.bounds, n_hist.cumulative) if b >= 1.0), 0.0)
    parallel = n_hist.cumulative[-1] - le1
    if parallel <= 0:
        return None
    return {"requests_with_n_gt_1": parallel, "mean_n": mean_from(n_hist),
            "enable_prefix_caching": ctx.flags.enable_prefix_caching}


def sharing_disabled(ctx: Context) -> list[Finding]:
    """Parallel samples (n > 1) with prefix caching off: each sample holds its own prompt blocks."""
    evidence = _parallel_samples(ctx) if ctx.flags.enable_prefix_caching is False else None
    if evidence is None:
        return []
    return [Finding(
        id="sharing_disabled", severity="warning",
        title=f"{evidence['requests_with_n_gt_1']:.0f} requests sampled n > 1 (mean n {evidence['mean_n']:.1f}) "
        "with prefix caching off: each sample holds its own copy of the prompt's blocks",
        evidence=evidence,
        suggestions=(Suggestion("--enable-prefix-caching", "set", None,
                                "The n samples of one prompt then share its full blocks instead of n copies."),),
        checks=_SHARING_CHECKS, time_range=whole(ctx),
    )]


def sharing_not_happening(ctx: Context) -> list[Finding]:
    """Parallel samples (n > 1) with prefix caching on (or unknown) but hardly any cache hits."""
    evidence = _parallel_samples(ctx) if ctx.flags.enable_prefix_caching is not False else None
    if evidence is None:
        return []
    hits = sum(iv.prefix_cache_hits or 0 for iv in ctx.intervals)
    queries = sum(iv.prefix_cache_queries or 0 for iv in ctx.intervals)
    prompt_p50 = histogram_quantile(0.5, histogram_delta(ctx.history, "request_prompt_tokens"))
    block = ctx.flags.block_size or VLLM_DEFAULT_BLOCK_SIZE
    if not (queries > 0 and hits / queries < ctx.thresholds.sharing_hit_rate_low and prompt_p50 is not None
            and prompt_p50 >= ctx.thresholds.sharing_min_prompt_blocks * block):
        return []
    evidence.update({"prefix_cache_hit_rate": hits / queries, "prompt_tokens_p50": prompt_p50})
    return [Finding(
        id="sharing_not_happening", severity="warning",
        title=f"n > 1 sampling but the prefix-cache hit rate is {hits / queries * 100:.1f} %: samples are not "
        "sharing prompt blocks",
        evidence=evidence, checks=_SHARING_CHECKS, time_range=whole(ctx),
    )]
