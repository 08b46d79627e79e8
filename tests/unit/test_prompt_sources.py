"""An honest prefix hit rate: prompt tokens by where their KV came from (vLLM 0.16+), counted at each
request's first prefill, checked against vLLM's other counters on real recordings, and said in words."""

from __future__ import annotations

from pathlib import Path

from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import (
    Scrape,
    counter_increase,
    histogram_delta,
    hit_rate_source,
    prefix_cache_hit_rate,
    prompt_sources,
)
from diagnostics.core.text import prompt_sources_text
from diagnostics.recording import read_recording

INCIDENTS = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"


def test_the_local_cache_share_agrees_with_the_prefix_cache_counters_on_a_real_server() -> None:
    scrapes = read_recording(INCIDENTS / "healthy_shared_prefix.jsonl.gz").scrapes()
    sources = prompt_sources(scrapes)
    hits = prefix_cache_hit_rate(scrapes)
    assert sources is not None and hits is not None
    # Two counter families vLLM keeps apart (by_source in the frontend, hits/queries in the scheduler).
    assert abs((sources.share("local_cache_hit") or 0) - hits) < 0.01 and hits > 0.5
    assert sources.cached_by_tier is not None and set(sources.cached_by_tier) >= {"device"}


def test_a_preempted_requests_recompute_is_not_counted_as_a_prompt_token_again() -> None:
    scrapes = read_recording(INCIDENTS / "kv_pressure_memory_bytes.jsonl.gz").scrapes()
    preempted = counter_increase(scrapes, "num_preemptions")
    sources = prompt_sources(scrapes)
    assert preempted is not None and preempted[0] > 0 and sources is not None
    # Each finished request's prompt once (request_prompt_tokens, observed at completion), however
    # often the preempted ones were recomputed.
    per_request = histogram_delta(scrapes, "request_prompt_tokens")
    assert per_request is not None and sources.total == per_request.sum
    assert sources.share("local_cache_hit") == 0.0


def test_sources_and_tiers_in_words() -> None:
    def scrape(t: float, hit: float, computed: float, device: float, host: float) -> Scrape:
        lab = 'engine="0",model_name="m"'
        return Scrape(t, parse_snapshot(
            f'vllm:prompt_tokens_by_source_total{{{lab},source="local_cache_hit"}} {hit}\n'
            f'vllm:prompt_tokens_by_source_total{{{lab},source="local_compute"}} {computed}\n'
            f'vllm:prompt_tokens_by_source_total{{{lab},source="external_kv_transfer"}} 0\n'
            f'vllm:prompt_tokens_cached_by_source_total{{{lab},source="device"}} {device}\n'
            f'vllm:prompt_tokens_cached_by_source_total{{{lab},source="host"}} {host}\n'))

    sources = prompt_sources([scrape(0, 100, 100, 100, 0), scrape(1, 400, 200, 325, 75)])
    assert sources is not None and sources.by_source["local_cache_hit"] == 300 and sources.total == 400
    assert prompt_sources_text(sources) == ("75 % local prefix cache, 25 % computed, 0 % external KV transfer; "
                                            "hits by tier: device 75 %, host 25 %")


def test_the_hit_rate_says_what_it_is_computed_from() -> None:
    v1 = parse_snapshot('vllm:prefix_cache_hits_total{model_name="m"} 1\nvllm:prefix_cache_queries_total{model_name="m"} 2\n')
    v0 = parse_snapshot('vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5\n')
    assert "new requests" in hit_rate_source(v1) and "preempted" in hit_rate_source(v1)
    assert "V0" in hit_rate_source(v0) and hit_rate_source(None) == "not exported"
