"""Engines of one server side by side (data parallelism): per-engine activity, and a rank that
stops while its peers serve.

A server started with ``--data-parallel-size N`` labels every per-engine series ``engine="0"`` …
``"N-1"``. Summed over engines, a rank that hangs only lowers the totals (half the throughput with
two ranks), so no whole-server rule fires. It is judged here per engine, from the counters the
frontend keeps for each (tokens, engine steps), not from the per-engine running gauge: on vLLM 0.32
with two ranks and short requests that gauge read 0 in almost every scrape while every client had a
request in flight (``tests/fixtures/incidents/hung_rank_dp2``); with longer ones it read right
(``slow_rank_dp2``). A stopped rank's gauges freeze at whatever it last reported.

Why a silent rank is not just an idle one: vLLM's DP load balancer
(``vllm/v1/engine/core_client.py``, ``get_core_engine_for_request``) sends each new request to the
engine with the fewest requests in flight, the first engine on ties. A peer can only come to decode
two sequences at once while the silent rank has a request in flight too; so a rank that stays
silent while a peer's steps carry more than one token each (generated tokens over engine steps;
one sequence yields exactly one token a step without speculative decoding), or that last reported
requests of its own, holds requests it does not serve. A rank idle because the balancer's tie-break
gave every request to engine 0 (one client at a time) does not qualify: engine 0 then decodes one
sequence a step. On a 2-core machine the peers of a stopped rank decoded 1.09–1.11 tokens a step.
On a busy one they decoded exactly one (4 requests a second of 128 tokens arrived one after
another), and the stopped rank's gauges had frozen at 0: it was stopped between reporting and
serving the request it had just been sent. Once such a rank resumes, the frontend's own end-to-end
latency histogram for that engine says it: the requests it finishes right after the silence took at
least as long as the silence, so they were in flight on it all along (``held_through``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diagnostics.core.metrics.catalog import EngineKey, Snapshot
from diagnostics.core.metrics.derive import Scrape, counter_step, restarted


@dataclass(frozen=True, slots=True)
class EngineInterval:
    """One engine's work between two scrapes (None: the engine did not carry the counter)."""

    start: float
    end: float
    generation_tokens: float | None
    prompt_tokens: float | None
    steps: float | None  # engine steps (iteration_tokens observations)

    @property
    def moved(self) -> bool:
        return bool(self.generation_tokens) or bool(self.prompt_tokens)

    @property
    def batch(self) -> float | None:
        """Mean generated tokens per engine step: about the sequences decoded together."""
        if not self.steps or self.generation_tokens is None:
            return None
        return self.generation_tokens / self.steps


@dataclass(frozen=True, slots=True)
class SilentRank:
    """An engine that produced nothing for ``seconds`` while its peers served."""

    engine: EngineKey
    since: float
    until: float
    ongoing: bool
    peer_generation_tokens: float
    peer_max_batch: float | None
    last_running: float | None  # what the engine last reported holding (its gauges then froze)
    last_waiting: float | None
    last_kv_cache_usage_perc: float | None
    # Requests the rank finished right after the silence whose end-to-end latency was at least half
    # the silence (the lower bound of their bucket): in flight on it while it produced nothing.
    held_through: float = 0.0

    @property
    def seconds(self) -> float:
        return self.until - self.since

    @property
    def holds_requests(self) -> bool:
        """The rank held requests it did not serve: its frozen gauges say so, or requests it finished
        when it resumed had waited through the silence."""
        return bool(self.last_running or self.last_waiting or self.held_through)


def engine_name(engine: EngineKey) -> str:
    """How a person names an engine: its DP index, and the model when the label carries one."""
    model, index = engine
    return f"engine {index or '0'}" + (f" ({model})" if model else "")


def engines_of(ok: Sequence[tuple[Scrape, Snapshot]]) -> tuple[EngineKey, ...]:
    """The engines whose token counters the window's scrapes carry, in label order."""
    seen: dict[EngineKey, None] = {}
    for _, snap in ok:
        for key in snap.engines:
            if snap.value("generation_tokens", key) is not None:
                seen.setdefault(key, None)
    return tuple(sorted(seen))


def _step(a: Snapshot, b: Snapshot, concept: str, engine: EngineKey, restart: bool) -> float | None:
    va, vb = a.value(concept, engine), b.value(concept, engine)
    if va is None or vb is None:
        return None
    return counter_step(va, vb, restart)


def _steps(a: Snapshot, b: Snapshot, engine: EngineKey, restart: bool) -> float | None:
    ha, hb = a.histogram("iteration_tokens", engine), b.histogram("iteration_tokens", engine)
    if ha is None or hb is None:
        return None
    return counter_step(ha.count, hb.count, restart)


def per_engine(ok: Sequence[tuple[Scrape, Snapshot]]) -> dict[EngineKey, list[EngineInterval]]:
    """Each engine's work per scrape interval (reset-aware, as every counter here)."""
    out: dict[EngineKey, list[EngineInterval]] = {key: [] for key in engines_of(ok)}
    for (sa, a), (sb, b) in zip(ok, ok[1:]):
        restart = restarted(a, b)
        for key, intervals in out.items():
            intervals.append(EngineInterval(
                sa.ts, sb.ts,
                _step(a, b, "generation_tokens", key, restart),
                _step(a, b, "prompt_tokens", key, restart),
                _steps(a, b, key, restart),
            ))
    return out


def silent_ranks(
    ok: Sequence[tuple[Scrape, Snapshot]], min_seconds: float, peer_batch: float
) -> list[SilentRank]:
    """Ranks silent for ``min_seconds`` or more while a peer produced tokens in two or more of those
    intervals, and either a peer's steps carried more than ``peer_batch`` tokens each meanwhile or the
    rank last reported work of its own (see the module docstring)."""
    work = per_engine(ok)
    if len(work) < 2:
        return []
    last_ts = ok[-1][0].ts
    snaps = {s.ts: snap for s, snap in ok}
    found = []
    for engine, intervals in work.items():
        peers = [iv for key, ivs in work.items() if key != engine for iv in ivs]
        run: list[EngineInterval] = []
        for iv in [*intervals, None]:
            if iv is not None and iv.generation_tokens is not None and not iv.moved:
                run.append(iv)
                continue
            if run:
                rank = _judge(engine, run, peers, snaps, last_ts, min_seconds, peer_batch, iv is None,
                              _held_through(ok, engine, run[0].start, run[-1].end))
                if rank is not None:
                    found.append(rank)
            run = []
    return found


def _judge(
    engine: EngineKey,
    run: list[EngineInterval],
    peers: list[EngineInterval],
    snaps: dict[float, Snapshot],
    last_ts: float,
    min_seconds: float,
    peer_batch: float,
    at_end: bool,
    held_through: float,
) -> SilentRank | None:
    since, until = run[0].start, run[-1].end
    if until - since < min_seconds:
        return None
    during = [iv for iv in peers if since <= iv.start and iv.end <= until]
    serving = [iv for iv in during if iv.generation_tokens]
    if len({iv.end for iv in serving}) < 2:
        return None  # nobody served either: the server was idle, or all of it stopped (the stall rule)
    batches = [b for iv in serving if (b := iv.batch) is not None]
    max_batch = max(batches) if batches else None
    before = snaps.get(since)
    running = before.value("num_requests_running", engine) if before is not None else None
    waiting = before.value("num_requests_waiting", engine) if before is not None else None
    usage = before.value("kv_cache_usage_perc", engine) if before is not None else None
    held = (running or 0) + (waiting or 0) > 0 or held_through > 0
    if not held and (max_batch is None or max_batch <= peer_batch):
        return None  # the peers took one request at a time: this rank may simply have had none
    return SilentRank(engine, since, until, at_end and until >= last_ts,
                      sum(iv.generation_tokens or 0.0 for iv in serving), max_batch, running, waiting, usage,
                      held_through)


def _held_through(ok: Sequence[tuple[Scrape, Snapshot]], engine: EngineKey, since: float, until: float) -> float:
    """How many requests ``engine`` finished from the end of its silence until as long again after
    (at least 5 s) whose end-to-end latency bucket starts at half the silence or more: each was in
    flight on it through most of the silence (a rank that serves a request produces its tokens)."""
    silence = until - since
    after = [snap for s, snap in ok if until <= s.ts <= until + max(5.0, silence)]
    if len(after) < 2 or restarted(after[0], after[-1]):
        return 0.0
    ha = after[0].histogram("e2e_request_latency_seconds", engine)
    hb = after[-1].histogram("e2e_request_latency_seconds", engine)
    if ha is None or hb is None or ha.bounds != hb.bounds:
        return 0.0
    held = 0.0
    for lower, upper, a0, a1, b0, b1 in zip((0.0, *hb.bounds), hb.bounds, (0.0, *ha.cumulative), ha.cumulative,
                                          (0.0, *hb.cumulative), hb.cumulative):
        if lower >= 0.5 * silence and upper > lower:
            held += max(0.0, (b1 - b0) - (a1 - a0))
    return held


@dataclass(frozen=True, slots=True)
class SlowRank:
    """An engine that, over ``since``…``until``, generated a small share of what its peers did per
    engine while producing tokens all along: the balancer split the requests, the rank served slowly."""

    engine: EngineKey
    since: float
    until: float
    tokens_per_second: float
    peer_tokens_per_second: float
    steps_per_second: float | None
    peer_steps_per_second: float | None

    @property
    def ratio(self) -> float:
        return self.tokens_per_second / self.peer_tokens_per_second if self.peer_tokens_per_second else 1.0

    @property
    def starved(self) -> bool:
        """Fewer sequences per step than half its peers': the rank was given less work (a router
        pinning requests elsewhere), it did not do its work slower. Unknown without step counts."""
        if not self.steps_per_second or not self.peer_steps_per_second or not self.peer_tokens_per_second:
            return False
        batch = self.tokens_per_second / self.steps_per_second
        return batch < 0.5 * (self.peer_tokens_per_second / self.peer_steps_per_second)


def slow_ranks(ok: Sequence[tuple[Scrape, Snapshot]], window_seconds: float, max_ratio: float) -> list[SlowRank]:
    """Engines whose generated tokens over every trailing ``window_seconds`` stayed at or below
    ``max_ratio`` of their peers' mean, for at least that long, while they kept producing (a silent
    engine is :func:`silent_ranks`'s). vLLM's balancer evens out requests in flight, so a rank that
    serves them slower shows as fewer tokens a second, not as a longer queue; a rank that decoded
    far fewer sequences a step than its peers was given less work (:attr:`SlowRank.starved`), which
    :func:`load_skews` judges where it made anyone wait."""
    work = per_engine(ok)
    if len(work) < 2:
        return []
    found = []
    for engine, intervals in work.items():
        peers = {key: ivs for key, ivs in work.items() if key != engine}
        flagged: list[tuple[EngineInterval, bool]] = []
        for i, iv in enumerate(intervals):
            span = [j for j in range(i + 1) if intervals[j].start >= iv.end - window_seconds]
            seconds = iv.end - intervals[span[0]].start
            mine = [intervals[j] for j in span]
            if seconds < window_seconds * 0.8 or any(not x.generation_tokens for x in mine):
                flagged.append((iv, False))
                continue
            own = sum(x.generation_tokens or 0.0 for x in mine)
            others = [sum(ivs[j].generation_tokens or 0.0 for j in span) for ivs in peers.values()]
            mean = sum(others) / len(others)
            flagged.append((iv, mean > 0 and own <= max_ratio * mean))
        run: list[EngineInterval] = []
        for point, bad in [*flagged, (None, False)]:
            if bad and point is not None:
                run.append(point)
                continue
            if run and run[-1].end - run[0].start >= window_seconds:
                rank = _slow(engine, run, work, window_seconds)
                if not rank.starved:
                    found.append(rank)
            run = []
    return found


def _slow(engine: EngineKey, run: list[EngineInterval], work: dict[EngineKey, list[EngineInterval]],
          window_seconds: float) -> SlowRank:
    first = min(iv.start for ivs in work.values() for iv in ivs)
    since, until = max(first, run[0].start - window_seconds), run[-1].end
    seconds = until - since

    def rates(key: EngineKey) -> tuple[float, float | None]:
        ivs = [iv for iv in work[key] if since <= iv.start and iv.end <= until]
        steps = [iv.steps for iv in ivs if iv.steps is not None]
        return (sum(iv.generation_tokens or 0.0 for iv in ivs) / seconds,
                sum(steps) / seconds if steps else None)

    own_tokens, own_steps = rates(engine)
    peer = [rates(key) for key in work if key != engine]
    peer_steps = [s for _, s in peer if s is not None]
    return SlowRank(engine, since, until, own_tokens, sum(t for t, _ in peer) / len(peer), own_steps,
                    sum(peer_steps) / len(peer_steps) if peer_steps else None)


@dataclass(frozen=True, slots=True)
class LoadSkew:
    """An engine that queued (or filled its KV cache) while a peer of the same server had room, for
    ``since``…``until``: vLLM's balancer would not have sent it those requests, so something routes
    around the balancer."""

    engine: EngineKey
    peer: EngineKey
    since: float
    until: float
    kind: str  # "waiting" or "kv"
    max_waiting: float
    running: float  # the busy engine's most frequent running count meanwhile (its cap, when it queued)
    peer_running: float
    peer_waiting: float
    max_kv_usage: float | None
    peer_kv_usage: float | None

    @property
    def seconds(self) -> float:
        return self.until - self.since


def _skewed(snap: Snapshot, engine: EngineKey, peer: EngineKey, kv_full: float, kv_gap: float) -> str | None:
    """Whether ``engine`` holds work ``peer`` had room for in this scrape (the gauges each engine last
    reported): waiting while the peer waits for nothing with fewer running, or a KV cache near full
    while the peer's is far emptier."""
    def v(concept: str, key: EngineKey) -> float | None:
        return snap.value(concept, key)

    waiting, peer_waiting = v("num_requests_waiting", engine), v("num_requests_waiting", peer)
    running, peer_running = v("num_requests_running", engine), v("num_requests_running", peer)
    if waiting and running is not None and peer_waiting == 0 and peer_running is not None and peer_running < running:
        return "waiting"
    usage, peer_usage = v("kv_cache_usage_perc", engine), v("kv_cache_usage_perc", peer)
    if usage is not None and peer_usage is not None and usage >= kv_full and peer_usage <= usage - kv_gap:
        return "kv"
    return None


def load_skews(ok: Sequence[tuple[Scrape, Snapshot]], min_seconds: float, kv_full: float,
               kv_gap: float) -> list[LoadSkew]:
    """Engines holding work a peer had room for (:func:`_skewed`) in every scrape of a run of at least
    ``min_seconds``. Judged from the per-engine gauges, which can read 0 on a 2-core host whose
    frontend is the bottleneck (see the module docstring): there nothing is found, never a false skew."""
    engines = engines_of(ok)
    found = []
    for engine in engines:
        for peer in engines:
            if peer == engine:
                continue
            run: list[tuple[Scrape, Snapshot, str]] = []
            for item in [*ok, None]:
                kind = _skewed(item[1], engine, peer, kv_full, kv_gap) if item is not None else None
                if item is not None and kind is not None:
                    run.append((item[0], item[1], kind))
                    continue
                if run and run[-1][0].ts - run[0][0].ts >= min_seconds:
                    found.append(_skew(engine, peer, run))
                run = []
    return found


def _skew(engine: EngineKey, peer: EngineKey, run: list[tuple[Scrape, Snapshot, str]]) -> LoadSkew:
    def gauge(concept: str, key: EngineKey) -> list[float]:
        return [x for _, snap, _ in run if (x := snap.value(concept, key)) is not None]

    running = gauge("num_requests_running", engine)
    kinds = [kind for *_, kind in run]
    usage, peer_usage = gauge("kv_cache_usage_perc", engine), gauge("kv_cache_usage_perc", peer)
    return LoadSkew(
        engine, peer, run[0][0].ts, run[-1][0].ts,
        max(set(kinds), key=kinds.count),
        max(gauge("num_requests_waiting", engine), default=0.0),
        max(set(running), key=running.count) if running else 0.0,
        max(gauge("num_requests_running", peer), default=0.0),
        max(gauge("num_requests_waiting", peer), default=0.0),
        max(usage) if usage else None, max(peer_usage) if peer_usage else None,
    )
