"""The rule table: each rule, the finding ids it emits, and every name it points to, written once.

A row joins a rule to the knob table (``knobs``), the chart the Diagnose page draws beside its
findings (``chart``, a catalog concept), the Prometheus alert that mirrors it (``alert``, in
:mod:`~diagnostics.core.diagnosis.alerts`) and the simulator scenario that shows it (``scenario``).
The runner stamps a row's knobs, chart and the window it judged onto every finding the rule
returns (:meth:`Rule.stamp`); a rule body never repeats them. A finding that points elsewhere than
its row says so here, in ``overrides``. ``tests/unit/test_rule_table.py`` walks the rows, builds
every finding id they declare and checks every name resolves. Row order is the order findings are
listed in before the runner sorts them (ties keep it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.logs import ERROR_PATTERNS
from diagnostics.core.diagnosis.rules import (
    changes,
    features,
    gpu,
    latency,
    memory,
    outages,
    outcomes,
    queueing,
    ranks,
    startup,
)
from diagnostics.core.diagnosis.types import Finding


@dataclass(frozen=True, slots=True)
class Stamp:
    """What the runner writes onto a finding: the knob-table rows it rests on, the chart drawn beside
    it, and whether its evidence carries the window of scrapes it was judged on."""

    knobs: tuple[str, ...]
    chart: str | None
    window: bool = True


# A rule that cannot run (its metric is absent) found nothing to act on: no knob, no chart, no window.
BARE = Stamp((), None, window=False)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule and what it points to.

    ``finding_ids``: the ids the row's ``knobs`` and ``chart`` are stamped on; ``overrides``: ids
    stamped otherwise; ``absent``: the rule's "cannot check" finding is ``absent:<absent>``, stamped
    :data:`BARE`. ``window``: False for rules judged on a log, not on the scrapes.
    ``while_tokens_stopped``: False for rules whose advice (queue, capacity, batch size) is wrong
    while requests run and no token moves; the runner skips them then (see
    ``Context.tokens_stopped``). Head-of-line blocking keeps running: one long prefill step is
    itself seconds without tokens, and its advice must not flicker away during the next one.
    ``needs_scrapes``: the rule only runs when at least one scrape succeeded; with none, "this
    server does not expose X" would be a false claim. ``only_when_quiet``: the rule runs after the
    others, and only when none of them found anything above info (a change no rule explains).
    ``leads``: the rule's findings come first among those of their severity, whatever their time (a
    root cause the others are symptoms of: an engine death after the scrapes had timed out under load).
    """

    id: str
    run: Callable[[Context], list[Finding]]
    findings: tuple[str, ...]
    knobs: tuple[str, ...]
    chart: str | None
    alert: str | None
    scenario: str | None
    absent: str | None = None
    overrides: Mapping[str, Stamp] = field(default_factory=dict)
    window: bool = True
    while_tokens_stopped: bool = True
    needs_scrapes: bool = True
    only_when_quiet: bool = False
    leads: bool = False

    @property
    def finding_ids(self) -> tuple[str, ...]:
        """Every finding id the rule may return."""
        return (*self.findings, *self.overrides, *((f"absent:{self.absent}",) if self.absent else ()))

    def stamp(self, finding_id: str) -> Stamp:
        """What the runner writes onto the rule's finding ``finding_id``; KeyError for an id the row
        does not declare (the table test builds every declared one)."""
        if finding_id in self.findings:
            return Stamp(self.knobs, self.chart, self.window)
        if finding_id in self.overrides:
            return self.overrides[finding_id]
        if self.absent is not None and finding_id == f"absent:{self.absent}":
            return BARE
        raise KeyError(f"rule {self.id!r} returned {finding_id!r}, which its row does not declare")


RULES: tuple[Rule, ...] = (
    Rule("startup_log", startup.startup_log, (), (), chart=None, alert=None, scenario=None, window=False,
         overrides={f"startup_{kind}": Stamp((startup.STARTUP_ERRORS[kind][1],), None, window=False)
                    for kind in dict.fromkeys(kind for kind, _ in ERROR_PATTERNS) if kind in startup.STARTUP_ERRORS},
         needs_scrapes=False),
    # Every other failed start: a flag vLLM rejected, the port, the model, NCCL, CUDA graphs, or any
    # error before "Application startup complete" (quoted); and a log that shows no start at all.
    Rule("failed_start", startup.failed_start, (), (), chart=None, alert=None, scenario=None, window=False,
         overrides={**{startup.finding_id(kind): Stamp((knob,), None, window=False)
                       for kind, (_, knob) in startup.FAILED_START.items()},
                    **{kind: Stamp((knob,), None, window=False) for kind, (_, knob) in startup.LOG_ONLY.items()}},
         needs_scrapes=False),
    Rule("engine_died", outages.engine_died, ("engine_died",), ("down",), chart="generation_tokens",
         alert="VLLMServerDown", scenario=None, window=False, needs_scrapes=False, leads=True),
    # A stop someone asked for (a signal before any death in the log): information, never a death.
    Rule("server_stopped", outages.server_stopped, ("server_stopped",), (), chart=None, alert=None, scenario=None,
         window=False, needs_scrapes=False),
    Rule("outage", outages.outage, ("server_down", "server_restarted"), ("down",), chart="generation_tokens",
         alert="VLLMServerDown", scenario=None,
         # Late answers from a busy frontend are not an outage: restarting is not the advice.
         overrides={"scrapes_slow": Stamp((), None)}, needs_scrapes=False),
    Rule("engine_asleep", features.engine_asleep, ("engine_asleep",), ("asleep",), chart="generation_tokens",
         alert="VLLMEngineAsleep", scenario="asleep"),
    Rule("stall", outages.stall, ("silent_stall",), ("stall",), chart="generation_tokens",
         alert="VLLMSilentStall", scenario="stall", absent="silent_stall"),
    Rule("hung_rank", ranks.hung_rank, ("hung_rank",), ("hung-rank",), chart="generation_tokens",
         alert="VLLMHungRank", scenario="hung_rank"),
    # Engines out of balance, two ways with two fixes (the routing, or the rank's device): two rules
    # that share the finding id users and labels know, each with its own knob. The chart draws each
    # engine's tokens side by side, which shows either.
    Rule("load_skew", ranks.load_skew, ("engine_imbalance",), ("dp-balance",), chart="generation_tokens",
         alert=None, scenario="pinned_rank"),
    Rule("slow_rank", ranks.slow_rank, ("engine_imbalance",), ("slow-rank",), chart="generation_tokens",
         alert="VLLMSlowRank", scenario="slow_rank"),
    Rule("tokens_stopped", outages.tokens_stopped, ("tokens_stopped",), ("stall",), chart="generation_tokens",
         alert=None, scenario=None),
    # Outcomes: what users got. Listed before the queue and capacity rows: a give-up's range begins with
    # the wait that caused it, so on a tie the failure users saw leads and the queue finding follows.
    Rule("requests_failed", outcomes.requests_failed, ("requests_failed",), ("failed",), chart="generation_tokens",
         alert=None, scenario=None),
    Rule("requests_rejected", outcomes.requests_rejected, ("requests_rejected",), ("rejected",),
         chart="request_prompt_tokens", alert=None, scenario=None),
    Rule("clients_gave_up", outcomes.clients_gave_up, ("clients_gave_up",), ("gave-up",),
         chart="num_requests_waiting", alert=None, scenario=None),
    Rule("answers_cut_at_context", outcomes.answers_cut_at_context, ("answers_cut_at_context",), ("context-cut",),
         chart="request_generation_tokens", alert=None, scenario=None),
    Rule("kv_pressure", memory.kv_pressure, ("kv_pressure",), ("preemption",), chart="kv_cache_usage_perc",
         alert="VLLMKVCachePressure", scenario="kv_pressure", absent="kv_pressure", while_tokens_stopped=False),
    # Requests waiting with the KV cache free: at the seat cap, at the token budget, or for a cause not
    # identified (its knobs follow the cause named: causes.cause_knobs).
    Rule("queue_at_cap", queueing.queue_at_cap, ("queue_at_cap",), ("queue-at-cap",), chart="num_requests_waiting",
         alert="VLLMQueueAtConcurrencyCap", scenario="queue_at_cap", absent="queueing", while_tokens_stopped=False,
         overrides={"queue_token_budget": Stamp(("queue-token-budget",), "num_requests_waiting"),
                    "requests_waiting": Stamp((), "num_requests_waiting")}),
    Rule("waiting_deferred", queueing.waiting_deferred, ("waiting_deferred",), ("deferred",),
         chart="num_requests_waiting", alert="VLLMRequestsDeferred", scenario="lora_deferred",
         while_tokens_stopped=False),
    Rule("admission_rejected", queueing.admission_rejected, ("admission_rejected",), ("admission",),
         chart="num_requests_waiting", alert="VLLMAdmissionRejected", scenario="admission_limit",
         while_tokens_stopped=False),
    Rule("speculative_decoding", features.speculative_decoding, ("spec_low_acceptance",), ("spec-decode",),
         chart="spec_decode_acceptance", alert="VLLMSpecDecodeLowAcceptance", scenario="spec_decode_low"),
    Rule("head_of_line", latency.head_of_line, ("head_of_line_blocking",), ("head-of-line",),
         chart="inter_token_latency_seconds", alert=None, scenario="head_of_line"),
    Rule("slow_decode", latency.slow_decode, ("slow_decode",), ("decode-slow",), chart="inter_token_latency_seconds",
         alert="VLLMDecodeOverITLBudget", scenario="slow_decode", absent="decode_speed",
         # No budget, nothing judged: the finding only says so.
         overrides={"itl_budget_unset": Stamp((), None), "itl_budget_below_buckets": Stamp((), None)},
         while_tokens_stopped=False),
    # The GPU itself (NVML or dcgm-exporter readings): no vLLM flag for a throttled clock, capacity for a busy one.
    Rule("gpu_throttled", gpu.gpu_throttled, ("gpu_throttled",), ("gpu-throttled",), chart=None, alert=None,
         scenario="gpu_thermal_throttle"),
    Rule("gpu_saturated", gpu.gpu_saturated, ("gpu_saturated",), ("gpu-saturated",), chart="num_requests_waiting",
         alert=None, scenario=None, while_tokens_stopped=False),
    Rule("ttft", latency.ttft, ("ttft_queue_dominated",), ("ttft-queue",), chart="time_to_first_token_seconds",
         alert="VLLMTTFTOverBudget", scenario=None, absent="ttft",
         overrides={"ttft_prefill_dominated": Stamp(("ttft-prefill",), "time_to_first_token_seconds")},
         while_tokens_stopped=False),
    Rule("sharing_disabled", memory.sharing_disabled, ("sharing_disabled",), ("sharing-wasted",),
         chart="kv_cache_usage_perc", alert="VLLMParallelSamplingWithoutPrefixCaching",
         scenario="parallel_no_prefix"),
    Rule("sharing_not_happening", memory.sharing_not_happening, ("sharing_not_happening",), ("sharing-wasted",),
         chart="prefix_cache_hit_rate", alert=None, scenario=None),
    # A change at the same load whose cause no other rule reports (the prefix cache stopped hitting): a root
    # cause the queue and head-of-line findings that follow it are symptoms of, so it leads.
    Rule("latency_changed", changes.latency_changed, ("latency_changed",), (), chart="prefix_cache_hit_rate",
         alert=None, scenario=None, while_tokens_stopped=False, leads=True),
    Rule("unexplained_change", changes.unexplained_change, ("unexplained_change",), (),
         chart="inter_token_latency_seconds", alert=None, scenario=None, while_tokens_stopped=False,
         only_when_quiet=True),
)
