"""The verify-under-load probe (pure): what to send, the caps that bound it, and what the clients
measured — TTFT, inter-token gaps, end-to-end latency, throughput, errors by kind — summarised the
way ``vllm bench serve`` does (percentiles by linear interpolation, ITL over every gap of every
request, output throughput over the whole run), beside what the server's own histograms said over
the same window. The HTTP side is :mod:`diagnostics.sources.probe_http`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from diagnostics.core.metrics.catalog import Snapshot
from diagnostics.core.metrics.derive import Scrape, counter_steps, histogram_delta, quantile_estimate

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


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "p99": percentile(values, 99)}


@dataclass(frozen=True, slots=True)
class ProbeSummary:
    spec: ProbeSpec
    target: str
    started: float
    ended: float
    results: tuple[RequestResult, ...]
    cancelled: bool = False
    server: Mapping[str, Any] = field(default_factory=dict)  # what the server's metrics said

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def duration(self) -> float:
        return max(self.ended - self.started, 1e-9)

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
        ok = self.ok
        output = sum(r.output_tokens for r in ok)
        return {
            "target": self.target,
            "spec": self.spec.to_json(),
            "started": self.started,
            "ended": self.ended,
            "cancelled": self.cancelled,
            "requests": len(self.results),
            "completed": len(ok),
            "errors": len(self.results) - len(ok),
            "errors_by_kind": self.errors_by_kind(),
            "error_details": self.error_details(),
            "duration_seconds": self.duration,
            "output_tokens": output,
            "output_tokens_per_second": output / self.duration,
            "requests_per_second": len(ok) / self.duration,
            "ttft_seconds": percentiles([r.ttft for r in ok if r.ttft is not None]),
            "itl_seconds": percentiles([g for r in ok for g in r.gaps]),
            "e2e_seconds": percentiles([r.end - r.start for r in ok]),
            "server": dict(self.server),
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
        return replace(summary, server={"note": "no scrape brackets the probe: the server side is unknown"})
    span = [before[-1], *[s for s in window if summary.started < s.ts < summary.ended], after[0]]
    server: dict[str, Any] = {"from_ts": span[0].ts, "to_ts": span[-1].ts}
    picks: dict[str, Callable[[Snapshot], float | None]] = {
        "requests_finished": _finished,
        "generation_tokens": lambda s: s.value("generation_tokens"),
    }
    for key, pick in picks.items():
        steps = counter_steps(span, pick)
        server[key] = sum(inc for _, _, inc in steps) if steps else None
    for concept, key in (
        ("time_to_first_token_seconds", "ttft_seconds"),
        ("inter_token_latency_seconds", "itl_seconds"),
        ("e2e_request_latency_seconds", "e2e_seconds"),
    ):
        hist = histogram_delta(span, concept)
        server[key] = {}
        for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            est = quantile_estimate(q, hist)
            server[key][name] = None if est is None else {"value": est.value, "lower": est.lower,
                                                          "upper": est.upper, "bound": est.bound}
    return replace(summary, server=server)


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


def disagreements(summary: Mapping[str, Any], tolerance: float = 0.10, floor_s: float = 0.002) -> list[Disagreement]:
    """Where a client-side percentile falls outside the bucket the server's histogram puts it in
    (a bucket is all a histogram knows, so inside it is agreement), by more than ``tolerance`` of
    the value or ``floor_s`` (a client's clock and the network add a little to every number)."""
    out = []
    server = summary.get("server", {})
    for key, metric in (("ttft_seconds", "TTFT"), ("itl_seconds", "ITL"), ("e2e_seconds", "e2e")):
        for p in ("p50", "p95", "p99"):
            client = summary.get(key, {}).get(p)
            bucket = server.get(key, {}).get(p) if isinstance(server.get(key), dict) else None
            if client is None or not bucket:
                continue
            lower, upper = bucket["lower"], bucket["upper"]
            slack = max(tolerance * client, floor_s)
            if client < lower - slack or (math.isfinite(upper) and client > upper + slack):
                out.append(Disagreement(f"{metric} {p}", client, lower, upper))
    return out


def comparison(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, float | None, float | None, str]]:
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

    add("output tok/s", before.get("output_tokens_per_second"), after.get("output_tokens_per_second"), "higher")
    add("requests/s", before.get("requests_per_second"), after.get("requests_per_second"), "higher")
    for key, label in (("ttft_seconds", "TTFT"), ("itl_seconds", "ITL"), ("e2e_seconds", "e2e")):
        for p in ("p50", "p95", "p99"):
            add(f"{label} {p} (s)", before.get(key, {}).get(p), after.get(key, {}).get(p), "lower")
    add("errors", float(before.get("errors", 0)), float(after.get("errors", 0)), "lower")
    return rows
