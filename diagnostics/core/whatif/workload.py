"""Step 1 of a what-if: the window's workload from its scrapes alone.

Arrivals per interval are the requests that finished plus the change in requests held (running +
waiting); prompt and output lengths come from the ``request_prompt_tokens`` /
``request_generation_tokens`` histograms (bucket shares, scaled to the exact mean the ``_sum``
gives); n from ``request_params_n``; prefix sharing from the hit/query counters. A window whose
held requests stay level while requests keep finishing is a closed loop (clients that send the next
request when the last one answers) and is replayed as that many clients: raising the cap then
raises throughput, as it would on the real server, instead of only draining a queue.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import Scrape, counter_step, histogram_delta, labels_total, restarted


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Request lengths as the histogram shows them: the share of each bucket, the exact mean."""

    mean: float
    buckets: tuple[tuple[float, float, float], ...]  # (low, high, share), shares summing to 1

    @classmethod
    def from_histogram(cls, hist: Histogram | None) -> LengthDist | None:
        if hist is None or hist.count <= 0:
            return None
        out = []
        low, prev = 0.0, 0.0
        for bound, cum in zip(hist.bounds, hist.cumulative):
            share = (cum - prev) / hist.count
            if share > 0:
                high = bound if math.isfinite(bound) else max(low * 2, hist.sum / hist.count)
                out.append((low, high, share))
            low, prev = bound, cum
        return cls(hist.sum / hist.count, tuple(out))

    def position(self) -> float:
        """Where in its bucket every value sits (0: at the bucket's low edge, 1: at its bound) so that
        the mean is the histogram's exact one: values stay inside the buckets the server counted them
        in. A bimodal workload (short chat prompts, a few 1,900-token documents) keeps both modes."""
        fixed = sum(share * low for low, _, share in self.buckets)
        width = sum(share * (high - low) for low, high, share in self.buckets)
        return min(1.0, max(0.0, (self.mean - fixed) / width)) if width > 0 else 1.0

    def values(self) -> list[tuple[float, float]]:
        """``(value, share)`` per bucket, at :meth:`position`."""
        f = self.position()
        return [(low + f * (high - low), share) for low, high, share in self.buckets]

    def sample(self, rng: random.Random, count: int) -> list[int]:
        """``count`` lengths drawn bucket by bucket, each at :meth:`position` (± 5 % inside its bucket)."""
        if count <= 0:
            return []
        values = self.values()
        picks = rng.choices(values, weights=[share for _, share in values], k=count)
        return [max(1, round(v * rng.uniform(0.95, 1.05))) for v, _ in picks]

    def to_json(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 1),
                "buckets": [{"le": high, "share": round(share, 3)} for _, high, share in self.buckets]}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request as the window's histograms place it: when it arrived (seconds from the window's
    start) and its prompt and output lengths."""

    arrival: float
    prompt: int
    output: int
    finished: bool  # it finished inside the window (its lengths were counted); else drawn from the others


@dataclass(frozen=True, slots=True)
class InferredWorkload:
    """What arrived in the window, as the simulator replays it."""

    seconds: float
    arrivals: tuple[float, ...]  # seconds from the window's start; requests held at its start arrive at 0
    prompt: LengthDist
    output: LengthDist
    n: float  # mean parallel samples per request
    prefix_hit_fraction: float  # of prompt tokens, served from the prefix cache
    closed_loop_clients: int | None  # a closed loop of this many clients; None: open arrivals
    requests_finished: float
    closed_loop_until: float | None = None  # seconds from the start: the clients stopped sending after it
    requests: tuple[TraceRequest, ...] = ()  # the reconstructed trace, by arrival
    max_tokens_mean: float | None = None
    # (seconds from the start, requests) of each interval whose arrivals are replayed at once: see _placed
    bursts: tuple[tuple[float, int], ...] = ()

    @property
    def rate_per_s(self) -> float:
        count = len(self.requests) or len(self.arrivals)
        return count / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "requests_arrived": len(self.requests) or len(self.arrivals),
                "arrival_rate_per_s": round(self.rate_per_s, 3), "requests_finished": self.requests_finished,
                "shape": "closed loop" if self.closed_loop_clients else "open",
                "closed_loop_clients": self.closed_loop_clients,
                "closed_loop_until_seconds": None if self.closed_loop_until is None else round(self.closed_loop_until, 3),
                "prompt_tokens": self.prompt.to_json(),
                "output_tokens": self.output.to_json(), "n": round(self.n, 3),
                "prefix_hit_fraction": round(self.prefix_hit_fraction, 3), "max_tokens_mean": self.max_tokens_mean,
                "requests_reconstructed": sum(1 for r in self.requests if r.finished),
                "requests_still_in_flight": sum(1 for r in self.requests if not r.finished),
                "bursts": [{"at_seconds": round(at, 3), "requests": n} for at, n in self.bursts]}


def _held(snap: Any) -> float | None:
    running, waiting = snap.value("num_requests_running"), snap.value("num_requests_waiting")
    if running is None or waiting is None:
        return None
    return running + waiting


def infer_workload(scrapes: Sequence[Scrape], closed_loop_cv: float = 0.2) -> InferredWorkload | None:
    """The window's workload (None when the server exports too little: no finished-request counter,
    no running/waiting gauges or no length histograms, or nothing arrived)."""
    ok = [s for s in scrapes if s.snapshot is not None]
    if len(ok) < 3:
        return None
    t0, t1 = ok[0].ts, ok[-1].ts
    prompt = LengthDist.from_histogram(histogram_delta(ok, "request_prompt_tokens"))
    output = LengthDist.from_histogram(histogram_delta(ok, "request_generation_tokens"))
    finished_total = labels_total("request_success")
    held0 = _held(ok[0].snapshot)
    if prompt is None or output is None or held0 is None:
        return None
    n_hist = histogram_delta(ok, "request_params_n")
    n = n_hist.sum / n_hist.count if n_hist is not None and n_hist.count else 1.0
    # Counted as vLLM counts them: each of a request's n samples is a request of its own (finished,
    # held, histograms), so the trace is of samples (see _Replay.submit).
    arrivals: list[float] = [0.0] * round(held0)
    finished = 0.0
    held_series: list[float | None] = []  # None: the gauges read 0 while tokens flowed (no reading)
    done_series: list[float] = []  # requests finished in each interval
    ends: list[float] = []
    blind: list[tuple[float, float]] = []
    came: list[tuple[float, float, int]] = []  # (start, end, requests that arrived) of each interval
    for a, b in zip(ok, ok[1:]):
        sa, sb = a.snapshot, b.snapshot
        assert sa is not None and sb is not None
        fa, fb = finished_total(sa), finished_total(sb)
        ha, hb = _held(sa), _held(sb)
        if fa is None or fb is None or ha is None or hb is None:
            continue
        done = counter_step(fa, fb, restarted(sa, sb))
        finished += done
        generated = counter_step(sa.value("generation_tokens") or 0.0, sb.value("generation_tokens") or 0.0,
                                 restarted(sa, sb))
        if ha == 0 and hb == 0 and generated > 0 and done > 0:
            # Requests finished and tokens flowed while both gauges read 0 (vLLM 0.32 can report 0 for
            # seconds after start and on a frontend-bound host): the held count says nothing here, so
            # these requests keep the arrival their own latency gives (see _trace).
            blind.append((a.ts - t0, b.ts - t0))
            held_series.append(None)
            done_series.append(done)
            ends.append(b.ts - t0)
            continue
        came.append((a.ts - t0, b.ts - t0, max(0, round(done + hb - ha))))
        held_series.append(hb)
        done_series.append(done)
        ends.append(b.ts - t0)
    placed, bursts = _placed(came)
    arrivals += placed
    if not arrivals and not blind:
        return None
    hits = queries = 0.0
    for a, b in zip(ok, ok[1:]):
        sa, sb = a.snapshot, b.snapshot
        assert sa is not None and sb is not None
        for concept in ("prefix_cache_hits", "prefix_cache_queries"):
            va, vb = sa.value(concept), sb.value(concept)
            if va is not None and vb is not None:
                step = counter_step(va, vb, restarted(sa, sb))
                hits, queries = (hits + step, queries) if concept == "prefix_cache_hits" else (hits, queries + step)
    max_tokens = histogram_delta(ok, "request_params_max_tokens")
    loop = _closed_loop(held_series, done_series, closed_loop_cv)
    held_end = _held(ok[-1].snapshot) or 0.0
    requests = _trace(ok, arrivals, round(held_end), prompt, output, blind)
    return InferredWorkload(
        seconds=t1 - t0, arrivals=tuple(sorted(arrivals)), prompt=prompt, output=output, n=n,
        prefix_hit_fraction=min(1.0, hits / queries) if queries > 0 else 0.0,
        closed_loop_clients=loop[0] if loop else None,
        requests_finished=finished,
        closed_loop_until=ends[loop[1]] if loop else None,
        requests=tuple(requests),
        max_tokens_mean=max_tokens.sum / max_tokens.count if max_tokens is not None and max_tokens.count else None,
        bursts=() if loop else tuple(bursts),  # a closed loop is replayed by its clients, not its arrivals
    )


BURST_AT_LEAST = 8  # requests in one interval, and BURST_TIMES the window's usual interval, make a burst
BURST_TIMES = 4.0


def _placed(came: Sequence[tuple[float, float, int]]) -> tuple[list[float], list[tuple[float, int]]]:
    """Each interval's arrivals inside it, and the bursts among them. The scrapes cannot say when
    within an interval requests came, so they are spread evenly; except a burst, at least
    ``BURST_AT_LEAST`` requests and ``BURST_TIMES`` those of the window's other busy intervals (their
    median): dozens sent between two scrapes of an otherwise quieter window were sent together, so
    they arrive at once, at the interval's middle. (Spread over its second, the last of a burst of 40
    came a second after the first and found slots already freed; on the real server, under a cap of
    36, four of them waited for a whole request: TTFT p95 875 ms where the spread replay said 99.)"""
    busy = sorted(n for _, _, n in came if n > 0)
    out: list[float] = []
    bursts: list[tuple[float, int]] = []
    for start, end, n in came:
        if n >= BURST_AT_LEAST and n >= BURST_TIMES * _usual_besides(busy, n):
            out += [(start + end) / 2] * n
            bursts.append(((start + end) / 2, n))
        else:
            out += [start + (i + 0.5) * (end - start) / n for i in range(n)]
    return out, bursts


def _usual_besides(busy: Sequence[int], n: int) -> int:
    """The upper median of the sorted busy counts ``busy`` with one ``n`` taken out (0 if none are left)."""
    others = list(busy)
    others.remove(n)
    return others[len(others) // 2] if others else 0


def _expand(hist: Histogram | None, count: int) -> list[float]:
    """``count`` values, one per observation of an interval's histogram, each inside the bucket it
    was counted in, at the position that gives the interval's exact mean."""
    dist = LengthDist.from_histogram(hist)
    if dist is None or count <= 0 or hist is None:
        return []
    out: list[float] = []
    prev = 0.0
    f = dist.position()
    low = 0.0
    for bound, cum in zip(hist.bounds, hist.cumulative):
        n = round(cum - prev)
        high = bound if math.isfinite(bound) else max(low * 2, dist.mean)
        out += [low + f * (high - low)] * n
        low, prev = bound, cum
    return (out + [dist.mean] * count)[:count]


def _trace(ok: Sequence[Scrape], arrivals: Sequence[float], held_end: int, prompt: LengthDist, output: LengthDist,
           blind: Sequence[tuple[float, float]] = (), seed: int = 0) -> list[TraceRequest]:
    """The requests of the window, rebuilt interval by interval: those that finished in an interval
    carry the prompt, output and end-to-end buckets counted in it (one request per interval is exact;
    several are paired longest output with longest latency). Arrival = finish − end-to-end latency;
    one that began before the window replays only its share of output inside it. Requests still
    held at the end get lengths drawn from the finished ones, in proportion to how long each stayed;
    arrival times then come from the per-interval counts (``arrivals``: finished + held changes)."""
    rng = random.Random(seed)
    t0 = ok[0].ts
    out: list[TraceRequest] = []
    shapes: list[tuple[int, int, float]] = []  # (prompt, output, end-to-end) of each finished request
    for a, b in zip(ok, ok[1:]):
        pair = [a, b]
        outputs = histogram_delta(pair, "request_generation_tokens")
        k = round(outputs.count) if outputs is not None else 0
        if k <= 0:
            continue
        o_vals = sorted(_expand(outputs, k))
        e_vals = sorted(_expand(histogram_delta(pair, "e2e_request_latency_seconds"), k))
        p_vals = _expand(histogram_delta(pair, "request_prompt_tokens"), k)
        rng.shuffle(p_vals)
        finish = (a.ts + b.ts) / 2 - t0
        for i in range(k):
            out_len = max(1, round(o_vals[i]))
            e2e = e_vals[i] if i < len(e_vals) else 0.0
            shapes.append((max(1, round(p_vals[i])) if i < len(p_vals) else 1, out_len, max(e2e, 1e-3)))
            arrival = finish - e2e
            if arrival < 0 and e2e > 0:  # in flight when the window began: only its rest is replayed
                out_len = max(1, round(out_len * finish / e2e))
                arrival = 0.0
            out.append(TraceRequest(max(0.0, arrival), max(1, round(p_vals[i])) if i < len(p_vals) else 1, out_len,
                                    True))
    # When requests arrived is better known in bulk than one by one: the counters say how many came
    # in each interval (``arrivals``), a latency bucket only roughly when each did. So the rebuilt
    # requests, and those still held at the end (lengths drawn from the finished ones), take those
    # arrival slots in the order their own estimates give.
    # Requests whose own estimate falls in an interval where the gauges read 0 keep it (no count
    # there to place them by).
    kept = [r for r in out if any(lo <= r.arrival <= hi for lo, hi in blind)]
    out = [r for r in out if r not in kept]
    slots = sorted(arrivals)
    # Every request of the window either finished in it (rebuilt above) or is still held at its end.
    late_count = held_end
    if shapes:
        # A request still held at the end is more likely a long-lived kind (Little's law): drawn from
        # the finished ones in proportion to how long each stayed.
        drawn = [(p, o) for p, o, _ in rng.choices(shapes, weights=[e for *_, e in shapes], k=late_count)]
    else:
        drawn = list(zip(prompt.sample(rng, late_count), output.sample(rng, late_count)))
    last = slots[-1] if slots else (out[-1].arrival if out else 0.0)
    everyone = sorted(out, key=lambda r: r.arrival) + [TraceRequest(last, p, o, False) for p, o in drawn]
    placed = [replace(r, arrival=slots[i]) if i < len(slots) else r for i, r in enumerate(everyone)]
    return sorted(placed + kept, key=lambda r: r.arrival)


def _closed_loop(held: Sequence[float | None], done: Sequence[float], max_cv: float) -> tuple[int, int] | None:
    """Clients in a closed loop, and the interval after which they stopped sending: requests held
    stay level (within ``max_cv`` of that level) over at least half of the loaded part of the window,
    and while they stayed level at least a round of requests finished (each replaced by the next,
    which a burst draining or a queue building never does); a drain at the end (the clients stopped)
    is left out. The level is the upper quartile of the held counts: on a busy 2-core host vLLM's
    gauges sometimes read low (never high) for a scrape or two."""
    busy = sorted(h for h in held if h)
    if len(busy) < 5:
        return None
    level = busy[(3 * len(busy)) // 4]
    plateau = [i for i, h in enumerate(held) if h and abs(h - level) <= max_cv * level]
    replaced = sum(done[i] for i in plateau)
    if level < 2 or len(plateau) < 0.5 * len(busy) or replaced < level:
        return None
    return round(level), plateau[-1]
