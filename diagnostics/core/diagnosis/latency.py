"""Where the inter-token latency symptom lives, computed once per diagnosis from the interval deltas.

Two different faults raise ITL and want opposite knobs:

- **head-of-line blocking**: a long prompt prefilled in one engine step delays every decoding
  sequence for that step. The median stays flat; the *tail* moves (one gap per decoder per long
  prefill), so it is judged on the share of an interval's ITL observations above a threshold,
  counted from bucket deltas (never interpolated), and it needs long *individual* prompts (the
  ``request_prompt_tokens`` histogram) and large engine steps (``iteration_tokens``) beside it;
- **a batch too large for the budget**: every decode step is slower because more sequences share
  it. The *median* rises with the running count.

A spike must also matter in absolute terms: above the ITL budget when one is given, and above a
floor a user notices (``Thresholds.hol_spike_floor_seconds``) when none is.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from diagnostics.core.diagnosis.types import Budgets, Thresholds
from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import count_above, histogram_quantile, merge_histograms


@dataclass(frozen=True, slots=True)
class IntervalItl:
    """One scrape interval's ITL observations and what the engine did in it."""

    start: float
    end: float
    itl: Histogram
    p50_seconds: float | None
    p99_seconds: float | None
    num_requests_running: float
    steps: Histogram | None  # tokens per engine step (iteration_tokens delta; None: not exposed)
    computed_prefill_tokens: float  # prompt tokens not served from the prefix cache


@dataclass(frozen=True, slots=True)
class ItlProfile:
    """The window's ITL, split into the tail that coincides with long prefills and the rest."""

    intervals: tuple[IntervalItl, ...]
    baseline_p50_seconds: float | None  # the window's median ITL (all its observations)
    # The gap a decoder usually sees: the larger of that median and the median of the intervals'
    # medians (one fast interval of thousands of gaps can set the first on a busy host).
    usual_p50_seconds: float | None
    spike_threshold_seconds: float
    spikes: tuple[IntervalItl, ...]  # intervals whose tail share is above the threshold
    blocking: tuple[IntervalItl, ...]  # spikes next to a large prefill step
    long_prompts: float | None  # requests in the window with prompts above hol_long_prompt_tokens
    median_rises_with_batch: bool
    p50_at_low_running_seconds: float | None
    p50_at_high_running_seconds: float | None
    low_num_requests_running: float | None  # the running count the low median was measured at

    def tail_share(self, iv: IntervalItl) -> float:
        return count_above(iv.itl, self.spike_threshold_seconds) / iv.itl.count if iv.itl.count else 0.0

    @property
    def head_of_line(self) -> bool:
        """Long individual prompts, a flat median, and spikes that sit next to large prefills."""
        return bool(self.blocking) and (self.long_prompts is None or self.long_prompts > 0) \
            and not self.median_rises_with_batch

    def blocked(self, ts: float) -> bool:
        """Whether ``ts`` falls in the head-of-line episode (first to last blocking interval): while
        long prefill steps hold the engine, waiting requests wait for them, not for a cap."""
        return self.head_of_line and self.blocking[0].start <= ts <= self.blocking[-1].end

    def outside_blocking(self) -> Histogram | None:
        """The window's ITL without the intervals head-of-line blocking explains (when it does)."""
        skip = {iv.end for iv in self.blocking} if self.head_of_line else set()
        return merge_histograms([iv.itl for iv in self.intervals if iv.end not in skip])


def itl_profile(
    rows: Sequence[tuple[float, float, Histogram | None, Histogram | None, float, float]],
    prompt_len: Histogram | None,
    budgets: Budgets,
    t: Thresholds,
    token_budget: int | None = None,
) -> ItlProfile:
    """``rows`` per interval: (start, end, ITL delta, iteration-tokens delta, running, computed
    prefill tokens); ``prompt_len`` the window's ``request_prompt_tokens`` delta; ``token_budget`` the
    server's --max-num-batched-tokens where known."""
    intervals = tuple(
        IntervalItl(start, end, itl, histogram_quantile(0.5, itl), histogram_quantile(0.99, itl), running, steps,
                    prefill)
        for start, end, itl, steps, running, prefill in rows
        if itl is not None and itl.count > 0
    )
    # The median over every observation, not the median of interval medians: a long prefill step
    # can fill whole scrape intervals with a few huge gaps while ordinary intervals hold hundreds.
    baseline = histogram_quantile(0.5, merge_histograms([iv.itl for iv in intervals])) \
        if len(intervals) >= t.hol_min_intervals else None
    floor = budgets.itl_ms / 1000 if budgets.itl_ms is not None else t.hol_spike_floor_seconds
    # A spike stands out from the usual interval too: on a busy host one interval of fast decode
    # (6,512 gaps of 17 ms) outweighed sixty of 350 ms in the median over every observation, and every
    # ordinary interval then read as a spike, hiding the 2-5 s ones next to the long prefills.
    medians = [iv.p50_seconds for iv in intervals if iv.p50_seconds is not None]
    usual = max(baseline, statistics.median(medians)) if baseline is not None and medians else baseline
    threshold = max(floor, t.hol_spike_factor * usual) if usual is not None else floor
    spikes, blocking = [], []
    calm = calm_near = 0
    if baseline is not None:
        for i, iv in enumerate(intervals):
            # The frontend updates the histograms asynchronously, so a large step and the gaps it
            # causes can land in neighbouring scrape intervals: look one interval either side.
            near = any(large_step(n.steps, n.computed_prefill_tokens, t) for n in intervals[max(0, i - 1):i + 2])
            if count_above(iv.itl, threshold) < max(1.0, t.hol_tail_share * iv.itl.count):
                calm, calm_near = calm + 1, calm_near + near
                continue
            spikes.append(iv)
            if near:
                blocking.append(iv)
    # A spike beside a large step says something only if spikes sit beside one more often than the other
    # intervals do: where prompts finish in (nearly) every interval, and vLLM 0.32 counts a split prompt
    # whole in the step that finishes it, every interval is "beside a large step" and the coincidence is
    # chance (a 48-token budget's queue, recorded: 16 of 16).
    if spikes and (calm == 0 or len(blocking) / len(spikes) <= calm_near / calm):
        blocking = []
    # The batch effect is judged on the intervals long prefills do not explain: an interval filled
    # by one long step has a huge median of its own, whatever the batch.
    explained = {iv.end for iv in blocking}
    low, high, low_running = _p50_by_running([iv for iv in intervals if iv.end not in explained])
    if len(blocking) < t.hol_min_spikes or len(blocking) < t.hol_coincide_fraction * len(spikes):
        blocking = []
    # vLLM 0.32 counts a prompt's computed tokens in the step that finishes its prefill, so a "large step"
    # may be a long prompt already split into small chunks. With the budget known below a large step, no
    # step could hold one, and the spikes are not head-of-line blocking (the histogram alone cannot say).
    if token_budget is not None and token_budget < t.hol_big_step_tokens:
        blocking = []
    rises = low is not None and high is not None and high >= t.batch_p50_rise_factor * low
    long_prompts = count_above(prompt_len, t.hol_long_prompt_tokens) if prompt_len is not None else None
    return ItlProfile(intervals, baseline, usual, threshold, tuple(spikes), tuple(blocking), long_prompts, rises, low,
                      high, low_running)


# The share of steps observed at ≤ 1 token at which the what-if treats the window as chunked (issue 45
# revisits its calibration on vLLM 0.32's iteration_tokens).
CHUNK_STEP_SHARE = 0.5


def chunk_only_steps(steps: Histogram) -> float:
    """Engine steps observed at ≤ 1 token (iteration_tokens' first bucket). vLLM 0.32 observes a step only
    when it emits a token (``PrometheusStatLogger`` records ``prompt_token_stats.computed +
    num_generation_tokens`` per output batch; a step of prompt chunks alone emits none and is never
    observed), so these are steps that emitted one token and finished no prompt: one request decoding,
    alone or beside other prompts' chunks. Not a sign of a split by itself (a single stream decoding
    reads the same, recorded alt_ttft_long_prompts_h3: 158 of 182); the what-if's calibration guard only."""
    return steps.cumulative[0] if steps.bounds and steps.bounds[0] <= 1 else 0.0


def large_step(steps: Histogram | None, computed_prefill_tokens: float, t: Thresholds) -> bool:
    """Whether an interval carried an engine step of more than ``hol_big_step_tokens`` tokens
    (iteration_tokens; before vLLM exported it, the prompt tokens computed in the interval)."""
    if steps is not None:
        return count_above(steps, t.hol_big_step_tokens) > 0
    return computed_prefill_tokens >= t.hol_big_step_tokens


def _p50_by_running(intervals: Sequence[IntervalItl]) -> tuple[float | None, float | None, float | None]:
    """Median ITL p50 of the intervals in the lowest and the highest third of the running count,
    and the lowest third's median running count, when the running count spans at least a factor of
    two (else the batch did not change)."""
    rows = sorted((iv.num_requests_running, iv.p50_seconds) for iv in intervals
                  if iv.p50_seconds is not None and iv.num_requests_running > 0)
    if len(rows) < 6:
        return None, None, None
    third = len(rows) // 3
    low, high = rows[:third], rows[-third:]
    low_running = statistics.median(r for r, _ in low)
    if statistics.median(r for r, _ in high) < 2 * low_running:
        return None, None, None
    return statistics.median(p for _, p in low), statistics.median(p for _, p in high), low_running


def defended_batch(intervals: Sequence[IntervalItl], budget_seconds: float) -> int | None:
    """The largest running count whose intervals — together with every interval at a smaller
    count — kept ITL p95 within the budget; None when even the smallest did not."""
    levels = sorted({int(iv.num_requests_running) for iv in intervals if iv.num_requests_running > 0})
    defended = None
    for level in levels:
        merged = merge_histograms([iv.itl for iv in intervals if 0 < iv.num_requests_running <= level])
        p95 = histogram_quantile(0.95, merged)
        if p95 is None or p95 > budget_seconds:
            break
        defended = level
    return defended
