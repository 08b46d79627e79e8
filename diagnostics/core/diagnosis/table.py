"""The rule table: each rule, the finding ids it emits, and every name it points to.

A row joins a rule to the knob table (``knobs``), the chart the Diagnose page draws beside its
findings (``chart``, a catalog concept), the Prometheus alert that mirrors it (``alert``, in
:mod:`~diagnostics.core.diagnosis.alerts`) and the simulator scenario that shows it (``scenario``).
These used to be unchecked strings spread over the code; ``tests/unit/test_rule_table.py`` walks
the rows and checks every name resolves. Row order is the order findings are listed in before the
engine sorts them (ties keep it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from diagnostics.core.diagnosis import rules
from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.logs import ERROR_PATTERNS
from diagnostics.core.diagnosis.types import Finding


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule and what it points to.

    ``while_tokens_stopped``: False for rules whose advice (queue, capacity, batch size) is wrong
    while requests run and no token moves; the engine skips them then (see
    ``Context.tokens_stopped``). Head-of-line blocking keeps running: one long prefill step is
    itself seconds without tokens, and its advice must not flicker away during the next one.
    ``needs_scrapes``: the rule only
    runs when at least one scrape succeeded; with none, "this server does not expose X" would be a
    false claim.
    """

    id: str
    run: Callable[[Context], list[Finding]]
    finding_ids: tuple[str, ...]
    knobs: tuple[str, ...]
    chart: str | None
    alert: str | None
    scenario: str | None
    while_tokens_stopped: bool = True
    needs_scrapes: bool = True


RULES: tuple[Rule, ...] = (
    Rule("startup_log", rules.startup_log,
         tuple(dict.fromkeys(f"startup_{kind}" for kind, _ in ERROR_PATTERNS)),
         tuple(dict.fromkeys(knob for _, knob in rules.STARTUP_ERRORS.values())),
         chart=None, alert=None, scenario=None, needs_scrapes=False),
    Rule("engine_died", rules.engine_died, ("engine_died",), ("down",),
         chart="generation_tokens", alert="VLLMServerDown", scenario=None, needs_scrapes=False),
    Rule("outage", rules.outage, ("server_down", "scrapes_slow", "server_restarted"), ("down",),
         chart="generation_tokens", alert="VLLMServerDown", scenario=None, needs_scrapes=False),
    Rule("engine_asleep", rules.engine_asleep, ("engine_asleep",), ("asleep",),
         chart="generation_tokens", alert="VLLMEngineAsleep", scenario="asleep"),
    Rule("stall", rules.stall, ("silent_stall", "absent:silent_stall"), ("stall",),
         chart="generation_tokens", alert="VLLMSilentStall", scenario="stall"),
    Rule("hung_rank", rules.hung_rank, ("hung_rank",), ("hung-rank",),
         chart="generation_tokens", alert="VLLMHungRank", scenario="hung_rank"),
    Rule("engine_imbalance", rules.engine_imbalance, ("engine_imbalance",), ("slow-rank", "dp-balance"),
         chart="generation_tokens", alert="VLLMSlowRank", scenario="slow_rank"),
    Rule("tokens_stopped", rules.tokens_stopped, ("tokens_stopped",), ("stall",),
         chart="generation_tokens", alert=None, scenario=None),
    Rule("kv_pressure", rules.kv_pressure, ("kv_pressure", "absent:kv_pressure"), ("preemption",),
         chart="kv_cache_usage_perc", alert="VLLMKVCachePressure", scenario="kv_pressure",
         while_tokens_stopped=False),
    Rule("queue_at_cap", rules.queue_at_cap, ("queue_at_cap", "absent:queueing"), ("queue-at-cap",),
         chart="num_requests_waiting", alert="VLLMQueueAtConcurrencyCap", scenario="queue_at_cap",
         while_tokens_stopped=False),
    Rule("waiting_deferred", rules.waiting_deferred, ("waiting_deferred",), ("deferred",),
         chart="num_requests_waiting", alert="VLLMRequestsDeferred", scenario="lora_deferred", while_tokens_stopped=False),
    Rule("admission_rejected", rules.admission_rejected, ("admission_rejected",), ("admission",),
         chart="num_requests_waiting", alert="VLLMAdmissionRejected", scenario="admission_limit", while_tokens_stopped=False),
    Rule("speculative_decoding", rules.speculative_decoding, ("spec_low_acceptance",), ("spec-decode",),
         chart="spec_decode_acceptance", alert="VLLMSpecDecodeLowAcceptance", scenario="spec_decode_low"),
    Rule("head_of_line", rules.head_of_line, ("head_of_line_blocking",), ("head-of-line",),
         chart="inter_token_latency_seconds", alert=None, scenario="head_of_line"),
    Rule("slow_decode", rules.slow_decode, ("slow_decode", "itl_budget_unset", "absent:decode_speed"),
         ("decode-slow",), chart="inter_token_latency_seconds", alert="VLLMDecodeOverITLBudget",
         scenario="slow_decode", while_tokens_stopped=False),
    Rule("ttft", rules.ttft, ("ttft_queue_dominated", "ttft_prefill_dominated", "absent:ttft"),
         ("ttft-queue", "ttft-prefill"), chart="time_to_first_token_seconds", alert="VLLMTTFTOverBudget",
         scenario=None, while_tokens_stopped=False),
    Rule("sharing_disabled", rules.sharing_disabled, ("sharing_disabled",), ("sharing-wasted",),
         chart="kv_cache_usage_perc", alert="VLLMParallelSamplingWithoutPrefixCaching",
         scenario="parallel_no_prefix"),
    Rule("sharing_not_happening", rules.sharing_not_happening, ("sharing_not_happening",), ("sharing-wasted",),
         chart="prefix_cache_hit_rate", alert=None, scenario=None),
)
