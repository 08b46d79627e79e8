"""The verify-under-load probe (pure): what to send, the caps that bound it, and what the clients
measured — TTFT, inter-token gaps, end-to-end latency, throughput, errors by kind — summarised the
way ``vllm bench serve`` does (percentiles by linear interpolation, ITL over every gap of every
request, output throughput over the whole run), beside what the server's own histograms said over
the same window. The HTTP side is :mod:`diagnostics.sources.probe_http`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from diagnostics.core.metrics.catalog import Snapshot
from diagnostics.core.metrics.derive import Quantile, Scrape, counter_steps, histogram_delta, quantile_estimate

# Hard caps: the probe loads a server that may already be in trouble.
MAX_CONCURRENCY = 128
MAX_REQUESTS = 2000
MAX_SECONDS = 600.0
MAX_PROMPT_TOKENS = 32768
MAX_OUTPUT_TOKENS = 4096
MAX_N = 16

ERROR_KINDS = (
    "connect", "timeout", "http_4xx", "http_5xx", "stream_error", "disconnected", "bad_response", "cancelled",
)


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """One probe: ``concurrency`` clients send requests back to back until ``requests`` were sent
    or ``seconds`` passed (whichever is set; both: whichever comes first)."""

    concurrency: int = 8
    requests: int | None = 32
    seconds: float | None = None
    prompt_tokens: int = 128
    max_tokens: int = 64
    ignore_eos: bool = True
    shared_prefix_tokens: int = 0  # the first tokens of every prompt are the same (prefix caching)
    n: int = 1
    model: str | None = None  # None: the server's first model
    seed: int = 0
    request_timeout_seconds: float = 120.0

    def problems(self) -> list[str]:
        """Why this probe may not run (empty when it may): the caps, and values that make no sense."""
        out = []
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            out.append(f"concurrency must be 1…{MAX_CONCURRENCY} (asked {self.concurrency})")
        if self.requests is None and self.seconds is None:
            out.append("give a number of requests or a duration")
        if self.requests is not None and not 1 <= self.requests <= MAX_REQUESTS:
            out.append(f"requests must be 1…{MAX_REQUESTS} (asked {self.requests})")
        if self.seconds is not None and not 0 < self.seconds <= MAX_SECONDS:
            out.append(f"duration must be at most {MAX_SECONDS:g} s (asked {self.seconds:g})")
        if not 1 <= self.prompt_tokens <= MAX_PROMPT_TOKENS:
            out.append(f"prompt tokens must be 1…{MAX_PROMPT_TOKENS} (asked {self.prompt_tokens})")
        if not 1 <= self.max_tokens <= MAX_OUTPUT_TOKENS:
            out.append(f"max tokens must be 1…{MAX_OUTPUT_TOKENS} (asked {self.max_tokens})")
        if not 0 <= self.shared_prefix_tokens <= self.prompt_tokens:
            out.append("the shared prefix must fit in the prompt")
        if not 1 <= self.n <= MAX_N:
            out.append(f"n must be 1…{MAX_N} (asked {self.n})")
        return out

    def describe(self, target: str) -> str:
        """The load this probe adds, in the words of its confirmation."""
        amount = (
            f"{self.requests} requests" if self.seconds is None
            else f"requests for {self.seconds:g} s" if self.requests is None
            else f"up to {self.requests} requests within {self.seconds:g} s"
        )
        extra = "".join((
            f", n = {self.n}" if self.n > 1 else "",
            f", {self.shared_prefix_tokens} of them shared" if self.shared_prefix_tokens else "",
            "" if self.ignore_eos else ", stopping at EOS",
        ))
        return (
            f"{self.concurrency} concurrent clients sending {amount} to {target}: prompts of "
            f"{self.prompt_tokens} tokens{extra}, up to {self.max_tokens} output tokens each"
        )

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def prompt_at(spec: ProbeSpec, i: int, vocab: int = 2000) -> list[int]:
    """The ``i``-th prompt as token ids (exact lengths, whatever the tokenizer), reproducible from
    the seed and different for every ``i`` (no accidental prefix-cache hits however long a probe
    runs); the first ``shared_prefix_tokens`` are the same in every prompt. Ids start at 10 to stay
    clear of special tokens."""
    prefix_rng = random.Random(f"{spec.seed}:prefix")
    prefix = [prefix_rng.randrange(10, vocab) for _ in range(spec.shared_prefix_tokens)]
    rng = random.Random(f"{spec.seed}:{i}")
    return prefix + [rng.randrange(10, vocab) for _ in range(spec.prompt_tokens - spec.shared_prefix_tokens)]


def prompts(spec: ProbeSpec, count: int) -> list[list[int]]:
    return [prompt_at(spec, i) for i in range(count)]


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one client saw of one request (wall-clock seconds)."""

    start: float
    end: float
    ttft: float | None = None  # first output token, from the start
    gaps: tuple[float, ...] = ()  # between consecutive output chunks of one choice
    output_tokens: int = 0
    error: str | None = None  # one of ERROR_KINDS
    detail: str | None = None  # the server's words, for the first error of each kind

    @property
    def ok(self) -> bool:
        return self.error is None


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default, as ``vllm bench serve`` uses)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Percentiles(Generic[T]):
    """The 50th, 95th and 99th percentile of one latency (None: no sample, or no observation)."""

    p50: T | None
    p95: T | None
    p99: T | None

    @staticmethod
    def of(values: Sequence[float]) -> Percentiles[float]:
        """Of the clients' samples, as ``vllm bench serve`` computes them."""
        return Percentiles(percentile(values, 50), percentile(values, 95), percentile(values, 99))

    def items(self) -> tuple[tuple[str, T | None], ...]:
        return (("p50", self.p50), ("p95", self.p95), ("p99", self.p99))


def _bucket_json(est: Quantile | None) -> dict[str, Any] | None:
    return None if est is None else {"value": est.value, "lower": est.lower, "upper": est.upper, "bound": est.bound}


@dataclass(frozen=True, slots=True)
class ServerSide:
    """What the server's own metrics said over a probe's window (the scrapes from just before it
    started to just after it ended): counter increases and each latency histogram's percentiles
    with the bucket they fall in."""

    from_ts: float
    to_ts: float
    requests_finished: float | None
    generation_tokens: float | None
    ttft: Percentiles[Quantile]
    itl: Percentiles[Quantile]
    e2e: Percentiles[Quantile]

    def to_json(self) -> dict[str, Any]:
        return {
            "from_ts": self.from_ts,
            "to_ts": self.to_ts,
            "requests_finished": self.requests_finished,
            "generation_tokens": self.generation_tokens,
            **{key: {p: _bucket_json(est) for p, est in pcts.items()}
               for key, pcts in (("ttft_seconds", self.ttft), ("itl_seconds", self.itl), ("e2e_seconds", self.e2e))},
        }


@dataclass(frozen=True, slots=True)
class LatencyRow:
    """One latency percentile of a probe: what the clients measured beside the server's bucket."""

    metric: str  # TTFT, ITL or e2e
    percentile: str  # p50, p95 or p99
    client: float | None
    server: Quantile | None

    @property
    def name(self) -> str:
        return f"{self.metric} {self.percentile}"


@dataclass(frozen=True, slots=True)
class ProbeSummary:
    """What a probe's clients measured (and, once :func:`with_server` added it, what the server's
    metrics said over the same window), typed until :meth:`to_json` writes the ``probe --json``
    object."""

    spec: ProbeSpec
    target: str
    started: float
    ended: float
    results: tuple[RequestResult, ...]
    cancelled: bool = False
    server: ServerSide | None = None
    server_note: str | None = None  # why the server side is unknown
    failure: str | None = None  # why the probe stopped early, or could not start

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def duration(self) -> float:
        return max(self.ended - self.started, 1e-9)

    @property
    def num_errors(self) -> int:
        return len(self.results) - len(self.ok)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)

    @property
    def output_tokens_per_second(self) -> float:
        """Over the whole run, as ``vllm bench serve`` reports it."""
        return self.output_tokens / self.duration

    @property
    def requests_per_second(self) -> float:
        return len(self.ok) / self.duration

    def ttft_samples(self) -> list[float]:
        return [r.ttft for r in self.ok if r.ttft is not None]

    def itl_samples(self) -> list[float]:
        """Every gap of every completed request."""
        return [g for r in self.ok for g in r.gaps]

    def e2e_samples(self) -> list[float]:
        return [r.end - r.start for r in self.ok]

    def latencies(self) -> tuple[tuple[str, Percentiles[float], Percentiles[Quantile] | None], ...]:
        """(metric, the clients' percentiles, the server's) for TTFT, ITL and e2e."""
        server = self.server
        return (
            ("TTFT", Percentiles.of(self.ttft_samples()), server.ttft if server else None),
            ("ITL", Percentiles.of(self.itl_samples()), server.itl if server else None),
            ("e2e", Percentiles.of(self.e2e_samples()), server.e2e if server else None),
        )

    def latency_rows(self) -> list[LatencyRow]:
        """TTFT, ITL and e2e at p50, p95 and p99, the clients beside the server's bucket."""
        rows: list[LatencyRow] = []
        for metric, client, server in self.latencies():
            buckets = dict(server.items()) if server is not None else {}
            rows.extend(LatencyRow(metric, p, value, buckets.get(p)) for p, value in client.items())
        return rows

    def errors_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            if r.error is not None:
                out[r.error] = out.get(r.error, 0) + 1
        return out

    def error_details(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for r in self.results:
            if r.error is not None and r.detail and r.error not in out:
                out[r.error] = r.detail
        return out

    def to_json(self) -> dict[str, Any]:
        ttft, itl, e2e = (client for _, client, _ in self.latencies())
        server = self.server.to_json() if self.server else {"note": self.server_note} if self.server_note else {}
        return {
            "target": self.target,
            "spec": self.spec.to_json(),
            "started": self.started,
            "ended": self.ended,
            "cancelled": self.cancelled,
            "requests": len(self.results),
            "completed": len(self.ok),
            "errors": self.num_errors,
            "errors_by_kind": self.errors_by_kind(),
            "error_details": self.error_details(),
            "duration_seconds": self.duration,
            "output_tokens": self.output_tokens,
            "output_tokens_per_second": self.output_tokens_per_second,
            "requests_per_second": self.requests_per_second,
            "ttft_seconds": dict(ttft.items()),
            "itl_seconds": dict(itl.items()),
            "e2e_seconds": dict(e2e.items()),
            "server": server,
            "failure": self.failure,
        }


SETTLE_SECONDS = 0.25
"""A scrape is stamped when its answer arrives: one stamped this long after the probe ended was
sent after it too (an idle server answers /metrics in a few tens of milliseconds)."""


def with_server(summary: ProbeSummary, history: Sequence[Scrape]) -> ProbeSummary:
    """The summary with what the server's own metrics said over the probe's window (the scrapes
    from just before it started to just after it ended): requests finished, tokens generated and
    its TTFT / ITL / e2e percentiles, each with the bucket it falls in."""
    window = [s for s in history if s.snapshot is not None]
    before = [s for s in window if s.ts <= summary.started]
    after = [s for s in window if s.ts >= summary.ended + SETTLE_SECONDS]
    if not before or not after:
        return replace(summary, server=None, server_note="no scrape brackets the probe: the server side is unknown")
    span = [before[-1], *[s for s in window if summary.started < s.ts < summary.ended], after[0]]

    def increase(pick: Callable[[Snapshot], float | None]) -> float | None:
        steps = counter_steps(span, pick)
        return sum(inc for _, _, inc in steps) if steps else None

    def percentiles(concept: str) -> Percentiles[Quantile]:
        hist = histogram_delta(span, concept)
        return Percentiles(quantile_estimate(0.5, hist), quantile_estimate(0.95, hist), quantile_estimate(0.99, hist))

    server = ServerSide(
        from_ts=span[0].ts,
        to_ts=span[-1].ts,
        requests_finished=increase(_finished),
        generation_tokens=increase(lambda s: s.value("generation_tokens")),
        ttft=percentiles("time_to_first_token_seconds"),
        itl=percentiles("inter_token_latency_seconds"),
        e2e=percentiles("e2e_request_latency_seconds"),
    )
    return replace(summary, server=server, server_note=None)


def _finished(snapshot: Snapshot) -> float | None:
    by_reason = snapshot.by_label("request_success")
    return None if by_reason is None else sum(by_reason.values())


@dataclass(frozen=True, slots=True)
class Disagreement:
    metric: str
    client: float
    server_low: float
    server_high: float

    @property
    def text(self) -> str:
        if self.client < self.server_low:
            return (f"{self.metric}: the clients saw {self.client * 1000:.1f} ms, below the server's bucket "
                    f"{self.server_low * 1000:g}–{self.server_high * 1000:g} ms")
        return (f"{self.metric}: the clients saw {self.client * 1000:.1f} ms, "
                f"{(self.client - self.server_high) * 1000:.1f} ms above the server's bucket "
                f"{self.server_low * 1000:g}–{self.server_high * 1000:g} ms (network, queueing in the "
                f"API server, or the client's own load)")


def disagreements(summary: ProbeSummary, tolerance: float = 0.10, floor_s: float = 0.002) -> list[Disagreement]:
    """Where a client-side percentile falls outside the bucket the server's histogram puts it in
    (a bucket is all a histogram knows, so inside it is agreement), by more than ``tolerance`` of
    the value or ``floor_s`` (a client's clock and the network add a little to every number)."""
    out = []
    for row in summary.latency_rows():
        client, bucket = row.client, row.server
        if client is None or bucket is None:
            continue
        slack = max(tolerance * client, floor_s)
        if client < bucket.lower - slack or (math.isfinite(bucket.upper) and client > bucket.upper + slack):
            out.append(Disagreement(row.name, client, bucket.lower, bucket.upper))
    return out


def comparison(before: ProbeSummary, after: ProbeSummary) -> list[tuple[str, float | None, float | None, str]]:
    """Two probe results side by side: (metric, before, after, change) for the numbers a flag
    change is meant to move."""
    rows: list[tuple[str, float | None, float | None, str]] = []

    def add(name: str, a: float | None, b: float | None, better: str) -> None:
        if a is None or b is None or a == b == 0:
            change = "—"
        elif a == 0:
            change = f"from 0 to {b:g}" + (" (worse)" if better == "lower" else " (better)")
        else:
            pct = (b - a) / a * 100
            good = (pct < 0) == (better == "lower")
            change = f"{pct:+.0f} %" + ("" if abs(pct) < 1 else " (better)" if good else " (worse)")
        rows.append((name, a, b, change))

    add("output tok/s", before.output_tokens_per_second, after.output_tokens_per_second, "higher")
    add("requests/s", before.requests_per_second, after.requests_per_second, "higher")
    for a, b in zip(before.latency_rows(), after.latency_rows(), strict=True):
        add(f"{a.name} (s)", a.client, b.client, "lower")
    add("errors", float(before.num_errors), float(after.num_errors), "lower")
    return rows
