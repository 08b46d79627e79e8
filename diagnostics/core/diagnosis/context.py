"""Everything the rules read, built once per diagnosis by :func:`prepare`.

The page and the CLI used to rebuild these inputs each (and the log was parsed twice); rules used
to recompute the same per-interval deltas each. Here the log is parsed once, the flags resolved
once, and the per-interval series (:class:`Interval`) and stall episodes (:class:`Stall`) computed
once, and so are the per-engine judgements several rules share (silent ranks, load skews, slow
ranks: :mod:`~diagnostics.core.diagnosis.data_parallel`); a rule is then a pure function of the
:class:`Context`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.core.diagnosis.access_log import AccessLog, parse_access_log
from diagnostics.core.diagnosis.data_parallel import (
    LoadSkew,
    SilentRank,
    SlowRank,
    load_skews,
    silent_ranks,
    slow_ranks,
)
from diagnostics.core.diagnosis.latency import ItlProfile, itl_profile, large_step
from diagnostics.core.diagnosis.logs import LogFacts, parse_log
from diagnostics.core.diagnosis.outcomes import Outcomes, outcomes_of
from diagnostics.core.diagnosis.types import Budgets, KnownFlags, Thresholds
from diagnostics.core.metrics.catalog import Histogram, Snapshot
from diagnostics.core.metrics.derive import Scrape, counter_step, histogram_step, merge_histograms, restarted
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import ServerInfo


@dataclass(frozen=True, slots=True)
class Interval:
    """Between two consecutive good scrapes: what the counters and histograms gained (None when the
    server does not expose them) and the running count at the interval's end."""

    start: float
    end: float
    restarted: bool
    itl: Histogram | None
    prompt_len: Histogram | None  # delta of request_prompt_tokens
    iteration_tokens: Histogram | None  # delta of iteration_tokens (tokens per engine step)
    prompt_tokens: float | None
    generation_tokens: float | None
    prefix_cache_hits: float | None
    prefix_cache_queries: float | None
    num_preemptions: float | None
    num_requests_running: float | None
    asleep: bool = False  # an engine was asleep at the interval's end (``engine_sleep_state``)
    # What the requests that finished (queue time) or started (TTFT) in the interval waited, and how
    # many finished: counted by the frontend per request, so they see load the gauges can miss.
    queue_time: Histogram | None = None  # delta of request_queue_time_seconds
    ttft: Histogram | None = None  # delta of time_to_first_token_seconds
    requests_finished: float | None = None  # request_success, every finished_reason


@dataclass(frozen=True, slots=True)
class Stall:
    """Requests running and no token produced, long enough to count (see :class:`Thresholds`).

    The stall rule reports it; the queue rule leaves its time out, since when no token moves the
    concurrency cap is not what queues.
    """

    start: float  # the last scrape that still saw tokens move
    end: float
    num_scrapes: int
    num_requests_running: float  # the most seen during the stall


@dataclass(frozen=True, slots=True)
class TokensStopped:
    """At the end of the window: requests running and no token for ``seconds`` (at least that long
    when the window began inside it). While it lasts, no queue or capacity advice is given: with no
    token moving, the cap or the KV cache is not what holds requests back."""

    seconds: float
    since: float
    num_requests_running: float
    began_before_window: bool
    # The longest silence of the window that ended in a large prefill step, when the window repeats
    # them (see ``_stalls``): no stall is called before twice this.
    long_step_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class Context:
    """One diagnosis's inputs; ``ok`` holds the good scrapes with their snapshots."""

    history: tuple[Scrape, ...]
    ok: tuple[tuple[Scrape, Snapshot], ...]
    log: LogFacts | None
    flags: KnownFlags
    budgets: Budgets
    thresholds: Thresholds
    info: ServerInfo | None
    intervals: tuple[Interval, ...]
    stalls: tuple[Stall, ...]
    tokens_stopped: TokensStopped | None
    itl: ItlProfile
    silent_ranks: tuple[SilentRank, ...]
    # Every run of scrapes in which an engine held work a peer had room for, however short: each
    # rule keeps those lasting as long as it needs (:meth:`skews_lasting`).
    load_skews: tuple[LoadSkew, ...]
    slow_ranks: tuple[SlowRank, ...]
    # What became of the window's requests (failed, refused, given up, cut at the context limit).
    outcomes: Outcomes
    # The running gauge read 0 at the end of most intervals in which tokens were generated (vLLM 0.32's
    # per-engine gauges under data parallelism on a busy host): the gauge rules cannot see a queue, so
    # the queue rules also judge from the per-request histograms (:func:`gauges_blind`).
    gauges_blind: bool = False
    # GPU health readings over the window (NVML or a dcgm-exporter), oldest first; () when none were read.
    gpus: tuple[tuple[float, GpuReading], ...] = ()
    # The log's access lines (answers by route and HTTP status), when a log with them was given.
    access: AccessLog | None = None

    def skews_lasting(self, seconds: float) -> list[LoadSkew]:
        """The load skews that lasted at least ``seconds``."""
        return [skew for skew in self.load_skews if skew.seconds >= seconds]


def prepare(
    history: Sequence[Scrape],
    *,
    info: ServerInfo | None = None,
    budgets: Budgets = Budgets(),
    log_text: str | None = None,
    thresholds: Thresholds = Thresholds(),
    gpus: Sequence[tuple[float, GpuReading]] = (),
    **flag_overrides: Any,
) -> Context:
    """The context for a window of scrapes (possibly empty), an optional startup log and the GPU
    readings taken beside the scrapes.

    ``flag_overrides`` (e.g. ``max_num_seqs=8``) are flags the operator knows; they win over what
    the server and its log say (see :meth:`KnownFlags.known`).
    """
    scrapes = tuple(history)
    ok = tuple((s, s.snapshot) for s in scrapes if s.snapshot is not None)
    log = parse_log(log_text) if log_text is not None else None  # an empty log is said to be empty
    config = ok[-1][1].cache_config if ok else None
    intervals = tuple(_interval(a, b) for a, b in zip(ok, ok[1:]))
    flags = KnownFlags.known(config, info, log, **flag_overrides)
    silences = _silences(intervals, thresholds)
    pattern = _long_steps(silences, thresholds)
    rows = [(iv.start, iv.end, iv.itl, iv.iteration_tokens, iv.num_requests_running or 0.0, _computed_prefill(iv))
            for iv in intervals]
    return Context(
        history=scrapes,
        ok=ok,
        log=log,
        flags=flags,
        budgets=budgets,
        thresholds=thresholds,
        info=info,
        intervals=intervals,
        stalls=_stalls(silences, pattern, thresholds),
        tokens_stopped=_tokens_stopped(intervals, thresholds, pattern[1] if pattern is not None else None),
        itl=itl_profile(rows, merge_histograms([iv.prompt_len for iv in intervals]), budgets, thresholds,
                        flags.max_num_batched_tokens),
        silent_ranks=tuple(silent_ranks(ok, thresholds.hung_rank_min_seconds, thresholds.hung_rank_peer_batch)),
        load_skews=tuple(load_skews(ok, 0.0, thresholds.kv_full_perc, thresholds.skew_kv_gap)),
        slow_ranks=tuple(slow_ranks(ok, thresholds.slow_rank_window_seconds, thresholds.slow_rank_max_ratio)),
        outcomes=outcomes_of(ok, flags.max_model_len),
        gauges_blind=gauges_blind(intervals, thresholds),
        gpus=tuple(gpus),
        access=parse_access_log(log_text) if log_text else None,
    )


def gauges_blind(intervals: Sequence[Interval], t: Thresholds) -> bool:
    """Whether the running gauge missed the work: tokens were generated in at least
    ``blind_min_intervals`` intervals and the running gauge read 0 (or nothing) at the end of at
    least ``blind_share`` of them. Short requests that finish between two scrapes do this on any
    server; under data parallelism vLLM 0.32's per-engine gauges do it while requests queue
    (``tests/fixtures/incidents/hung_rank_dp2``: 0 in every scrape). Blindness alone finds nothing:
    it lets the queue rules read the histograms, which must then show the queue."""
    flowing = [iv for iv in intervals if (iv.generation_tokens or 0) > 0 and not iv.restarted]
    if len(flowing) < t.blind_min_intervals:
        return False
    unseen = sum(1 for iv in flowing if not iv.num_requests_running)
    return unseen >= t.blind_share * len(flowing)


def episodes(points: Sequence[tuple[float, bool]], merge_seconds: float = 0.0) -> list[tuple[float, float]]:
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


def _interval(prev: tuple[Scrape, Snapshot], cur: tuple[Scrape, Snapshot]) -> Interval:
    (a_scrape, a), (b_scrape, b) = prev, cur
    restart = restarted(a, b)
    return Interval(
        start=a_scrape.ts,
        end=b_scrape.ts,
        restarted=restart,
        itl=_histogram(a, b, "inter_token_latency_seconds"),
        prompt_len=_histogram(a, b, "request_prompt_tokens"),
        iteration_tokens=_histogram(a, b, "iteration_tokens"),
        prompt_tokens=_counter(a, b, "prompt_tokens", restart),
        generation_tokens=_counter(a, b, "generation_tokens", restart),
        prefix_cache_hits=_counter(a, b, "prefix_cache_hits", restart),
        prefix_cache_queries=_counter(a, b, "prefix_cache_queries", restart),
        num_preemptions=_counter(a, b, "num_preemptions", restart),
        num_requests_running=b.value("num_requests_running"),
        asleep=bool(b.asleep()),
        queue_time=_histogram(a, b, "request_queue_time_seconds"),
        ttft=_histogram(a, b, "time_to_first_token_seconds"),
        requests_finished=_finished(a, b, restart),
    )


def _finished(a: Snapshot, b: Snapshot, restart: bool) -> float | None:
    by_a, by_b = a.by_label("request_success"), b.by_label("request_success")
    if by_a is None or by_b is None:
        return None
    return sum(counter_step(by_a.get(reason, 0.0), value, restart) for reason, value in by_b.items())


def _counter(a: Snapshot, b: Snapshot, concept: str, restart: bool) -> float | None:
    va, vb = a.value(concept), b.value(concept)
    if va is None or vb is None or math.isnan(va) or math.isnan(vb):
        return None
    return counter_step(va, vb, restart)


def _histogram(a: Snapshot, b: Snapshot, concept: str) -> Histogram | None:
    ha, hb = a.histogram(concept), b.histogram(concept)
    return histogram_step(a, ha, b, hb) if ha is not None and hb is not None else None


@dataclass(frozen=True)
class _Silence:
    """A run of intervals with requests running and no generation-token increase."""

    run: tuple[Interval, ...]
    per_token: float | None  # seconds per prefilled token, when a large step ended it
    ongoing: bool  # the window ends inside it

    @property
    def seconds(self) -> float:
        return self.run[-1].end - self.run[0].start


def _silences(intervals: Sequence[Interval], t: Thresholds) -> list[_Silence]:
    # An engine put to sleep produces nothing by request: the sleep rule says so, not the stall rule.
    flagged = [(iv, (iv.num_requests_running or 0) > 0 and iv.generation_tokens == 0 and not iv.asleep)
               for iv in intervals]
    after = {a.end: b for a, b in zip(intervals, intervals[1:])}
    out = []
    for first, last in episodes([(iv.end, flag) for iv, flag in flagged]):
        run = tuple(iv for iv, flag in flagged if flag and first <= iv.end <= last)
        resumed = after.get(last)
        per_token = None
        if resumed is not None and large_step(resumed.iteration_tokens, _computed_prefill(resumed), t):
            # The step's prompt tokens computed, at least the large-step threshold when the prompt
            # counter says less.
            per_token = (last - run[0].start) / max(_computed_prefill(resumed), t.hol_big_step_tokens)
        out.append(_Silence(run, per_token, ongoing=resumed is None))
    return out


def _long_steps(silences: Sequence[_Silence], t: Thresholds) -> tuple[float, float] | None:
    """The window's own pattern of long prefill steps: (median seconds per prefilled token, the
    longest such silence), when at least ``long_step_repeats`` silences ended in a large step."""
    ended = [s for s in silences if s.per_token is not None]
    if len(ended) < t.long_step_repeats:
        return None
    rates = sorted(s.per_token for s in ended if s.per_token is not None)
    return rates[len(rates) // 2], max(s.seconds for s in ended)


def _stalls(silences: Sequence[_Silence], pattern: tuple[float, float] | None, t: Thresholds) -> tuple[Stall, ...]:
    """The silences kept as stalls: at least ``stall_min_seconds`` and ``stall_min_scrapes`` long.

    A silence that ends in an interval carrying a large engine step was one long prefill step, not
    a stall: vLLM updates its counters when a step finishes, so a step of thousands of prompt tokens
    on a slow device looks like seconds without tokens, then resumes. That is head-of-line blocking
    (the latency profile sees it), and "dump the stacks and restart" would be the wrong advice.

    How long one step may take depends on the device: up to ``long_step_max_seconds`` it is taken
    as a step on any device. A longer one is a long step only when the window shows the device
    doing it again and again (``pattern``: at least ``long_step_repeats`` silences ended by large
    steps) and this one took no more seconds per prefilled token than ``long_step_rate_factor``
    times their median (a busy CPU that takes 16 s for every 3,600-token prefill). A hang is a
    one-off: a single long silence, or one far slower per token than the window's other long steps,
    is a stall even when queued long prompts are prefilled as it ends. A silence the window ends
    inside is not called a stall before it outlasts ``long_step_rate_factor`` times the window's
    longest long step (meanwhile ``tokens_stopped`` watches it)."""
    out = []
    for silence in silences:
        seconds = silence.seconds
        if seconds < t.stall_min_seconds or len(silence.run) < t.stall_min_scrapes:
            continue
        if silence.per_token is not None and (seconds <= t.long_step_max_seconds or (
                pattern is not None and silence.per_token <= t.long_step_rate_factor * pattern[0])):
            continue
        if silence.ongoing and pattern is not None and seconds <= t.long_step_rate_factor * pattern[1]:
            continue
        out.append(Stall(silence.run[0].start, silence.run[-1].end, len(silence.run),
                         max(iv.num_requests_running or 0 for iv in silence.run)))
    return tuple(out)


def _computed_prefill(iv: Interval) -> float:
    """Prompt tokens the engine computed in the interval (not served from the prefix cache)."""
    return max(0.0, (iv.prompt_tokens or 0.0) - (iv.prefix_cache_hits or 0.0))


def _tokens_stopped(intervals: Sequence[Interval], t: Thresholds,
                    long_step_seconds: float | None) -> TokensStopped | None:
    """The trailing run of intervals with requests running and no progress at all: no generated
    token, no prompt token computed, no preemption (an engine recomputing preempted requests is
    busy, not stopped, and its KV pressure is real)."""
    run: list[Interval] = []
    for iv in reversed(intervals):
        idle = iv.generation_tokens == 0 and not iv.prompt_tokens and not iv.num_preemptions
        if (iv.num_requests_running or 0) > 0 and idle and not iv.asleep:
            run.append(iv)
        else:
            break
    if not run:
        return None
    since, end = run[-1].start, run[0].end
    if end - since < t.tokens_stopped_min_seconds:
        return None
    return TokensStopped(end - since, since, max(iv.num_requests_running or 0 for iv in run),
                         began_before_window=len(run) == len(intervals), long_step_seconds=long_step_seconds)
