"""Outcomes: requests that failed, were refused, were given up on, or were answered cut short.

Read from :mod:`~diagnostics.core.diagnosis.outcomes` (``request_success`` by ``finished_reason``,
``http_requests_total`` on the generation handlers, the request-length histograms). Each of these is
a failure a user saw, so each is at least a warning; counts under ``outcome_min_requests`` or under
the rule's share of the window's requests say nothing.
"""

from __future__ import annotations

from typing import Any

from diagnostics.core.diagnosis.causes import Ruling, differential
from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.outcomes import Outcomes, outcomes
from diagnostics.core.diagnosis.rules.common import max_gauge, quantile_evidence
from diagnostics.core.diagnosis.rules.memory import suggest_more_kv
from diagnostics.core.diagnosis.rules.signatures import (
    rejected_differential,
    token_budget_target,
    waiting_differential,
    waiting_in,
)
from diagnostics.core.diagnosis.types import Finding, Suggestion
from diagnostics.core.metrics.derive import histogram_delta, quantile_estimate
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.text import fmt_duration, fmt_seconds_as_ms


def _counts(o: Outcomes) -> dict[str, Any]:
    """The window's outcome counts, as every outcome finding's evidence carries them."""
    return {"requests": o.requests, "answered_2xx": o.answered, "rejected_4xx": o.rejected,
            "server_errors_5xx": o.server_errors, "shed_503": o.shed, "gave_up": o.gave_up,
            "finished_by_reason": {k: v for k, v in o.finished.items() if v}, "outcome_seconds": round(o.seconds, 3)}


def requests_failed(ctx: Context) -> list[Finding]:
    """Requests that failed on the server: finished ``error`` or answered HTTP 5xx (the admission
    limits' 503s excepted: load shed by design, which ``admission_rejected`` reports)."""
    t, o = ctx.thresholds, outcomes(ctx)
    failed, total = o.failed, o.requests
    share = o.failed_share.perc or 0.0
    if failed < t.outcome_min_requests or share < t.failed_min_share:
        return []
    errors = o.finished.get("error", 0.0)
    began, ended = o.failed_range  # when they failed, not the whole window
    five = max(0.0, failed - errors)
    diff = differential("failed", (
        Ruling("admission_limit", "ruled_out",
               f"{o.shed:,.0f} shed by the admission limits, not counted among these"),
        Ruling("engine_error", "fits" if errors else "ruled_out", f"{errors:,.0f} requests finished 'error'"),
        Ruling("server_error", "fits" if five else "ruled_out", f"{five:,.0f} answered 5xx beside the engine errors")))
    return [Finding(
        id="requests_failed",
        severity="critical" if share >= t.failed_critical_share else "warning",
        title=f"{failed:,.0f} of {total:,.0f} requests failed on the server ({share * 100:.0f} %) in "
              f"{fmt_duration(o.seconds)}" + (f": {errors:,.0f} finished with an engine error" if errors else
                                               ": answered HTTP 5xx"),
        evidence={"failed": failed, "failed_share_perc": share, "finished_error": errors, **diff.evidence(),
                  **_counts(o)},
        checks=(
            "Read the server log around these requests: the API server logs the exception behind each 5xx "
            "(an engine error, an out-of-memory, a tokenizer or chat-template failure).",
            "No flag is known to fix an error the log has not named; a 5xx burst with the engine dead is the "
            "engine_died or server_down finding.",
            *diff.checks(),
        ),
        time_range=(began, ended),
    )]


def _context_room(ctx: Context) -> tuple[bool | None, str]:
    """Whether ``--max-model-len`` can go up here, and why: not past the model's own maximum (vLLM
    derives max_model_len from the model's max_position_embeddings when the flag is not given, so a
    startup log without the flag says the server is at it), nor past what the KV cache holds
    (vLLM refuses to start when one request of max_model_len does not fit)."""
    m = ctx.flags.max_model_len
    log = ctx.log
    config = ctx.ok[-1][1].cache_config if ctx.ok else None
    kv_tokens = (config.kv_cache_size_tokens if config else None) or (log.kv_cache_tokens if log else None)
    if m is None:
        return None, "--max-model-len is not known here"
    if log is not None and log.non_default_args and "max_model_len" not in log.non_default_args:
        return False, (f"--max-model-len was not set, so {m:,} is the model's own maximum (vLLM derives it from "
                       "max_position_embeddings): a longer context needs another model or RoPE scaling")
    if kv_tokens is not None and kv_tokens <= m:
        return False, (f"the KV cache holds {kv_tokens:,} tokens, no more than the current {m:,}: vLLM would refuse "
                       "to start with a longer maximum unless the cache grows first")
    room = f"the KV cache holds {kv_tokens:,} tokens" if kv_tokens is not None else "the KV cache's size is not known"
    return True, (f"--max-model-len is {m:,}, set below the model's maximum, and {room}: raise it up to the model's "
                  "max_position_embeddings")


def _longer_context(ctx: Context, what: str) -> tuple[tuple[Suggestion, ...], str]:
    """Raise --max-model-len where the model and the KV cache allow, else say to trim on the client."""
    can_raise, why = _context_room(ctx)
    if can_raise is False:
        return (), f"Trim on the client: {why}. Shorten the prompts (or max_tokens) the clients send."
    # No value: how long the refused prompts (or the cut answers) wanted to be is not counted anywhere.
    return (Suggestion("--max-model-len", "increase", None,
                       f"{what} ({why}; check config.json's max_position_embeddings before going past it)."),), \
        "Or trim on the client: shorten the prompts (and max_tokens) so prompt + output fits."


def requests_rejected(ctx: Context) -> list[Finding]:
    """Requests the API server refused with HTTP 4xx before the engine saw them. The metrics group every
    4xx together, so the cause is checked, not assumed (:func:`~.signatures.rejected_differential`): the
    context limit from the refused requests' sizes, an unserved model name, a missing key or a bad
    parameter from the log's access lines. The flag change follows the cause that fits; with none,
    the finding says so and gives no flag."""
    t, o = ctx.thresholds, outcomes(ctx)
    rejected, total = o.rejected or 0.0, o.requests
    share = o.rejected_share.perc or 0.0
    if rejected < t.outcome_min_requests or share < t.rejected_min_share:
        return []
    m = ctx.flags.max_model_len
    diff = rejected_differential(ctx)
    named = diff.named
    head = f"{rejected:,.0f} of {total:,.0f} requests refused with HTTP 4xx ({share * 100:.0f} %) in {fmt_duration(o.seconds)}"
    suggestions: tuple[Suggestion, ...] = ()
    checks: list[str] = []
    if named is None:
        title = f"{head}: cause not identified"
        checks.append("Read the server's log (its access lines give each answer's status: 404 a model name it does "
                      "not serve, 401 a missing API key, 400 a prompt over the context or a bad parameter) or a "
                      "client's response body.")
    elif named.id == "context_limit":
        suggestions, trim = _longer_context(ctx, "Prompts longer than the context limit are refused whole")
        title = f"{head}: prompts beyond the context limit" + (f" (--max-model-len {m:,})" if m else "")
        checks.append(trim)
    elif named.id == "model_not_served":
        served = ctx.flags.model
        # The name the clients send is in the 404's body, not in any series or log line: a placeholder.
        suggestions = (Suggestion("--served-model-name", "set", f"{served} <the name the clients send>" if served else None,
                                  f"{diff.because()}: clients name a model the server does not serve"
                                  + (f" (it serves {served!r})" if served else "")
                                  + ". Add the name they send as an alias (--served-model-name takes several; the "
                                    "404 body names it), or fix the clients' model field."),)
        title = f"{head}: a model name the server does not serve (404)"
    elif named.id == "auth":
        title = f"{head}: a missing or wrong API key (401)"
        checks.append("Give the clients the key the server was started with (--api-key); no flag change is needed.")
    else:
        title = f"{head}: a parameter vLLM refuses (400)"
        checks.append("A client sends a parameter vLLM's validation refuses: the 400 body says which; no flag change "
                      "helps.")
    return [Finding(
        id="requests_rejected",
        severity="warning",
        title=title,
        evidence={"rejected": rejected, "rejected_share_perc": share, "max_model_len": m, **diff.evidence(),
                  **_counts(o)},
        suggestions=suggestions,
        checks=(*checks, *diff.checks()),
        time_range=(o.start, o.end),
    )]


def _outage_in(ctx: Context) -> bool:
    """The server went down, restarted or its engine died in the window: the answers it never finished
    were cut by that, which the outage findings report, not given up on by their clients."""
    if ctx.log is not None and ctx.log.died_serving() is not None:
        return True
    if any(iv.restarted for iv in ctx.intervals):
        return True
    return any(s.snapshot is None and s.error_kind is not ErrorKind.TIMEOUT for s in ctx.history)


def clients_gave_up(ctx: Context) -> list[Finding]:
    """2xx answers the engine never finished: clients that disconnected (their timeout, or a user who
    left) and whose requests vLLM aborted, beside the queue time and TTFT that made them wait."""
    t, o, flags = ctx.thresholds, outcomes(ctx), ctx.flags
    gave_up, answered = o.gave_up, o.answered
    if gave_up is None or answered is None or _outage_in(ctx):
        return []
    share = o.gave_up_share.perc or 0.0
    if gave_up < t.outcome_min_requests or share < t.gave_up_min_share:
        return []
    scrapes = [s for s, _ in ctx.ok]
    queue = quantile_estimate(0.95, histogram_delta(scrapes, "request_queue_time_seconds"))
    ttft = quantile_estimate(0.95, histogram_delta(scrapes, "time_to_first_token_seconds"))
    e2e = quantile_estimate(0.95, histogram_delta(scrapes, "e2e_request_latency_seconds"))
    waiting = max_gauge(ctx, "num_requests_waiting")
    usage = max_gauge(ctx, "kv_cache_usage_perc")
    cap = flags.max_num_seqs or max_gauge(ctx, "num_requests_running")
    waited = waiting > 0 or any(q is not None and q.over(t.gave_up_wait_seconds) for q in (queue, ttft))
    span = o.gave_up_range() or (o.start, o.end)
    # The wait began before the first request was given up on: the finding spans both.
    first_wait = next((s.ts for s, snap in ctx.ok
                       if (snap.value("num_requests_waiting") or 0) > 0 and s.ts <= span[1]), span[0])
    wait_words = ", ".join(f"{name} p95 {q.reported()[1] or ''}{' ' if q.reported()[1] else ''}"
                           f"{fmt_seconds_as_ms(q.reported()[0])}"
                           for name, q in (("queue", queue), ("TTFT", ttft)) if q is not None)
    suggestions: tuple[Suggestion, ...] = ()
    diff = waiting_differential(ctx, waiting_in(ctx, waited))
    if ctx.stalls:
        rulings = [Ruling("stalled", "fits", "tokens stopped while they waited (the stall finding)")]
        cause = "tokens stopped while they waited (the stall finding): no capacity change helps"
    elif not waited:
        nothing = f"no request waited ({wait_words or 'no queue or TTFT counted'})"
        rulings = [Ruling("client_timeout", "fits", nothing),
                   Ruling("seat_cap", "ruled_out", f"{nothing}: no seat was waited for"),
                   Ruling("token_budget", "ruled_out", f"{nothing}: no prompt waited for the token budget")]
        cause = "no request waited in the queue: their timeout is shorter than an answer takes"
    elif usage >= t.kv_full_perc:
        rulings = [Ruling("kv_full", "fits", f"KV usage up to {usage * 100:.0f} % while requests waited")]
        cause = "the KV cache was full, so requests queued for memory"
        suggestions = tuple(suggest_more_kv(flags, t, None))
    elif diff.named is not None and diff.named.id == "seat_cap":
        rulings = [Ruling("seat_cap", "fits", diff.because()), diff.ruling("token_budget")]
        cause = f"requests queued at the batch cap of {cap:.0f} with the KV cache ≤ {usage * 100:.0f} % full"
        # The waiting gauge can read 0 at every scrape while the TTFT says requests waited: how many is
        # then unknown, so no value (cap + 0 would be the current cap, a change that changes nothing).
        who = f"Up to {waiting:.0f} requests" if waiting else "Requests"
        suggestions = (
            Suggestion("--max-num-seqs", "increase", int(cap + waiting) if cap and waiting else None,
                       f"{who} waited behind a batch of {cap:.0f} ({wait_words or 'the queue'}): "
                       "a larger batch serves them before their clients give up."),
            Suggestion("--max-num-queued-reqs", "set", int(cap) if cap else None,
                       "Or shed early: past this many waiting, vLLM answers a fast 503 the client can retry or route "
                       "elsewhere, instead of a wait it abandons."),
        )
    elif diff.named is not None and diff.named.id == "token_budget":
        rulings = [diff.ruling("token_budget"), diff.ruling("seat_cap")]
        cause = "requests queued behind prompts split at the token budget, with seats free"
        suggestions = (Suggestion("--max-num-batched-tokens", "increase", token_budget_target(ctx),
                                  f"{diff.sentence()}: a larger budget admits them before their clients "
                                  "give up."),)
    else:
        rulings = [diff.ruling("seat_cap"), diff.ruling("token_budget")]
        cause = "cause not identified (they waited, but neither the seat cap nor the KV cache held them)"
    gave = differential("gave_up", rulings + _gave_up_rest(ctx, rulings, waited, usage, wait_words))
    return [Finding(
        id="clients_gave_up",
        severity="warning",
        title=f"{gave_up:,.0f} of {answered:,.0f} answered requests were given up by their clients "
              f"({share * 100:.0f} %) before the engine finished them: {cause}",
        evidence={**gave.evidence(), "gave_up": gave_up, "gave_up_share_perc": share, "finished_abort": o.aborted,
                  "max_num_requests_waiting": waiting, "num_requests_running_cap": cap,
                  "max_kv_cache_usage_perc": usage,
                  **{k: v for key, q in (("queue", queue), ("ttft", ttft), ("e2e", e2e)) if q is not None
                     for k, v in quantile_evidence(f"{key}_p95", q).items()},
                  **_counts(o)},
        suggestions=suggestions,
        checks=(
            "vLLM counts an abandoned request in no vllm: series (it is aborted, not finished): this count is the "
            "API server's 2xx answers less the requests the engine finished.",
            "The clients' own timeout (and retries) decides when they give up: compare it with the TTFT above.",
            *gave.checks(),
        ),
        time_range=(min(first_wait, span[0]), span[1]),
    )]


def _gave_up_rest(ctx: Context, named: list[Ruling], waited: bool, usage: float, wait_words: str) -> list[Ruling]:
    """The gave-up causes the branch above did not decide, each ruled on its own number."""
    t, have = ctx.thresholds, {r.cause for r in named}
    out = []
    if "stalled" not in have:
        out.append(Ruling("stalled", "ruled_out", "tokens moved while they waited"))
    if "kv_full" not in have:
        out.append(Ruling("kv_full", "ruled_out" if usage < t.kv_full_perc else "fits",
                          f"KV usage ≤ {usage * 100:.0f} %"))
    if "client_timeout" not in have:
        out.append(Ruling("client_timeout", "ruled_out" if waited else "fits",
                          f"requests waited ({wait_words})" if waited and wait_words else "requests waited"))
    return out


def answers_cut_at_context(ctx: Context) -> list[Finding]:
    """Answers vLLM stopped at --max-model-len: finished ``length`` with prompt + output at the limit
    (vLLM clamps max_tokens to what fits), told apart from a client's own max_tokens, which stops short
    of it (a benchmark with ignore_eos stays quiet)."""
    t, o = ctx.thresholds, outcomes(ctx)
    cut = o.cut
    finished = sum(n for reason, n in o.finished.items() if reason != "abort")
    if cut is None or o.max_model_len is None:
        return []
    share = cut / finished if finished > 0 else 0.0
    if cut < t.outcome_min_requests or share < t.cut_min_share:
        return []
    m = o.max_model_len
    suggestions, trim = _longer_context(ctx, "Answers stop where prompt + output reaches the limit")
    length = o.finished.get("length", 0.0)
    return [Finding(
        id="answers_cut_at_context",
        severity="warning",
        title=f"{cut:,.0f} of {finished:,.0f} answers cut at the context limit ({share * 100:.0f} %): prompt + output "
              f"reached --max-model-len {m:,} before the client's max_tokens",
        evidence={"cut_at_context": cut, "cut_share_perc": share, "finished_length": length, "max_model_len": m,
                  **_counts(o)},
        suggestions=suggestions,
        checks=(
            trim,
            "Counted from the length histograms: sequences finished 'length' whose prompt + output tokens sum to "
            "max_model_len (a lower bound where other requests finished in the same interval).",
        ),
        time_range=(o.start, o.end),
    )]
