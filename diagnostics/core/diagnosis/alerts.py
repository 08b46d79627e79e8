"""The diagnosis thresholds as Prometheus alerting rules (for a fleet that already runs Prometheus).

Names are the ones on the wire: counters with ``_total``; where vLLM renamed a metric both
spellings are queried with ``or`` (``kv_cache_usage_perc`` / ``gpu_cache_usage_perc``,
``inter_token_latency_seconds`` / ``time_per_output_token_seconds``, ``prefix_cache_*`` /
``gpu_prefix_cache_*``). Durations in ``for:`` are the engine's own thresholds; Prometheus checks
them at its evaluation interval. Head-of-line blocking needs per-interval histograms aligned with
prefills and is left to ``python -m diagnostics diagnose``; so are the findings that rest on a
pasted log (an engine's death shows here as the server down: vLLM's API server exits with it).

Every join is on the series' own server (:data:`SAME_SERVER`: ``job``, ``instance``, ``model_name``,
``engine``), so in a fleet a replica's alert reads only its own numbers: never "preempting here,
KV full on the twin", and no many-to-many matching between replicas of one model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from diagnostics.core.diagnosis.types import Thresholds
from diagnostics.core.fleet.promql import duration

KV_USAGE = "(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)"
SAME_SERVER = "on (job, instance, model_name, engine)"
WHO = "{{ $labels.instance }} ({{ $labels.model_name }})"
ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"
OLD_ITL_BUCKET = "vllm:time_per_output_token_seconds_bucket"
GEN = "vllm:generation_tokens_total"
STEPS = "vllm:iteration_tokens_total_count"
PER_SERVER = "on (job, instance, model_name)"


@dataclass(frozen=True, slots=True)
class AlertRule:
    name: str
    expr: str
    for_seconds: float
    severity: str
    summary: str
    knob: str


def alert_rules(t: Thresholds, *, job: str = "vllm", itl_budget_ms: float | None = None,
                ttft_budget_ms: float | None = None) -> list[AlertRule]:
    rules = [
        AlertRule(
            "VLLMServerDown", f'up{{job="{job}"}} == 0', 0, "critical",
            "vLLM server {{ $labels.instance }} does not answer /metrics.", "down",
        ),
        AlertRule(
            "VLLMSilentStall",
            f"vllm:num_requests_running > 0 and {SAME_SERVER} "
            "increase(vllm:generation_tokens_total[1m]) == 0",
            t.stall_min_seconds, "critical",
            f"{WHO}: requests running but no token produced in the last minute.", "stall",
        ),
        AlertRule(
            "VLLMKVCachePressure",
            f"increase(vllm:num_preemptions_total[1m]) > 0 and {SAME_SERVER} {KV_USAGE} >= {t.kv_full_perc}",
            0, "warning",
            f"{WHO}: preemptions with the KV cache near full: more KV capacity or fewer "
            "sequences (never raise --max-num-seqs).", "preemption",
        ),
        AlertRule(
            "VLLMQueueAtConcurrencyCap",
            "vllm:num_requests_waiting > 0"
            f" and {SAME_SERVER} {KV_USAGE} < {t.kv_low_perc}"
            f" and {SAME_SERVER} vllm:num_requests_running"
            f" >= {SAME_SERVER} max_over_time(vllm:num_requests_running[10m])",
            t.queue_min_seconds, "warning",
            f"{WHO}: requests wait at the running cap while the KV cache has room: raise "
            "--max-num-seqs.", "queue-at-cap",
        ),
        AlertRule(
            "VLLMParallelSamplingWithoutPrefixCaching",
            "(increase(vllm:request_params_n_count[10m]) - ignoring (le) "
            'increase(vllm:request_params_n_bucket{le="1.0"}[10m])) > 0'
            ' and on (job, instance, engine) vllm:cache_config_info{enable_prefix_caching="False"}',
            0, "warning",
            f"{WHO}: n > 1 sampling with prefix caching off: --enable-prefix-caching.",
            "sharing-wasted",
        ),
        AlertRule(
            "VLLMEngineAsleep", 'vllm:engine_sleep_state{sleep_state="awake"} == 0', 0, "critical",
            f"{WHO}: engine {{{{ $labels.engine }}}} is asleep (sleep mode): nothing is served until "
            "POST /wake_up.", "asleep",
        ),
        AlertRule(
            "VLLMHungRank",
            # One engine produced nothing for a minute while the server's steps carried more than one
            # token each (its peers batched, which vLLM's balancer allows only while this rank held
            # requests too), and either it reports requests of its own or nobody on the server waits:
            # a rank left idle because a router pins requests to its peers (they queue) is not hung.
            f"increase({GEN}[1m]) == 0 and {PER_SERVER} "
            f"(sum by (job, instance, model_name) (increase({GEN}[1m])) / "
            f"sum by (job, instance, model_name) (increase({STEPS}[1m])) > {t.hung_rank_peer_batch}) "
            f"and ((vllm:num_requests_running + vllm:num_requests_waiting) > 0 or "
            f"(vllm:num_requests_waiting * 0 + {PER_SERVER} group_left () "
            f"sum by (job, instance, model_name) (vllm:num_requests_waiting)) == 0)",
            0, "critical",
            f"{WHO}: engine {{{{ $labels.engine }}}} produced no token for a minute while its peers served: "
            "a hung rank (dump its EngineCore_DP process's stacks, then restart it).", "hung-rank",
        ),
        AlertRule(
            "VLLMSlowRank",
            # The engine's tokens against the mean of its peers' (the others of its server), among
            # ranks that decoded at least half as many sequences a step as their peers: fewer a step
            # means it was given less work (a router pinning requests elsewhere), not that it is slow.
            f"increase({GEN}[1m]) > 0 and increase({GEN}[1m]) <= {t.slow_rank_max_ratio:g} * "
            f"((sum by (job, instance, model_name) (increase({GEN}[1m])) - {PER_SERVER} group_right () "
            f"increase({GEN}[1m])) / {PER_SERVER} group_left () "
            f"(count by (job, instance, model_name) (increase({GEN}[1m])) - 1)) "
            f"and increase({GEN}[1m]) / increase({STEPS}[1m]) >= 0.5 * "
            f"((sum by (job, instance, model_name) (increase({GEN}[1m])) - {PER_SERVER} group_right () "
            f"increase({GEN}[1m])) / (sum by (job, instance, model_name) (increase({STEPS}[1m])) - "
            f"{PER_SERVER} group_right () increase({STEPS}[1m])))",
            0, "warning",
            f"{WHO}: engine {{{{ $labels.engine }}}} generated at most {t.slow_rank_max_ratio * 100:.0f} % of its "
            "peers' tokens over the last minute: a slow rank (check its device and host).", "slow-rank",
        ),
        AlertRule(
            "VLLMRequestsDeferred",
            'vllm:num_requests_waiting_by_reason{reason="deferred"} > 0',
            t.queue_min_seconds, "warning",
            f"{WHO}: requests wait for a LoRA slot or a KV transfer, not for capacity: --max-loras up to "
            "the adapters in use (never --max-num-seqs).", "deferred",
        ),
        AlertRule(
            "VLLMAdmissionRejected",
            "increase(vllm:admission_rejections_total[1m]) > 0", 0, "warning",
            f"{WHO}: requests rejected with 503 by the {{{{ $labels.reason }}}} limit: more capacity or a "
            "higher limit (python -m diagnostics diagnose names which).", "admission",
        ),
        AlertRule(
            "VLLMSpecDecodeLowAcceptance",
            f"increase(vllm:spec_decode_num_accepted_tokens_total[5m]) / {SAME_SERVER} "
            f"increase(vllm:spec_decode_num_draft_tokens_total[5m]) < {t.spec_low_acceptance:g} and {SAME_SERVER} "
            f"increase(vllm:spec_decode_num_draft_tokens_total[5m]) >= {t.spec_min_draft_tokens:g}",
            0, "warning",
            f"{WHO}: under {t.spec_low_acceptance * 100:.0f} % of drafted tokens accepted: fewer "
            "num_speculative_tokens in --speculative-config, or speculation off.", "spec-decode",
        ),
    ]
    if itl_budget_ms is not None:
        rules.append(AlertRule(
            "VLLMDecodeOverITLBudget",
            "histogram_quantile(0.95, sum by (le, job, instance, model_name) "
            f"(rate({ITL_BUCKET}[5m]) or rate({OLD_ITL_BUCKET}[5m]))) > {itl_budget_ms / 1000:g}",
            60, "warning", f"{WHO}: ITL p95 over {itl_budget_ms:g} ms.", "decode-slow",
        ))
    if ttft_budget_ms is not None:
        rules.append(AlertRule(
            "VLLMTTFTOverBudget",
            "histogram_quantile(0.95, sum by (le, job, instance, model_name) "
            f"(rate(vllm:time_to_first_token_seconds_bucket[5m]))) > {ttft_budget_ms / 1000:g}",
            60, "warning", f"{WHO}: TTFT p95 over {ttft_budget_ms:g} ms.", "ttft-queue",
        ))
    return rules


def alert_rules_yaml(t: Thresholds, **kw: object) -> str:
    """The rule file (YAML; strings JSON-quoted, which YAML reads as-is)."""
    lines = ["groups:", "  - name: vllm-triage", "    rules:"]
    for rule in alert_rules(t, **kw):  # type: ignore[arg-type]
        lines += [
            f"      - alert: {rule.name}",
            f"        expr: {json.dumps(rule.expr)}",
            *([f"        for: {duration(rule.for_seconds)}"] if rule.for_seconds else []),
            "        labels:",
            f"          severity: {rule.severity}",
            "        annotations:",
            f"          summary: {json.dumps(rule.summary)}",
            f"          knob: {json.dumps(rule.knob)}",
        ]
    return "\n".join(lines) + "\n"
