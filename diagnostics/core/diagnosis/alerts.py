"""The diagnosis thresholds as Prometheus alerting rules (for a fleet that already runs Prometheus).

Names are the ones on the wire: counters with ``_total``; where vLLM renamed a metric both
spellings are queried with ``or`` (``kv_cache_usage_perc`` / ``gpu_cache_usage_perc``,
``inter_token_latency_seconds`` / ``time_per_output_token_seconds``, ``prefix_cache_*`` /
``gpu_prefix_cache_*``). Durations in ``for:`` are the engine's own thresholds; Prometheus checks
them at its evaluation interval. Head-of-line blocking needs per-interval histograms aligned with
prefills and is left to ``python -m diagnostics diagnose``.

Every join is on the series' own server (:data:`SAME_SERVER`: ``job``, ``instance``, ``model_name``,
``engine``), so in a fleet a replica's alert reads only its own numbers: never "preempting here,
KV full on the twin", and no many-to-many matching between replicas of one model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from diagnostics.core.diagnosis.types import Thresholds

KV_USAGE = "(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc)"
SAME_SERVER = "on (job, instance, model_name, engine)"
WHO = "{{ $labels.instance }} ({{ $labels.model_name }})"
ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"
OLD_ITL_BUCKET = "vllm:time_per_output_token_seconds_bucket"


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


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{int(seconds * 1000)}ms"


def alert_rules_yaml(t: Thresholds, **kw: object) -> str:
    """The rule file (YAML; strings JSON-quoted, which YAML reads as-is)."""
    lines = ["groups:", "  - name: vllm-triage", "    rules:"]
    for rule in alert_rules(t, **kw):  # type: ignore[arg-type]
        lines += [
            f"      - alert: {rule.name}",
            f"        expr: {json.dumps(rule.expr)}",
            *([f"        for: {_duration(rule.for_seconds)}"] if rule.for_seconds else []),
            "        labels:",
            f"          severity: {rule.severity}",
            "        annotations:",
            f"          summary: {json.dumps(rule.summary)}",
            f"          knob: {json.dumps(rule.knob)}",
        ]
    return "\n".join(lines) + "\n"
