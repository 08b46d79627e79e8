"""Latency over what the operator holds the server to: decode gaps stretched by long prefills
(head-of-line blocking), decode slower than the ITL budget, and time to first token over its budget,
each read from the ITL profile the context computed once (:mod:`~diagnostics.core.diagnosis.latency`)."""

from __future__ import annotations

import math

from diagnostics.core.diagnosis.causes import Ruling, differential
from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.latency import IntervalItl, ItlProfile, defended_batch
from diagnostics.core.diagnosis.rules.common import absent, exposes, max_gauge, mean_from, quantile_evidence, whole
from diagnostics.core.diagnosis.rules.memory import suggest_more_kv
from diagnostics.core.diagnosis.rules.signatures import (
    largest_step_bound,
    prefill_differential,
    token_budget_target,
    waiting_differential,
    waiting_in,
)
from diagnostics.core.diagnosis.types import Finding, Suggestion
from diagnostics.core.metrics.derive import (
    count_above,
    histogram_delta,
    histogram_quantile,
    merge_histograms,
    quantile_estimate,
)
from diagnostics.core.text import fmt_latency, fmt_ms_or_bound


def head_of_line(ctx: Context) -> list[Finding]:
    """A tail of ITL spikes next to large prefill steps, with long individual prompts and a flat
    median: lower the chunked-prefill budget, not the batch (see
    :mod:`~diagnostics.core.diagnosis.latency`)."""
    t, prof = ctx.thresholds, ctx.itl
    if not prof.head_of_line or prof.usual_p50_seconds is None:
        return []
    blocking = prof.blocking
    worst_p99 = max(iv.p99_seconds or 0.0 for iv in blocking)
    share = max(prof.tail_share(iv) for iv in blocking)
    window = merge_histograms([iv.itl for iv in prof.intervals])
    p50, p99 = histogram_quantile(0.5, window), histogram_quantile(0.99, window)
    big = [count_above(iv.steps, t.hol_big_step_tokens) for iv in prof.intervals if iv.steps is not None]
    value, step_tokens = _chunk_budget(ctx)
    usual = prof.usual_p50_seconds
    # What a step carrying one chunk costs at the window's cost per prefilled token: under the spike
    # line, unless the chunk was held at its floor (then say what it still costs).
    chunk_step = usual + (worst_p99 - usual) * value / max(step_tokens, 1.0)
    reaches = (f"chunks of {value:,} keep a step under {prof.spike_threshold_seconds * 1000:.0f} ms"
               if chunk_step <= prof.spike_threshold_seconds * 1.05 else
               f"chunks of {value:,} (the smallest advised here) still take about {chunk_step * 1000:,.0f} ms a step, "
               f"above the {prof.spike_threshold_seconds * 1000:.0f} ms spike line, but split each stall into "
               f"{max(1, round(step_tokens / value))}")
    why = (f"Steps of about {step_tokens:,.0f} tokens stretched decode gaps from "
           f"{usual * 1000:.0f} to {worst_p99 * 1000:.0f} ms; at that cost per token, {reaches}. A smaller "
           "chunked-prefill budget splits a long prompt over several steps (vLLM docs: 'Smaller values (e.g., "
           "2048) achieve better ITL').")
    return [
        Finding(
            id="head_of_line_blocking",
            severity="warning",
            title=f"Head-of-line blocking: ITL p99 up to {worst_p99 * 1000:.0f} ms next to long prefills "
            f"(median {prof.usual_p50_seconds * 1000:.0f} ms stays flat)",
            evidence={
                "itl_baseline_p50_seconds": prof.baseline_p50_seconds,
                "itl_usual_p50_seconds": prof.usual_p50_seconds,
                "itl_window_p50_seconds": p50,
                "itl_window_p99_seconds": p99,
                "itl_worst_interval_p99_seconds": worst_p99,
                "spike_threshold_seconds": prof.spike_threshold_seconds,
                "max_share_of_gaps_above_threshold_perc": round(share, 4),
                "spike_intervals": len(prof.spikes),
                "spike_intervals_next_to_large_prefill": len(blocking),
                "large_engine_steps": sum(big) if big else None,
                "large_step_tokens_over": t.hol_big_step_tokens,
                "long_prompts": prof.long_prompts,
                "long_prompt_tokens_over": t.hol_long_prompt_tokens,
            },
            suggestions=(Suggestion("--max-num-batched-tokens", "decrease", value, why),),
            checks=(
                "This is the chunk size, not the batch size: do not lower --max-num-seqs for it.",
                "Chunked prefill is on by default in V1; make sure it was not disabled.",
                "A smaller chunk raises TTFT of the long prompts: check the TTFT budget after the change.",
            ),
            time_range=(blocking[0].start, blocking[-1].end),
        )
    ]


def _chunk_budget(ctx: Context) -> tuple[int, float]:
    """The --max-num-batched-tokens that keeps a prefill-carrying step under the spike threshold,
    and the step size it is scaled from: a step of S tokens stretched the gap from the usual B to
    the worst interval p99 W, so a chunk of S·(T−B)/(W−B) tokens gives about T. A power of two, at
    most half of the current budget when that is known (rounded down to a power of two as well),
    and at least ``min_chunk_tokens`` and --max-num-seqs (vLLM requires the budget to hold one token
    per sequence)."""
    prof = ctx.itl
    base = prof.usual_p50_seconds or 0.0
    worst = max(iv.p99_seconds or 0.0 for iv in prof.blocking)
    steps = [_largest_step(iv) for iv in prof.blocking]
    step_tokens = max(steps) if steps else ctx.thresholds.hol_big_step_tokens
    current = ctx.flags.max_num_batched_tokens
    if current:
        step_tokens = min(step_tokens, current)
    scaled = step_tokens * (prof.spike_threshold_seconds - base) / max(worst - base, 1e-9)
    value = _pow2_floor(scaled)
    if current:
        value = min(value, _pow2_floor(current / 2))
    # vLLM refuses a budget below --max-num-seqs.
    floor = max(ctx.thresholds.min_chunk_tokens, ctx.flags.max_num_seqs or 0)
    return max(floor, value), step_tokens


def _pow2_floor(x: float) -> int:
    return int(2 ** int(math.log2(max(1.0, x))))


def _largest_step(iv: IntervalItl) -> float:
    """The largest engine step of the interval in tokens: the upper bound of the highest populated
    iteration_tokens bucket (its lower bound when that is +Inf), else the computed prefill tokens."""
    top = largest_step_bound(iv.steps) if iv.steps is not None else None
    return iv.computed_prefill_tokens if top is None else top


def _batch_ruling(prof: ItlProfile, budget_ms: float, defended: int | None, peak: float,
                  first_bound: float) -> Ruling:
    """``batch_size``: the median ITL rising with the running count (or a batch the budget defends) fits;
    at most 2 running, or the median flat as the count doubled, rules it out."""
    low, high = prof.p50_at_low_running_seconds, prof.p50_at_high_running_seconds
    if prof.median_rises_with_batch or defended is not None:
        return Ruling("batch_size", "fits", f"ITL p95 within {budget_ms:g} ms up to {defended} running"
                      if defended is not None else "the median ITL rose with the running count")
    if peak <= 2:
        return Ruling("batch_size", "ruled_out", f"at most {peak:.0f} ran: there is no smaller batch worth trying")
    if low is None or high is None:
        return Ruling("batch_size", "unknown", "the running count did not vary twofold, so no smaller batch was seen")
    return Ruling("batch_size", "ruled_out", f"the median ITL stayed flat ({fmt_ms_or_bound(low, first_bound)} → "
                                             f"{fmt_ms_or_bound(high, first_bound)}) as the running count doubled")


def slow_decode(ctx: Context) -> list[Finding]:
    """ITL over the budget once the head-of-line tail is set aside: the batch is larger than the
    budget defends (when the median rises with the running count), else the model is slow per step."""
    budget_ms = ctx.budgets.itl_ms
    if not exposes(ctx, "inter_token_latency_seconds"):
        return [absent("vllm:inter_token_latency_seconds", "decode_speed", "Decode latency cannot be measured.")]
    prof = ctx.itl
    overall = quantile_estimate(0.95, merge_histograms([iv.itl for iv in prof.intervals]))
    if overall is None:
        return []
    if budget_ms is None:
        return [Finding(id="itl_budget_unset", severity="info",
                        title=f"ITL p95 is {fmt_latency(overall)}; no ITL budget given, so decode speed is not judged",
                        evidence=quantile_evidence("itl_p95", overall),
                        checks=("Pass --itl-budget-ms (CLI) or set the budget on the Diagnose page.",))]
    rest = quantile_estimate(0.95, prof.outside_blocking())
    if rest is not None and rest.bound == "below" and budget_ms / 1000 < rest.upper:
        # The budget sits inside the histogram's first bucket: "< 10 ms" can be over 4 ms or not. Said, not
        # judged (silence would read as "within budget").
        return [Finding(id="itl_budget_below_buckets", severity="info",
                        title=f"ITL p95 is {fmt_latency(rest)}: a {budget_ms:g} ms budget sits inside vLLM's first "
                        "ITL bucket, so the histograms cannot say whether decode meets it",
                        evidence={**quantile_evidence("itl_p95", rest), "itl_budget_ms": budget_ms},
                        checks=("Measure it on the client (the Probe page times every token gap), or set a budget "
                                f"of at least {rest.upper * 1000:g} ms (vLLM's first inter_token_latency bound; "
                                "--custom-histogram-buckets changes the bounds in vLLM 0.32+).",))]
    if rest is None or not rest.over(budget_ms / 1000):
        return []
    defended = defended_batch(prof.intervals, budget_ms / 1000)
    peak = max((iv.num_requests_running for iv in prof.intervals), default=0.0)
    low, high = prof.p50_at_low_running_seconds, prof.p50_at_high_running_seconds
    first_bound = prof.intervals[0].itl.bounds[0] if prof.intervals else 0.0
    quantize = Suggestion("--quantization", "set", None,
                          "Smaller weights are read faster each step, if measured accuracy allows (a quantized "
                          "checkpoint).")
    batch_bound = prof.median_rises_with_batch or defended is not None
    batch = _batch_ruling(prof, budget_ms, defended, peak, first_bound)
    fewer = _fewer_sequences(ctx, budget_ms, defended, peak, first_bound)
    # The batch size ruled out (at most 2 ran, or the median flat as the running count doubled): fewer
    # sequences would change nothing, so --max-num-seqs is not suggested at all.
    suggestions = ([fewer, quantize] if batch_bound else [quantize] if batch.fit == "ruled_out" else
                   [quantize, fewer])
    if ctx.flags.cache_dtype in (None, "auto", "bfloat16", "float16", "half"):
        suggestions.append(Suggestion("--kv-cache-dtype", "set", "fp8",
                                      "Fewer KV bytes read per decode step, if accuracy allows."))
    rise = (f"; median ITL {fmt_ms_or_bound(low, first_bound)} → {fmt_ms_or_bound(high, first_bound)} as the "
            "batch grew" if low and high else "")
    hol = (Ruling("head_of_line", "ruled_out", f"ITL p95 {fmt_latency(rest)} outside the intervals long prefills "
                                               "explain, still over the budget")
           if prof.head_of_line else Ruling("head_of_line", "ruled_out", "no ITL spike next to a large step"))
    diff = differential("itl", (hol, batch,
                                Ruling("slow_steps", "ruled_out" if batch_bound else "fits",
                                       "a smaller batch was within the budget" if batch_bound else
                                       f"over {budget_ms:g} ms at the smallest batch seen")))
    return [
        Finding(
            id="slow_decode",
            severity="warning",
            title=f"Decode slower than the budget: ITL p95 {fmt_latency(rest)} > {budget_ms:g} ms{rise}",
            evidence={**quantile_evidence("itl_p95", rest), **quantile_evidence("itl_p95_with_head_of_line", overall),
                      "itl_budget_ms": budget_ms, "peak_num_requests_running": peak,
                      "defended_num_requests_running": defended,
                      "itl_p50_at_low_running_seconds": low, "itl_p50_at_high_running_seconds": high,
                      "median_rises_with_batch": prof.median_rises_with_batch, **diff.evidence()},
            suggestions=tuple(suggestions),
            checks=(
                "First --max-num-seqs against the batch size your ITL budget defends; only then weigh "
                "quantization or fp8 KV, on measured numbers." if batch_bound else
                "ITL is over budget even at the smallest batch seen: the model is slow per step on this "
                "hardware, so fewer sequences alone will not meet the budget.",
                "Rule out a CPU-bound host (GPU utilisation low while ITL is high).",
                *diff.checks(),
            ),
            time_range=whole(ctx),
        )
    ]


def _fewer_sequences(ctx: Context, budget_ms: float, defended: int | None, peak: float,
                     first_bound: float) -> Suggestion:
    """--max-num-seqs down to the batch the evidence says is fast enough: the largest running count
    whose ITL p95 (with every smaller one) stayed within the budget; when none did but the median
    rose with the batch, the running count the lowest median was measured at (the smallest batch
    seen to run faster: a measured step, not an extrapolation below the window); else no value."""
    prof = ctx.itl
    if defended is not None:
        return Suggestion("--max-num-seqs", "decrease", defended,
                          f"ITL p95 stayed within {budget_ms:g} ms up to {defended} running; it peaked at {peak:.0f}.")
    low, high, at = prof.p50_at_low_running_seconds, prof.p50_at_high_running_seconds, prof.low_num_requests_running
    if prof.median_rises_with_batch and low is not None and high is not None and at is not None:
        return Suggestion(
            "--max-num-seqs", "decrease", max(1, int(at)),
            f"Median ITL was {fmt_ms_or_bound(low, first_bound)} at about {at:.0f} running against "
            f"{fmt_ms_or_bound(high, first_bound)} at the largest batches (up to {peak:.0f}); even the smallest "
            f"batches seen were over {budget_ms:g} ms at p95, so measure again at {int(at)} before going lower.")
    return Suggestion("--max-num-seqs", "decrease", None, "Fewer sequences per step make each decode step shorter.")


def ttft(ctx: Context) -> list[Finding]:
    """TTFT over budget, split into queue-dominated and prefill-dominated; each follows the cause its
    differential names (:func:`~.signatures.waiting_differential`, :func:`~.signatures.prefill_differential`),
    and says "cause not identified" with no flag where none fits."""
    t, flags, budget_ms = ctx.thresholds, ctx.flags, ctx.budgets.ttft_ms
    if not exposes(ctx, "time_to_first_token_seconds"):
        return [absent("vllm:time_to_first_token_seconds", "ttft", "TTFT cannot be measured.")]
    est = quantile_estimate(0.95, histogram_delta(ctx.history, "time_to_first_token_seconds"))
    if est is None or budget_ms is None or not est.over(budget_ms / 1000):
        return []  # a p95 in the first bucket is only "< its bound": never over budget by interpolation
    queue = mean_from(histogram_delta(ctx.history, "request_queue_time_seconds"))
    prefill = mean_from(histogram_delta(ctx.history, "request_prefill_time_seconds"))
    usage = max_gauge(ctx, "kv_cache_usage_perc")
    evidence = {**quantile_evidence("ttft_p95", est), "ttft_budget_ms": budget_ms, "mean_queue_seconds": queue,
                "mean_prefill_seconds": prefill, "max_kv_cache_usage_perc": usage}
    if queue is not None and prefill is not None and queue >= prefill:
        # Queue time at least the prefill time: requests waited, whatever the waiting gauge caught.
        diff = waiting_differential(ctx, waiting_in(ctx, waited=True))
        named = diff.named.id if diff.named else None
        kv_high = diff.ruling("kv_full").fit == "unknown" and usage >= t.kv_low_perc
        suggestions: tuple[Suggestion, ...] = ()
        if named == "kv_full" or (named == "seat_cap" and kv_high):
            # At the cap with the cache nearly full: more seats would fill it, so more KV room first.
            suggestions = (suggest_more_kv(flags, t, None)[0],)
        elif named == "seat_cap":
            cap = flags.max_num_seqs or max_gauge(ctx, "num_requests_running")
            waiting = max_gauge(ctx, "num_requests_waiting")
            # The waiting gauge can read 0 at every scrape while the queue time says requests waited: how
            # many is then unknown, so no value (cap + 0 would be the current cap, a change that changes nothing).
            suggestions = (Suggestion("--max-num-seqs", "increase", int(cap + waiting) if cap and waiting else None,
                                      f"{diff.sentence()}, with the KV cache ≤ {usage * 100:.0f} % full: "
                                      "requests wait for a seat."),)
        elif named == "token_budget":
            suggestions = (Suggestion("--max-num-batched-tokens", "increase", token_budget_target(ctx),
                                      f"{diff.sentence()}: waiting requests are admitted only while a "
                                      "step's token budget lasts."),)
        cause = f": {diff.named.name}" if diff.named else ": cause not identified"
        return [Finding(
            id="ttft_queue_dominated", severity="warning",
            title=f"TTFT p95 {fmt_latency(est)} > {budget_ms:g} ms, mostly queue time "
            f"({queue * 1000:.0f} ms queued vs {prefill * 1000:.0f} ms prefill on average){cause}",
            evidence={**evidence, **diff.evidence()}, suggestions=suggestions,
            checks=("A capacity problem: see the queueing and KV-pressure findings for which resource is short.",
                    *diff.checks()),
            time_range=whole(ctx),
        )]
    diff = prefill_differential(ctx)
    named = diff.named.id if diff.named else None
    prefill_suggestions: list[Suggestion] = []
    if named == "preemption":
        prefill_suggestions.append(suggest_more_kv(flags, t, None)[0])
    elif named == "token_budget":
        prefill_suggestions.append(Suggestion("--max-num-batched-tokens", "increase", token_budget_target(ctx),
                                              f"{diff.sentence()}: a larger budget prefills a prompt in "
                                              "fewer steps (at some ITL cost)."))
    if flags.enable_prefix_caching is False:
        prefill_suggestions.append(Suggestion("--enable-prefix-caching", "set", None,
                                              "Repeated prefixes are then served from cache instead of recomputed."))
    cause = f": {diff.named.name}" if diff.named else ": cause not identified"
    return [Finding(
        id="ttft_prefill_dominated", severity="warning",
        title=f"TTFT p95 {fmt_latency(est)} > {budget_ms:g} ms, mostly prefill time{cause}",
        evidence={**evidence, **diff.evidence()}, suggestions=tuple(prefill_suggestions),
        checks=("Check the prefix-cache hit rate: shared system prompts should hit.",
                "A larger prefill budget can raise ITL for running sequences (head-of-line blocking).",
                *diff.checks()),
        time_range=whole(ctx),
    )]
