"""Goal seeking: the smallest change of the modelled flags that meets every goal, on the incident's
own workload.

The inverse of a what-if: given goals (``itl-p99=100ms``, ``ttft-p95=2s``) and what to keep
(``throughput``: output tokens/s within 5 % of the replay under the current flags), the flags the
simulated engine models are searched — ``--max-num-seqs`` and ``--max-num-batched-tokens`` up and
down, the KV cache up (within the device where the window says how far that is), prefix caching on,
the block size halved or doubled — one flag at a time in order of how big a change each is (the
log2 of the ratio: doubling a value is 1), then the best of the single changes in pairs when none
meets every goal. The answer is the smallest change that does, its trade-off (what gets worse) and
the next best two; or that none does, and what the closest one reaches.

A long window is searched on its part that misses the goals worst (:data:`SEARCH_SECONDS`, as
recorded), so that a 15-minute window answers in seconds; the baseline must reproduce that part on
every goal's metric first (:mod:`.gate`), or nothing is judged against it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diagnostics.core.diagnosis.types import KnownFlags
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.whatif.flags import Flags, NotModelled
from diagnostics.core.whatif.gate import REPRODUCTION, Check
from diagnostics.core.whatif.predict import Baseline, Prediction, baseline
from diagnostics.core.whatif.replay import recorded
from diagnostics.core.whatif.words import HIGHER_IS_BETTER, LABELS, fmt_value

SEARCH_SECONDS = 90.0  # the longest part of a window the search replays (the part that misses the goals worst)
REACH_BACK = 3.0  # a span may reach back to where nothing waited, up to this many times its length
MAX_TRIALS = 24  # replays a search may take, the pairs included
TIME_BUDGET_S = 8.0  # a search stops trying more changes after this long (and says so)
KEEP_SHARE = 0.05  # a kept metric may get this much worse than the replay under the current flags

# The goal names a person types → the metric (``itl-p99`` → ITL p99).
GOAL_NAMES = {
    "itl-p50": "itl_p50_seconds", "itl-p95": "itl_p95_seconds", "itl-p99": "itl_p99_seconds",
    "itl-p99.9": "itl_p999_seconds", "itl-p999": "itl_p999_seconds",
    "ttft-p50": "ttft_p50_seconds", "ttft-p95": "ttft_p95_seconds",
    "throughput": "output_tokens_per_second", "preemptions": "preemptions_per_minute",
    "waiting": "max_num_requests_waiting",
}


@dataclass(frozen=True, slots=True)
class Goal:
    """``metric`` at most ``limit`` (at least, for throughput)."""

    metric: str
    limit: float

    @property
    def at_least(self) -> bool:
        return self.metric in HIGHER_IS_BETTER

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.limit if self.at_least else value <= self.limit

    def miss(self, value: float | None) -> float:
        """How far ``value`` is from meeting the goal, as a log ratio (0 when met; the histogram
        floor keeps a goal of 0 finite)."""
        if value is None:
            return math.inf
        eps = REPRODUCTION.floor(self.metric) or 1.0
        ratio = (self.limit + eps) / (value + eps) if self.at_least else (value + eps) / (self.limit + eps)
        return max(0.0, math.log(ratio)) if not self.met(value) else 0.0

    def text(self) -> str:
        return f"{LABELS[self.metric]} {'≥' if self.at_least else '≤'} {fmt_value(self.metric, self.limit)}"

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "limit": self.limit, "at_least": self.at_least}


def parse_goal(text: str) -> Goal:
    """``itl-p99=100ms``, ``ttft-p95=2s``, ``throughput=500``, ``preemptions=0``; ValueError saying how."""
    name, sep, raw = text.partition("=")
    metric = GOAL_NAMES.get(name.strip().lower())
    if not sep or metric is None:
        raise ValueError(f"goal {text!r}: write NAME=VALUE with NAME one of {', '.join(GOAL_NAMES)}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|/s|/min|tok/s)?\s*", raw)
    if m is None:
        raise ValueError(f"goal {text!r}: {raw!r} is not a number (100ms, 2s, 500)")
    value, unit = float(m.group(1)), m.group(2)
    allowed = _UNITS.get(metric, ())
    if unit is not None and unit not in allowed:
        said = " or ".join(allowed) if allowed else "no unit"
        raise ValueError(f"goal {text!r}: {unit!r} is not a unit of {name.strip()} (write {said}, or a bare number)")
    if metric.endswith("_seconds"):
        value = value / 1000 if unit in (None, "ms") else value  # a bare latency is in ms, as budgets are
    return Goal(metric, value)


# The units each kind of goal takes (a bare number is always allowed: ms for a latency).
_UNITS = {**{m: ("ms", "s") for m in GOAL_NAMES.values() if m.endswith("_seconds")},
          "output_tokens_per_second": ("tok/s", "/s"), "preemptions_per_minute": ("/min",)}


def keep_goal(name: str, base: Baseline) -> Goal:
    """``--keep throughput``: the metric no more than :data:`KEEP_SHARE` worse than the baseline replay."""
    metric = GOAL_NAMES.get(name.strip().lower(), name)
    value = base.before.metrics.get(metric)
    if metric not in LABELS or value is None:
        raise ValueError(f"--keep {name!r}: the replay has no such metric ({', '.join(GOAL_NAMES)})")
    return Goal(metric, value * (1 - KEEP_SHARE) if metric in HIGHER_IS_BETTER else value * (1 + KEEP_SHARE))


# -- the candidates -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One flag's value on one axis, and how big a change it is (log2 of the ratio)."""

    axis: str
    flag: str
    value: str
    size: float


def _kv_steps(flags: Flags, base: Baseline) -> list[Step]:
    """More KV blocks, said in the flag that sizes this server's cache: the override when it is
    pinned by one, the bytes when pinned by those, else the utilization (up to 0.95 of the device)."""
    c = base.calibration
    out = []
    for factor in (1.25, 1.5, 2.0, 3.0, 4.0):
        if c.num_gpu_blocks_override:
            out.append(Step("kv", "--num-gpu-blocks-override", str(math.ceil(flags.num_gpu_blocks * factor)),
                            math.log2(factor)))
        elif c.kv_cache_memory_bytes:
            out.append(Step("kv", "--kv-cache-memory-bytes", str(int(c.kv_cache_memory_bytes * factor)),
                            math.log2(factor)))
        elif c.gpu_memory_utilization:
            util = c.gpu_memory_utilization * factor
            if util > 0.95 + 1e-9:
                break  # beyond the device
            out.append(Step("kv", "--gpu-memory-utilization", f"{util:.2f}", math.log2(factor)))
        else:
            out.append(Step("kv", "--num-gpu-blocks-override", str(math.ceil(flags.num_gpu_blocks * factor)),
                            math.log2(factor)))
    return out


def candidates(flags: Flags, base: Baseline) -> list[Step]:
    """Every single-flag change the search may try, smallest first; none that cannot change the
    replay: when nothing ever waited in it nor was preempted, the cap and the KV blocks never bound
    (more of either replays the same steps, unless cached prefixes could be kept longer), nor did a
    bigger token budget when every prompt fitted the one there is."""
    out: list[Step] = []
    before = base.before.metrics
    bound = bool(before.get("max_num_requests_waiting") or before.get("preemptions_per_minute"))
    longest = max((r.prompt for r in base.workload.requests), default=0)
    cap = flags.max_num_seqs
    running = max(1, min(cap, round(base.calibration.max_running) or cap))  # what the cap holds in practice
    for factor in (1.5, 2.0, 3.0, 4.0, 8.0):
        value = round(cap * factor)
        if value <= 1024 and bound:
            out.append(Step("seqs-up", "--max-num-seqs", str(value), math.log2(factor)))
    lowered: set[int] = set()
    for factor in (0.75, 0.5, 0.25, 0.125, 0.0625, 0.03125):
        value = round(running * factor)
        if 1 <= value < running and value not in lowered:  # a small count rounds to the same value twice
            lowered.add(value)
            out.append(Step("seqs-down", "--max-num-seqs", str(value), math.log2(running / value)))
    budget = flags.max_num_batched_tokens
    for value in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
        if value != budget and value >= flags.max_num_seqs and (value < budget or bound or longest > budget):
            out.append(Step("tokens-up" if value > budget else "tokens-down", "--max-num-batched-tokens", str(value),
                            abs(math.log2(value / budget))))
    if bound or base.workload.prefix_hit_fraction > 0:
        out += _kv_steps(flags, base)
    if not flags.enable_prefix_caching:
        out.append(Step("prefix", "--enable-prefix-caching", "true", 1.0))
    for size in (flags.block_size // 2, flags.block_size * 2):
        # The block size only changes how the KV cache is cut up: searched where the blocks bound.
        # Said to be a bigger change than doubling a limit (the cache's layout changes with it).
        if 8 <= size <= 128 and size != flags.block_size and (bound or base.workload.prefix_hit_fraction > 0):
            out.append(Step("block-down" if size < flags.block_size else "block-up", "--block-size", str(size), 1.5))
    return sorted(out, key=lambda s: (s.size, s.axis))


# -- the search -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Trial:
    """One change replayed: its prediction, how big a change it is, how far from the goals."""

    steps: tuple[Step, ...]
    prediction: Prediction
    miss: float  # the largest miss over the goals (0: every goal met)

    @property
    def size(self) -> tuple[int, float]:
        return len(self.steps), sum(s.size for s in self.steps)

    @property
    def meets(self) -> bool:
        return self.miss == 0.0

    @property
    def changes(self) -> dict[str, str]:
        return {s.flag: s.value for s in self.steps}

    def tradeoff(self, goals: Sequence[Goal], min_change: float = 0.05) -> list[str]:
        """What gets worse by 5 % or more against the replay under the current flags (the goals' own
        metrics aside), with the interval of each."""
        aimed = {g.metric for g in goals}
        out = []
        p = self.prediction
        for name, shown in p.ranges.items():
            before = p.before.metrics.get(name)
            if name in aimed or before is None or (before == 0 and shown.value == 0):
                continue
            change = (shown.value - before) / before if before else math.inf
            worse = change < 0 if name in HIGHER_IS_BETTER else change > 0
            if worse and abs(change) >= min_change:
                out.append(f"{LABELS[name]} {fmt_value(name, before)} → {shown.text(name)}")
        for s in self.steps:
            if s.axis == "kv":
                out.append(f"a KV cache {2 ** s.size:.2g}× the size ({s.flag} {s.value}"
                           + ("; the device's free memory is not in the window: check it has the room)"
                              if s.flag != "--gpu-memory-utilization" else ")"))
        return out

    def to_json(self, goals: Sequence[Goal]) -> dict[str, Any]:
        p = self.prediction
        return {"changes": self.changes, "size": round(self.size[1], 3), "meets_goals": self.meets,
                "goals": [{**g.to_json(), "predicted": p.ranges[g.metric].to_json() if g.metric in p.ranges else None,
                           "met": g.met(p.after.metrics.get(g.metric)),
                           "met_at_worst": g.met(_worst(g, p))} for g in goals],
                "tradeoff": self.tradeoff(goals), "prediction": p.to_json()}


def _worst(goal: Goal, p: Prediction) -> float | None:
    """The goal's metric at the unfavourable end of its interval."""
    shown = p.ranges.get(goal.metric)
    if shown is None:
        return None
    return shown.low if goal.at_least else shown.high


@dataclass(frozen=True, slots=True)
class GoalAnswer:
    """What the search found on the window (or on its worst part, ``searched_span``)."""

    goals: tuple[Goal, ...]
    keep: tuple[Goal, ...]
    checks: tuple[Check, ...]  # the baseline on the goals' metrics; a miss means nothing was judged
    already_met: bool
    found: tuple[Trial, ...]  # the smallest change that meets every goal, then up to two more that do
    closest: Trial | None  # when none meets them: the one that came closest
    trials: int
    seconds: float
    searched_span: tuple[float, float]  # seconds from the window's start
    window_seconds: float
    before: dict[str, float | None] = field(default_factory=dict)
    # After the answer (or the closest), the next best that miss some goal: fewer than three met them.
    near: tuple[Trial, ...] = ()
    cut_short: bool = False  # the time budget ran out before every candidate was tried

    @property
    def reproduces(self) -> bool:
        return all(c.reproduces for c in self.checks)

    @property
    def met(self) -> bool:
        return bool(self.found)

    def to_json(self) -> dict[str, Any]:
        every = (*self.goals, *self.keep)
        return {"goals": [g.to_json() for g in self.goals], "keep": [g.to_json() for g in self.keep],
                "baseline": {"reproduces": self.reproduces, "checks": [c.to_json() for c in self.checks],
                             "replayed": {g.metric: self.before.get(g.metric) for g in every}},
                "already_met": self.already_met, "met": self.met,
                "best": self.found[0].to_json(list(every)) if self.found else None,
                "next_best": [t.to_json(list(every)) for t in (*self.found[1:], *self.near)],
                "closest": self.closest.to_json(list(every)) if self.closest is not None else None,
                "trials": self.trials, "seconds": round(self.seconds, 3), "cut_short": self.cut_short,
                "searched": {"start_s": round(self.searched_span[0], 1), "end_s": round(self.searched_span[1], 1),
                             "window_s": round(self.window_seconds, 1)}}


def worst_span(scrapes: Sequence[Scrape], goals: Sequence[Goal], seconds: float = SEARCH_SECONDS) -> list[Scrape]:
    """The scrapes of the part of the window, ``seconds`` long, whose recorded metrics miss the
    goals worst (the latest such part on a tie), reaching back to the last scrape at which nothing
    waited; the whole window when it is that short."""
    ok = [s for s in scrapes if s.snapshot is not None]
    if len(ok) < 3 or ok[-1].ts - ok[0].ts <= seconds:
        return ok
    best: tuple[float, int, int] | None = None
    step = max(1, len(ok) // 40)
    for i in range(0, len(ok), step):
        j = i
        while j + 1 < len(ok) and ok[j + 1].ts - ok[i].ts <= seconds:
            j += 1
        if j - i < 2:
            continue
        metrics = recorded(ok[i: j + 1]).metrics
        score = max((g.miss(metrics.get(g.metric)) for g in goals if metrics.get(g.metric) is not None), default=0.0)
        if best is None or score >= best[0]:
            best = (score, i, j)
        if j == len(ok) - 1:
            break
    if best is None:
        return ok
    i, j = best[1], best[2]
    # Start where nothing waited: a queue built before the span would be missing from its replay
    # (its requests would start waiting at the span's start), so the span reaches back to it, up to
    # REACH_BACK spans (a queue older than that: the baseline check says whether the span still
    # reproduces what was recorded).
    k = i
    while k > 0 and (ok[k].snapshot.value("num_requests_waiting") or 0) > 0:  # type: ignore[union-attr]
        k -= 1
    if ok[j].ts - ok[k].ts <= REACH_BACK * seconds:
        i = k
    return ok[i: j + 1]


def _miss(goals: Sequence[Goal], metrics: Mapping[str, float | None]) -> float:
    return max((g.miss(metrics.get(g.metric)) for g in goals), default=0.0)


def seek(scrapes: Sequence[Scrape], known: KnownFlags, goals: Sequence[Goal], keep: Sequence[str] = (), *,
         span_seconds: float = SEARCH_SECONDS, max_trials: int = MAX_TRIALS,
         time_budget_s: float = TIME_BUDGET_S) -> GoalAnswer:
    """The smallest modelled change that meets every goal on the window's own workload (see the
    module). ``ValueError`` when the window cannot be replayed."""
    start = time.perf_counter()
    ok = [s for s in scrapes if s.snapshot is not None]
    if len(ok) < 3:
        raise ValueError("a what-if needs at least three good scrapes")
    span = worst_span(ok, goals, span_seconds)
    base = baseline(span, known)
    kept = tuple(keep_goal(k, base) for k in keep)
    every = (*goals, *kept)
    checks = base.checks(tuple(dict.fromkeys(g.metric for g in goals)))
    t0 = ok[0].ts

    def answer(already: bool, found: Sequence[Trial], closest: Trial | None, tried: int,
               near: Sequence[Trial] = (), cut: bool = False) -> GoalAnswer:
        return GoalAnswer(tuple(goals), kept, checks, already, tuple(found), closest, tried,
                          time.perf_counter() - start, (span[0].ts - t0, span[-1].ts - t0), ok[-1].ts - t0,
                          dict(base.before.metrics), tuple(near), cut)

    already = all(g.met(base.before.metrics.get(g.metric)) for g in goals)
    if not all(c.reproduces for c in checks) or already:
        return answer(already, (), None, 0)
    aimed = tuple(dict.fromkeys(g.metric for g in goals))
    trials: list[Trial] = []

    def run(steps: tuple[Step, ...]) -> Trial | None:
        try:
            p = base.predict({s.flag: s.value for s in steps}, aimed=aimed)
        except NotModelled:
            return None
        t = Trial(steps, p, _miss(every, p.after.metrics))
        trials.append(t)
        return t

    cut = False  # the time budget ran out before every candidate was tried
    closed: set[str] = set()  # axes on which a smaller step already met the goals, or stopped helping
    last: dict[str, float] = {}
    met: list[Trial] = []
    steps = candidates(base.flags, base)
    for step in steps:
        if len(met) >= 3 or len(trials) >= max_trials:
            break
        if time.perf_counter() - start > time_budget_s:
            cut = True
            break
        if step.axis in closed:
            continue
        t = run((step,))
        if t is None:
            continue
        if t.meets:
            met.append(t)
            closed.add(step.axis)  # a bigger step on the same axis is a bigger change
        elif t.miss > last.get(step.axis, _miss(every, base.before.metrics)) + 0.02:
            closed.add(step.axis)  # worse than the step before it: further along will not help
        last[step.axis] = t.miss
    if not met and not cut:
        # Pairs of the three best single changes on different flags.
        best_by_flag: dict[str, Trial] = {}
        for t in sorted(trials, key=lambda t: (t.miss, -t.size[1])):  # on a tie the bigger step: it may combine
            best_by_flag.setdefault(t.steps[0].flag, t)
        tops = list(best_by_flag.values())[:3]
        for a_i in range(len(tops)):
            for b_i in range(a_i + 1, len(tops)):
                if len(trials) >= max_trials + 3:
                    break
                pair = run((tops[a_i].steps[0], tops[b_i].steps[0]))
                if pair is not None and pair.meets:
                    met.append(pair)
                elif pair is not None and pair.miss >= min(tops[a_i].miss, tops[b_i].miss) - 1e-9:
                    trials.remove(pair)  # no closer than one of its halves alone: never the better answer
    met.sort(key=lambda t: t.size)
    rest = sorted((t for t in trials if not t.meets), key=lambda t: (t.miss, t.size))
    closest = None if met else (rest[0] if rest else None)
    # Fewer than three meet every goal: the next best are the closest of the others (said to miss).
    return answer(False, met[:3], closest, len(trials), rest[: max(0, 3 - len(met))] if met else rest[1:3], cut)
