"""The simulated engine: scheduler invariants, every scenario's symptom named by the diagnosis
within a simulated minute, and /metrics in vLLM 0.32's exact shape."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnostics.core.catalog import COUNTERS, GAUGES, NEEDS_A_FLAG, parse_snapshot
from diagnostics.core.derive import Scrape
from diagnostics.core.diagnosis import Budgets, diagnose, prepare
from diagnostics.core.sim_engine import EngineConfig, SimEngine
from diagnostics.core.sim_scenarios import SCENARIOS, make_engines
from diagnostics.sim.driver import Simulation
from tests.conftest import fixture_text

V0_ONLY = {"num_requests_swapped", "cpu_cache_usage_perc", "gpu_prefix_cache_hit_rate"}


def run(name: str, seconds: float = 60.0) -> list[Scrape]:
    return [Scrape(ts, parse_snapshot(text)) for ts, text in Simulation(name).run_for(seconds)]


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.knob])
def test_each_scenario_shows_its_symptom_and_the_diagnosis_names_it_within_a_minute(name: str) -> None:
    scenario = SCENARIOS[name]
    findings = diagnose(prepare(run(name), budgets=Budgets(itl_ms=scenario.itl_budget_ms)))
    assert scenario.knob in [f.id for f in findings if f.severity != "info"], [f.id for f in findings]


@pytest.mark.parametrize("name", ["healthy", "parallel_sampling"])
def test_healthy_scenarios_raise_no_warning(name: str) -> None:
    findings = diagnose(prepare(run(name)))
    assert [f.id for f in findings if f.severity != "info"] == []


def test_scheduler_keeps_the_allocator_consistent_every_step() -> None:
    (engine,), generator = make_engines(SCENARIOS["kv_pressure"])
    preempted = 0
    while engine.now < 20:
        for prompt, max_tokens, n, lora in generator.due(engine.now):
            engine.add_request(prompt, max_tokens, n, lora=lora)
        stats = engine.step()
        preempted += stats.num_preemptions
        engine.kv.check_invariants()
        assert len(engine.running) <= engine.config.max_num_seqs
        if engine.idle():
            engine.advance_idle(generator.next_arrival())
    assert preempted > 0


def test_parallel_samples_share_prompt_blocks_only_with_prefix_caching() -> None:
    on, off = run("parallel_sampling", 20)[-1].snapshot, run("parallel_no_prefix", 20)[-1].snapshot
    assert on is not None and off is not None
    assert (on.value("prefix_cache_hits") or 0) > 0
    assert off.value("prefix_cache_hits") == 0 and off.cache_config.enable_prefix_caching is False  # type: ignore[union-attr]


def test_chunked_prefill_respects_the_token_budget() -> None:
    engine = SimEngine(EngineConfig(max_num_batched_tokens=512))
    engine.add_request(list(range(2000)), 4)
    steps = [engine.step() for _ in range(3)]
    assert [s.prompt_tokens for s in steps] == [512, 512, 512]
    assert steps[0].ttft == [] and engine.running[0].request.num_computed_tokens == 1536


def test_sim_metrics_have_vllm_032s_families_and_spelling() -> None:
    text = Simulation("healthy").run_for(5)[-1][1]
    snap = parse_snapshot(text)
    for concept in (*GAUGES, *COUNTERS):
        assert snap.has(concept) == (concept not in V0_ONLY | NEEDS_A_FLAG), concept
    for concept in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                    "request_queue_time_seconds", "request_params_n", "iteration_tokens"):
        assert snap.has(concept), concept
    real = {f.name: f.type for f in text_string_to_metric_families(fixture_text("metrics-0.32.0-burst.txt"))}
    ours = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name, kind in ours.items():
        if name.startswith("vllm:"):
            assert real.get(name) == kind, name
    real_ttft = parse_snapshot(fixture_text("metrics-0.32.0-burst.txt")).histogram("time_to_first_token_seconds")
    assert snap.histogram("time_to_first_token_seconds").bounds == real_ttft.bounds  # type: ignore[union-attr]


def test_unknown_scenario_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        Simulation("nope")


def test_fast_forward_equals_stepping_one_by_one() -> None:
    def run_engine(fast: bool) -> tuple[float, list[float], int, int]:
        engine = SimEngine(EngineConfig(num_gpu_blocks=400, max_num_seqs=16))
        reqs = []
        for i in range(40):
            reqs += engine.add_request(list(range(i * 1000, i * 1000 + 100 + 7 * i)), 50 + 13 * (i % 5))
        generated = 0
        while not engine.idle():
            stats = (engine.fast_forward(float("inf")) if fast else None) or engine.step()
            generated += stats.generation_tokens
            engine.kv.check_invariants()
        return engine.now, [r.last_token_at or 0.0 for r in reqs], generated, engine.kv.block_pool.get_num_free_blocks()

    slow, fast = run_engine(False), run_engine(True)
    assert fast[0] == pytest.approx(slow[0]) and fast[1] == pytest.approx(slow[1])
    assert fast[2:] == slow[2:]


def test_a_full_cache_preempts_the_most_recently_admitted_request_by_recompute() -> None:
    """vLLM v1's ``Scheduler.schedule``: when a running request cannot get a block, the last one in
    the running list (the latest admitted) is preempted, freed and put back at the front of the
    waiting queue to be recomputed from its first token."""
    engine = SimEngine(EngineConfig(block_size=16, num_gpu_blocks=4, max_num_seqs=3, max_num_batched_tokens=64))
    first, second, third = (engine.add_request(list(range(100 * i, 100 * i + 10)), 20)[0] for i in range(1, 4))
    preempted = 0
    while not preempted:
        preempted = engine.step().num_preemptions
    # Three one-block requests fill the three usable blocks; at token 17 each needs a second one.
    # The first takes the third request's block; the second then finds none free and, being the
    # last running now, preempts itself. Both go back to the front, the latest preempted first.
    assert preempted == 2 and engine.running == [first] and list(engine.waiting) == [second, third]
    for victim in (second, third):
        assert victim.request.num_computed_tokens == 0 and victim.num_preemptions == 1
        assert engine.kv.get_block_ids(victim.request.request_id) == []
    assert len(engine.kv.get_block_ids(first.request.request_id)) == 2
