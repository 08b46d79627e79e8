"""Outcomes, the fourth golden signal: what became of the requests clients sent in a window.

Two counters tell it, and each sees what the other cannot:

- ``vllm:request_success_total{finished_reason}``: requests the *engine* finished, by why it stopped
  (``stop``, ``length``, ``error``; ``abort`` and ``repetition`` where a version counts them). One per
  sequence: a request with ``n=4`` counts four, so the client requests the engine finished are read
  from ``vllm:request_params_n_count`` (observed once per request, when its last sample is done).
- ``http_requests_total{handler,status}`` (prometheus-fastapi-instrumentator in vLLM's API server), on
  the generation handlers: every answer, including the ones the engine never saw (HTTP 400 for a
  prompt beyond ``--max-model-len``, 503 from the admission limits) and the streams a client closed.
  A client that gives up gets a 2xx (the stream's headers went out before it waited, or the handler
  returned nothing after the disconnect) and its request is aborted: vLLM 0.32 counts it in no
  ``vllm:`` series. The give-ups are therefore the 2xx answers the engine never finished.

The request-length histograms (``request_prompt_tokens``, ``request_generation_tokens``) tell the
answers vLLM cut at the context limit apart from a client's own ``max_tokens``: vLLM clamps
``max_tokens`` to ``max_model_len - prompt`` (``get_max_tokens``), so a clamped answer finishes
``length`` with prompt + output exactly ``max_model_len``, and one the client sized itself (a benchmark
with ``ignore_eos``) finishes ``length`` short of it. Per interval, ``c`` finished sequences whose
prompt + output tokens sum to ``T`` include at least ``T - c * (max_model_len - 1)`` that reached the
limit (each of the others holds at most ``max_model_len - 1``): exact when all of them did, a lower
bound otherwise, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagnostics.core.metrics.catalog import Histogram, Snapshot
from diagnostics.core.metrics.derive import Scrape, counter_step, histogram_step, restarted

if TYPE_CHECKING:  # the context holds the window's outcomes, computed once by prepare()
    from diagnostics.core.diagnosis.context import Context


@dataclass(frozen=True, slots=True)
class Share:
    """Some of a window's requests against the requests they are a share of (the rules' and the pages'
    one reading of it). ``count`` None: the server does not export what would count them."""

    count: float | None
    of: float

    @property
    def perc(self) -> float | None:
        """count / of (0..1); None when it is not counted or there is nothing to share."""
        return self.count / self.of if self.count is not None and self.of > 0 else None


@dataclass(frozen=True, slots=True)
class Step:
    """What one interval between two good scrapes added (None: the server does not export it)."""

    start: float
    end: float
    finished: dict[str, float]  # request_success by finished_reason (sequences)
    http: dict[str, float] | None  # generation handlers by status class
    engine_requests: float | None  # client requests the engine finished (n > 1 once)
    shed: float  # admission rejections (HTTP 503 from the queue limits)
    prompt: Histogram | None  # request_prompt_tokens observations added
    generation: Histogram | None  # request_generation_tokens observations added

    @property
    def gave_up(self) -> float:
        """2xx answers the engine did not finish in this interval (0 when either count is missing)."""
        if self.http is None or self.engine_requests is None:
            return 0.0
        return max(0.0, self.http.get("2xx", 0.0) - self.engine_requests)

    def cut_at(self, max_model_len: int) -> float:
        """Sequences that finished ``length`` here with prompt + output at ``max_model_len`` (a lower
        bound, exact when every sequence finished in the interval reached it)."""
        length = self.finished.get("length", 0.0)
        if length <= 0 or self.prompt is None or self.generation is None:
            return 0.0
        count = self.generation.count
        total = self.prompt.sum + self.generation.sum
        if count <= 0 or self.prompt.count != count or math.isnan(total):
            return 0.0
        return float(min(length, max(0, math.floor(total - count * (max_model_len - 1) + 0.5))))


@dataclass(frozen=True, slots=True)
class Outcomes:
    """The window's requests by outcome. Engine counts are sequences; HTTP counts are client requests."""

    start: float
    end: float
    steps: tuple[Step, ...]
    max_model_len: int | None
    # Requests the engine had finished by the first scrape whose 2xx was not yet counted (the answer
    # is counted when its last byte goes out): counted inside the window, they are no give-ups. Read
    # as the engine's lifetime finished requests less the lifetime 2xx answers (0 when negative).
    lag_at_start: float = 0.0

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def _sum(self, pick: Any) -> float:
        return float(sum(pick(s) for s in self.steps))

    @property
    def exports_http(self) -> bool:
        return any(s.http is not None for s in self.steps)

    @property
    def finished(self) -> dict[str, float]:
        """request_success's increase by finished_reason (sequences)."""
        out: dict[str, float] = {}
        for s in self.steps:
            for reason, n in s.finished.items():
                out[reason] = out.get(reason, 0.0) + n
        return out

    def http(self, status: str) -> float | None:
        """Generation requests answered with ``status`` (``"2xx"``…); None when not exported."""
        if not self.exports_http:
            return None
        return self._sum(lambda s: (s.http or {}).get(status, 0.0))

    @property
    def answered(self) -> float | None:
        return self.http("2xx")

    @property
    def rejected(self) -> float | None:
        """HTTP 4xx on the generation handlers: refused before the engine saw them."""
        return self.http("4xx")

    @property
    def shed(self) -> float:
        return self._sum(lambda s: s.shed)

    @property
    def server_errors(self) -> float | None:
        """HTTP 5xx on the generation handlers, less the 503s of the admission limits (load shed by
        design, which the admission rule reports)."""
        five = self.http("5xx")
        return None if five is None else max(0.0, five - self.shed)

    @property
    def failed(self) -> float:
        """Requests that failed on the server: finished ``error``, or answered 5xx (not shed). The
        larger of the two, since a non-streaming request that errors may count in both."""
        return max(self.finished.get("error", 0.0), self.server_errors or 0.0)

    @property
    def failed_range(self) -> tuple[float, float]:
        """From the start of the first interval in which a request failed to the end of the last
        (the window when none did): when the failures began, not when the window did."""
        hit = [s for s in self.steps if s.finished.get("error", 0.0) > 0 or
               (s.http is not None and s.http.get("5xx", 0.0) - s.shed > 0)]
        return (hit[0].start, hit[-1].end) if hit else (self.start, self.end)

    @property
    def engine_requests(self) -> float | None:
        return None if any(s.engine_requests is None for s in self.steps) or not self.steps else \
            self._sum(lambda s: s.engine_requests or 0.0)

    @property
    def gave_up(self) -> float | None:
        """2xx answers over the window that the engine never finished (clients that disconnected);
        None when either count is missing. Judged over the whole window, so a request the engine
        finished a moment before its answer was counted does not count as given up."""
        answered, done = self.answered, self.engine_requests
        if answered is None or done is None:
            return None
        return max(0.0, answered - done - self.lag_at_start)

    @property
    def aborted(self) -> float:
        return self.finished.get("abort", 0.0)

    @property
    def cut(self) -> float | None:
        """Sequences cut at the context limit (a lower bound); None when max_model_len is unknown."""
        if self.max_model_len is None or not any(s.prompt is not None for s in self.steps):
            return None
        m = self.max_model_len
        return self._sum(lambda s: s.cut_at(m))

    @property
    def requests(self) -> float:
        """Client requests that got an answer: every HTTP status on the generation handlers, or the
        engine's finished requests where the server does not export the HTTP counter."""
        if self.exports_http:
            return sum(self.http(status) or 0.0 for status in ("2xx", "4xx", "5xx"))
        return self.engine_requests or sum(self.finished.values())

    @property
    def failed_share(self) -> Share:
        """Failed requests (finished ``error`` or HTTP 5xx, not shed) of every request answered."""
        return Share(self.failed, self.requests)

    @property
    def rejected_share(self) -> Share:
        """HTTP 4xx refusals of every request answered (not counted without http_requests_total)."""
        return Share(self.rejected, self.requests)

    @property
    def gave_up_share(self) -> Share:
        """Give-ups of the 2xx answers: a client that gave up still got its 2xx (its headers went out)."""
        return Share(self.gave_up, self.answered or 0.0)

    def gave_up_range(self) -> tuple[float, float] | None:
        """From the first interval in which an answer went unfinished to the last."""
        hit = [s for s in self.steps if s.gave_up > 0]
        return (hit[0].start, hit[-1].end) if hit else None

    def says(self) -> str:
        """The counts in words, as a quiet verdict states them."""
        if not self.steps:
            return "not judged: fewer than two good scrapes in the window"
        if not self.exports_http:
            return (f"{self.requests:,.0f} requests finished by the engine in {self.seconds:.0f} s, {self.failed:,.0f} "
                    "failed; rejected and given-up requests not visible (no http_requests_total)")
        cut = "" if self.cut is None else f", {self.cut:,.0f} cut at the context limit"
        shed = f" ({self.shed:,.0f} shed by the admission limits)" if self.shed else ""
        return (f"{self.requests:,.0f} requests in {self.seconds:.0f} s: {self.failed:,.0f} failed, "
                f"{self.rejected or 0:,.0f} rejected, {self.gave_up or 0:,.0f} given up{cut}{shed}")

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "requests": self.requests, "answered": self.answered,
                "rejected": self.rejected, "server_errors": self.server_errors, "shed": self.shed,
                "failed": self.failed, "gave_up": self.gave_up, "cut_at_context": self.cut,
                "finished": self.finished, "max_model_len": self.max_model_len,
                "failed_share_perc": self.failed_share.perc, "rejected_share_perc": self.rejected_share.perc,
                "gave_up_share_perc": self.gave_up_share.perc}


def _labelled(a: Snapshot, b: Snapshot, concept: str, restart: bool) -> dict[str, float] | None:
    va, vb = a.by_label(concept), b.by_label(concept)
    if va is None or vb is None:
        return None
    return {label: counter_step(va.get(label, 0.0), v, restart) for label, v in vb.items()}


def _hist(a: Snapshot, b: Snapshot, concept: str) -> Histogram | None:
    ha, hb = a.histogram(concept), b.histogram(concept)
    return histogram_step(a, ha, b, hb) if ha is not None and hb is not None else None


def _step(prev: tuple[Scrape, Snapshot], cur: tuple[Scrape, Snapshot]) -> Step:
    (sa, a), (sb, b) = prev, cur
    restart = restarted(a, b)
    finished = _labelled(a, b, "request_success", restart) or {}
    params_n = _hist(a, b, "request_params_n")
    engine_requests = params_n.count if params_n is not None else (
        sum(n for reason, n in finished.items() if reason != "abort") if b.has("request_success") else None)
    shed = _labelled(a, b, "admission_rejections", restart) or {}
    return Step(sa.ts, sb.ts, finished, _labelled(a, b, "http_requests", restart), engine_requests,
                sum(shed.values()), _hist(a, b, "request_prompt_tokens"), _hist(a, b, "request_generation_tokens"))


def outcomes_of(ok: Sequence[tuple[Scrape, Snapshot]], max_model_len: int | None) -> Outcomes:
    """The outcomes over consecutive good scrapes (empty with fewer than two)."""
    steps = tuple(_step(a, b) for a, b in zip(ok, ok[1:]))
    start, end = (ok[0][0].ts, ok[-1][0].ts) if ok else (0.0, 0.0)
    return Outcomes(start, end, steps, max_model_len, _lag(ok[0][1], steps[0] if steps else None) if ok else 0.0)


def _lag(first: Snapshot, first_step: Step | None) -> float:
    """Requests the engine had finished by a window's first scrape whose 2xx was not counted yet: the
    lifetime requests it finished well (not 'error': those were answered 5xx; not 'abort': a client
    that left) less the lifetime 2xx answers, and never more than the engine finished in the window's
    first interval (answers in flight are the last moment's; a lifetime count of failures or give-ups
    from before the window must not hide or make give-ups inside it)."""
    http = first.by_label("http_requests")
    params_n = first.histogram("request_params_n")
    finished = first.by_label("request_success") or {}
    if http is None or (params_n is None and not finished):
        return 0.0
    not_done = finished.get("error", 0.0) + finished.get("abort", 0.0)
    done = (params_n.count - not_done if params_n is not None else
            sum(n for reason, n in finished.items() if reason not in ("abort", "error")))
    lag = max(0.0, done - http.get("2xx", 0.0))
    recent = first_step.engine_requests if first_step is not None else None
    return min(lag, recent) if recent is not None else lag


def window_outcomes(scrapes: Sequence[Scrape], max_model_len: int | None) -> Outcomes:
    """The outcomes over a window of scrapes (its good ones), as :func:`outcomes` reads a context's."""
    return outcomes_of([(s, s.snapshot) for s in scrapes if s.snapshot is not None], max_model_len)


def outcomes(ctx: Context) -> Outcomes:
    """The outcomes of the context's window, judged against the server's known ``--max-model-len``
    (computed once, when the context was prepared: every outcome rule and the pages read the same)."""
    return ctx.outcomes
