"""The simulated engine: scheduler invariants, every scenario's symptom named by the diagnosis
within a simulated minute, and /metrics in vLLM 0.32's exact shape."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnostics.core.diagnosis import Budgets, diagnose, prepare
from diagnostics.core.metrics.catalog import COUNTERS, GAUGES, NEEDS_A_FLAG, parse_snapshot
from diagnostics.core.metrics.dcgm import parse_dcgm
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.simulator.config import EngineConfig
from diagnostics.core.simulator.scenarios import SCENARIOS, make_engines
from diagnostics.core.simulator.scheduler import SimEngine
from diagnostics.core.whatif import StepCost
from diagnostics.sim.driver import Simulation
from tests.conftest import fixture_text

V0_ONLY = {"num_requests_swapped", "cpu_cache_usage_perc", "gpu_prefix_cache_hit_rate"}


def run(name: str, seconds: float = 60.0) -> list[Scrape]:
    return [Scrape(ts, parse_snapshot(text)) for ts, text in Simulation(name).run_for(seconds)]


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.knob])
def test_each_scenario_shows_its_symptom_and_the_diagnosis_names_it_within_a_minute(name: str) -> None:
    """Judged with the GPU readings the simulated engine's DCGM endpoint gives beside each scrape."""
    scenario = SCENARIOS[name]
    run_ = Simulation(name).run_for_with_gpus(60.0)
    scrapes = [Scrape(ts, parse_snapshot(text)) for ts, text, _ in run_]
    gpus = [(ts, parse_dcgm(dcgm)) for ts, _, dcgm in run_]
    findings = diagnose(prepare(scrapes, budgets=Budgets(itl_ms=scenario.itl_budget_ms), gpus=gpus))
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


def _closed_loop_run(fast: bool, blocks: int, clients: int = 24, seconds: float = 30.0,
                     noisy: bool = False) -> dict[str, object]:
    """A closed loop (a new request whenever one finishes) with a shared system prompt and prompts of
    varied length, on the cost model's clock; everything the metrics exporter would see."""
    import random

    rng = random.Random(3)
    # A fitted step cost whose steps are noisy (a factor drawn per step from the window's spread).
    cost = StepCost(0.004, 0.0005, 0.00002, spread=(0.5, 0.8, 1.0, 1.3, 2.4), seed=5) if noisy else None
    engine = SimEngine(EngineConfig(num_gpu_blocks=blocks, max_num_seqs=16, max_num_batched_tokens=512,
                                    step_cost=cost))
    system = list(range(900_000, 900_064))
    out: dict[str, list[object]] = {k: [] for k in ("ttft", "itl", "iteration", "finished", "prompt", "generated",
                                                     "preempted", "hits", "queries", "running", "waiting")}

    def new() -> None:
        base = rng.randrange(1 << 30)
        engine.add_request(system + list(range(base, base + rng.randint(5, 200))), rng.randint(2, 60))

    for _ in range(clients):
        new()
    while engine.now < seconds:
        stats = (engine.fast_forward(seconds) if fast else None) or engine.step()
        engine.kv.check_invariants()
        out["ttft"] += [round(v, 9) for v in stats.ttft]
        out["itl"] += [(round(v, 9), 1) for v in stats.itl] + [(round(v, 9), n) for v, n in stats.itl_weighted]
        if stats.iteration_tokens:
            out["iteration"].append((stats.iteration_tokens, 1))
        out["iteration"] += stats.iteration_weighted
        out["finished"] += [(s.request.request_id, round(s.last_token_at or 0, 9), s.num_output) for s in stats.finished]
        for key, value in (("prompt", stats.prompt_tokens), ("generated", stats.generation_tokens),
                           ("preempted", stats.num_preemptions), ("hits", stats.prefix_hits),
                           ("queries", stats.prefix_queries)):
            out[key].append(value)
        out["running"].append(stats.num_running)
        out["waiting"].append(stats.num_waiting)
        for _ in stats.finished:
            new()

    def expand(pairs: list[object]) -> list[object]:
        return sorted(v for v, n in pairs for _ in range(n))  # type: ignore[misc]

    return {"now": round(engine.now, 6), "ttft": sorted(out["ttft"]), "itl": expand(out["itl"]),
            "iteration": expand(out["iteration"]), "finished": sorted(out["finished"]),
            **{k: sum(out[k]) for k in ("prompt", "generated", "preempted", "hits", "queries")},  # type: ignore[misc]
            "free": engine.kv.block_pool.get_num_free_blocks(), "max_waiting": max(out["waiting"])}


@pytest.mark.parametrize(("blocks", "noisy", "clients"), [(4000, False, 24), (260, False, 24), (4000, True, 24),
                                                     (4000, False, 8)])
def test_fast_forward_through_admissions_equals_stepping_one_by_one(blocks: int, noisy: bool, clients: int) -> None:
    """A closed loop admits a request after every finish: fast-forwarding takes that admission into
    its first step. Every observation the exporter sees is the same as stepping one step at a time,
    with room to spare (4,000 blocks), with a cache tight enough to queue (260 blocks), with a
    fitted step cost whose noise is drawn per step (the what-if's), and with fewer clients than
    --max-num-seqs (nobody waits: the forward must still stop at a finish, for the client's next)."""
    slow = _closed_loop_run(False, blocks, clients=clients, noisy=noisy)
    fast = _closed_loop_run(True, blocks, clients=clients, noisy=noisy)
    assert fast.keys() == slow.keys()
    for key in slow:
        assert fast[key] == slow[key], key
    assert slow["generated"] > 5000 and slow["hits"] > 0


def _open_run(fast: bool, blocks: int, budget: int, rate: float = 40.0, seconds: float = 40.0,
              stop_at_finish: bool = False) -> dict[str, object]:
    """Open arrivals (Poisson-like, ``rate`` a second), prompts that share one of three system prompts.
    Faster than the cache serves them (the default): a queue that never drains, its head waiting for
    blocks while the batch decodes, preemptions, and a head that often hits blocks sitting in the free
    queue, which the decoders then evict."""
    import random

    rng = random.Random(11)
    engine = SimEngine(EngineConfig(num_gpu_blocks=blocks, max_num_seqs=32, max_num_batched_tokens=budget))
    systems = [list(range(800_000 + 1000 * i, 800_000 + 1000 * i + 48 + 16 * i)) for i in range(3)]
    arrivals = sorted(rng.uniform(0, seconds) for _ in range(int(seconds * rate)))
    out: dict[str, object] = {"ttft": [], "itl": [], "iteration": [], "finished": [], "blocked_segments": 0,
                              "max_waiting": 0}
    sums = dict.fromkeys(("prompt", "generated", "preempted", "hits", "queries"), 0)
    i = 0
    while engine.now < seconds:
        while i < len(arrivals) and arrivals[i] <= engine.now:
            base = rng.randrange(1 << 30)
            engine.add_request(rng.choice(systems) + list(range(base, base + rng.randint(5, 150))), rng.randint(5, 120))
            i += 1
        if engine.idle():
            engine.advance_idle(arrivals[i])
            continue
        def arrive() -> float:  # the next request arrives (while fast-forwarding past it)
            nonlocal i
            base = rng.randrange(1 << 30)
            engine.add_request(rng.choice(systems) + list(range(base, base + rng.randint(5, 150))), rng.randint(5, 120))
            i += 1
            return arrivals[i] if i < len(arrivals) else float("inf")

        nxt = arrivals[i] if i < len(arrivals) else float("inf")
        stats = (engine.fast_forward(seconds, next_arrival=nxt, arrive=arrive, stop_at_finish=stop_at_finish)
                 if fast else None) or engine.step()
        engine.kv.check_invariants()
        out["ttft"] += [round(v, 9) for v in stats.ttft]  # type: ignore[operator]
        out["itl"] += [(round(v, 9), 1) for v in stats.itl] + [(round(v, 9), n) for v, n in stats.itl_weighted]
        if stats.iteration_tokens:
            out["iteration"].append((stats.iteration_tokens, 1))  # type: ignore[attr-defined]
        out["iteration"] += stats.iteration_weighted  # type: ignore[operator]
        out["finished"] += [(s.request.request_id, round(s.last_token_at or 0, 9), s.num_output)  # type: ignore[operator]
                            for s in stats.finished]
        if stats.steps > 1 and stats.num_waiting:
            out["blocked_segments"] += 1  # type: ignore[operator]
        # Nobody leaves the queue inside a forward, so its largest size is the one at a forward's end.
        out["max_waiting"] = max(out["max_waiting"], stats.num_waiting)  # type: ignore[call-overload]
        for key, value in (("prompt", stats.prompt_tokens), ("generated", stats.generation_tokens),
                           ("preempted", stats.num_preemptions), ("hits", stats.prefix_hits),
                           ("queries", stats.prefix_queries)):
            sums[key] += value

    def expand(pairs: object) -> list[object]:
        return sorted(v for v, n in pairs for _ in range(n))  # type: ignore[attr-defined]

    return {"now": round(engine.now, 6), "ttft": sorted(out["ttft"]), "itl": expand(out["itl"]),  # type: ignore[arg-type]
            "iteration": expand(out["iteration"]), "finished": sorted(out["finished"]), **sums,  # type: ignore[arg-type]
            "kv_queries": engine.kv.prefix_cache_stats.queries, "kv_hits": engine.kv.prefix_cache_stats.hits,
            "free": engine.kv.block_pool.get_num_free_blocks(), "waiting": len(engine.waiting),
            "blocked_segments": out["blocked_segments"], "max_waiting": out["max_waiting"]}


@pytest.mark.parametrize(("blocks", "budget", "seconds"), [(90, 512, 40.0), (160, 512, 40.0), (90, 128, 40.0),
                                                      (90, 512, 25.0)])
def test_fast_forward_past_a_queue_waiting_for_blocks_equals_stepping_one_by_one(blocks: int, budget: int,
                                                                                 seconds: float) -> None:
    """Under KV pressure the head of the queue waits for blocks while the batch decodes (the KV-pressure
    what-if spends most of its steps there): fast-forwarding those steps gives every observation that
    stepping one at a time gives, including the head's prefix-cache lookups each step, whose hits
    shrink as the decoders evict the free blocks it would have reused."""
    slow, fast = _open_run(False, blocks, budget, seconds=seconds), _open_run(True, blocks, budget, seconds=seconds)
    assert fast["blocked_segments"] > 50  # forwards of several steps while requests waited
    for key in slow:
        if key != "blocked_segments":
            assert fast[key] == slow[key], key
    assert slow["preempted"] > 20 and slow["waiting"] > 50 and 0 < slow["hits"] < slow["queries"]


@pytest.mark.parametrize("stop_at_finish", [True, False])
def test_fast_forward_through_open_arrivals_equals_stepping_one_by_one(stop_at_finish: bool) -> None:
    """Open arrivals with room in the batch: each is admitted in the step after the one it arrived in,
    so fast-forwarding stops with that step; with nobody waiting it goes on past a finish (the batch
    just gets smaller) unless told to stop there."""
    slow = _open_run(False, 4000, 512, rate=6.0)
    fast = _open_run(True, 4000, 512, rate=6.0, stop_at_finish=stop_at_finish)
    for key in slow:
        if key != "blocked_segments":
            assert fast[key] == slow[key], key
    assert slow["waiting"] < 5 and len(slow["finished"]) > 200  # type: ignore[arg-type]


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


def test_a_prefix_hit_allocates_only_the_blocks_past_the_hit() -> None:
    """vLLM's allocate_slots counts the hit blocks on top of the request's computed tokens (0 while it
    waits; the scheduler sets them to the hit afterwards): a second 32-token prompt that hits the
    first block of the first one holds 2 blocks (1 shared + 1 new), not 3."""
    engine = SimEngine(EngineConfig(block_size=16, num_gpu_blocks=40, max_num_batched_tokens=512))
    engine.add_request(list(range(1000, 1032)), 5)
    engine.step()
    second = engine.add_request(list(range(1000, 1032)), 5)[0]
    engine.step()
    assert second.request.num_computed_tokens == 32
    assert len(engine.kv.req_to_blocks[second.request.request_id]) == 2


@pytest.mark.parametrize("fast", [False, True])
def test_a_preempted_request_comes_back_with_its_outputs_and_one_first_token(fast: bool) -> None:
    """A preempted request recomputes its prompt and outputs and continues: one TTFT per request,
    every request ends with exactly its max_tokens, stepping or fast-forwarding."""
    engine = SimEngine(EngineConfig(block_size=4, num_gpu_blocks=6, max_num_seqs=3, max_num_batched_tokens=64))
    reqs = [engine.add_request(list(range(start, start + plen)), mt)[0]
            for start, plen, mt in ((1000, 4, 14), (2000, 6, 4), (3000, 7, 5))]
    ttft = generated = preempted = 0
    while not engine.idle():
        stats = (engine.fast_forward(float("inf")) if fast else None) or engine.step()
        ttft += len(stats.ttft)
        generated += stats.generation_tokens
        preempted += stats.num_preemptions
    assert preempted > 0 and ttft == 3 and generated == 14 + 4 + 5
    assert [r.num_output for r in reqs] == [14, 4, 5]


@pytest.mark.parametrize("name", ["healthy", "admission_limit"])
def test_the_simulated_api_server_counts_its_answers_as_vllms_does(name: str) -> None:
    """http_requests_total on /v1/completions, by status class: a 2xx for every request the engine
    finished (its clients never give up), a 503 for every admission rejection; nothing failed."""
    from diagnostics.core.diagnosis.outcomes import window_outcomes
    from diagnostics.core.metrics.derive import Scrape

    scrapes = [Scrape(ts, parse_snapshot(text)) for ts, text in Simulation(name).run_for(40)]
    o = window_outcomes(scrapes, None)
    assert o.exports_http and o.engine_requests and o.answered == o.engine_requests
    assert (o.gave_up, o.rejected, o.failed) == (0, 0, 0)
    assert o.http("5xx") == o.shed and (o.shed > 0) == (name == "admission_limit")
