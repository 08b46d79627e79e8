"""What-if (issue 14): the workload inferred from a window, the engine calibrated on it, the replay
and the prediction.

Expected values come from how each recording was made (the load generator's settings in
``tests/fixtures/incidents/record.py``), from hand-built histograms, or from a simulated engine
run with a step-time model the test chose; never from this code's own output."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics.core import whatif
from diagnostics.core.diagnosis import Budgets, KnownFlags, diagnose, prepare
from diagnostics.core.metrics.catalog import Histogram, parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.simulator.config import EngineConfig
from diagnostics.core.simulator.scheduler import SimEngine
from diagnostics.recording import read_recording
from diagnostics.sim.metrics import SimMetrics

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "tests" / "fixtures" / "incidents"


def recording(name: str) -> list[Scrape]:
    return read_recording(INCIDENTS / f"{name}.jsonl.gz").scrapes()


# -- the workload ---------------------------------------------------------------------------------


def test_a_closed_loop_of_20_clients_is_recognised_with_its_exact_output_length() -> None:
    """queue_cap_closed_loop: 20 closed-loop clients, 128 tokens each (ignore_eos), --max-num-seqs 6."""
    w = whatif.infer_workload(recording("queue_cap_closed_loop"))
    assert w is not None
    assert w.closed_loop_clients == 20
    assert w.output.mean == 128
    assert {r.output for r in w.requests if r.finished} == {128}


def test_a_burst_is_open_arrivals_close_together() -> None:
    """kv_pressure_blocks_override: 30 requests of 200 tokens sent at once (the server's own arrival
    clock sees the frontend take them in over a second or two on two cores)."""
    w = whatif.infer_workload(recording("kv_pressure_blocks_override"))
    assert w is not None and w.closed_loop_clients is None
    assert len(w.requests) == 30
    assert w.output.mean == 200 and {r.output for r in w.requests if r.finished} <= {200}
    arrivals = sorted(r.arrival for r in w.requests)
    assert arrivals[-1] - arrivals[0] <= 2.5


def test_two_bursts_stay_two_bursts() -> None:
    """admission_queued_reqs: two bursts of 40 requests, 3 s apart after the first finished; the
    clients got 32 answers in all (labels.json: ok 32, the rest 503s that never reach the engine)."""
    w = whatif.infer_workload(recording("admission_queued_reqs"))
    assert w is not None
    assert len(w.requests) == 32
    arrivals = sorted(r.arrival for r in w.requests)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert max(gaps) >= 4.0  # the pause between the bursts
    split = gaps.index(max(gaps)) + 1
    assert split >= 1 and len(arrivals) - split >= 1


VALIDATION = ROOT / "bench" / "whatif_runs" / "2026-12-06b"


def test_a_burst_between_two_scrapes_arrives_at_once() -> None:
    """queue_cap_burst recorded by the what-if validation (bench/whatif_validate.py, after the load
    generator stopped building a TLS context per request): 40 requests of 256 tokens sent at once
    under --max-num-seqs 4. They all fall between two scrapes; the replay sends them together."""
    w = whatif.infer_workload(read_recording(VALIDATION / "queue_cap_burst-before.jsonl.gz").scrapes())
    assert w is not None and w.closed_loop_clients is None
    assert [n for _, n in w.bursts] == [40]
    assert len(set(w.arrivals)) == 1 and len(w.arrivals) == 40
    # At the middle of the interval (between two scrapes) in which they came.
    ok = [s for s in read_recording(VALIDATION / "queue_cap_burst-before.jsonl.gz").scrapes() if s.snapshot is not None]
    middles = [(a.ts + b.ts) / 2 - ok[0].ts for a, b in zip(ok, ok[1:])]
    (at,) = [b["at_seconds"] for b in w.to_json()["bursts"]]
    assert any(abs(at - m) <= 0.001 for m in middles) and w.arrivals[0] == pytest.approx(at, abs=0.001)


def test_the_cli_names_several_bursts_by_their_sizes() -> None:
    from dataclasses import replace

    from diagnostics.cli.render import _bursts

    w = whatif.infer_workload(read_recording(VALIDATION / "queue_cap_burst-before.jsonl.gz").scrapes())
    assert w is not None
    assert _bursts(replace(w, bursts=((1.5, 40), (9.5, 12)))) == "; 2 bursts sent at once (40, 12 requests)"
    assert _bursts(replace(w, bursts=())) == ""


def test_a_closed_loop_lists_no_bursts() -> None:
    """A closed loop is replayed by its clients, not by arrival times: hol_p99_only (32 closed-loop
    decoders) and hol_burst_p99 (24, whose held count jumps with each burst of long prompts) list none."""
    for name, clients in (("hol_p99_only", 32), ("hol_burst_p99", 24)):
        w = whatif.infer_workload(read_recording(VALIDATION / f"{name}-before.jsonl.gz").scrapes())
        assert w is not None and w.closed_loop_clients == clients
        assert w.bursts == () and w.to_json()["bursts"] == []


def test_a_burst_is_replayed_at_once_so_a_cap_just_under_it_still_queues() -> None:
    """The same 40 at once under a cap of 36: four wait for a slot, i.e. for a whole 256-token
    request, so TTFT p95 (the 38th of 40 first tokens) is at least 256 steps. A step's time is read
    from the recording's own ITL histogram (its mean gap between tokens); the replay may only be
    slower, with 36 running instead of 4."""
    scrapes = read_recording(VALIDATION / "queue_cap_burst-before.jsonl.gz").scrapes()
    ok = [s for s in scrapes if s.snapshot is not None]
    first, last = ok[0].snapshot.histogram("inter_token_latency_seconds"), ok[-1].snapshot.histogram(
        "inter_token_latency_seconds")
    assert first is not None and last is not None
    mean_gap = (last.sum - first.sum) / (last.count - first.count)
    prediction = whatif.baseline(scrapes, KnownFlags(max_num_seqs=4)).predict({"--max-num-seqs": "36"})
    assert prediction.reproduces
    assert prediction.after.metrics["ttft_p95_seconds"] >= 256 * mean_gap * 0.9
    assert prediction.after.metrics["max_num_requests_waiting"] == 4


@pytest.mark.parametrize(("counts", "bursts"), [
    ([1, 1, 10, 12], [(2.5, 10), (3.5, 12)]),  # a second burst does not hide the first
    ([0, 0, 0, 3, 3, 10], []),  # idle intervals are not the usual count
    ([1, 3, 11], []),  # the usual is the upper median of the others (3): 11 is under 12
])
def test_bursts_are_judged_against_the_other_busy_intervals(counts: list[int],
                                                             bursts: list[tuple[float, int]]) -> None:
    from diagnostics.core.whatif.workload import _placed

    assert _placed([(float(i), float(i + 1), n) for i, n in enumerate(counts)])[1] == bursts


@pytest.mark.parametrize(("counts", "bursts"), [
    ([10, 10, 10, 10], []),  # steady arrivals: spread evenly, none at once
    ([2, 2, 0, 8], [(3.5, 8)]),  # 8 where the others saw 2: sent together
    ([3, 3, 11], []),  # under 4 times the usual 3
    ([7], []),  # fewer than 8
    ([0, 40, 0], [(1.5, 40)]),  # a burst alone in a quiet window
])
def test_which_intervals_are_bursts(counts: list[int], bursts: list[tuple[float, int]]) -> None:
    from diagnostics.core.whatif.workload import _placed

    placed, found = _placed([(float(i), float(i + 1), n) for i, n in enumerate(counts)])
    assert found == bursts
    assert len(placed) == sum(counts)
    for i, n in enumerate(counts):
        inside = sorted(t for t in placed if i <= t < i + 1)
        assert len(inside) == n
        if (i + 0.5, n) in bursts:
            assert set(inside) == {i + 0.5}
        elif n > 1:  # spread: evenly, half a gap from each edge
            assert inside == pytest.approx([i + (k + 0.5) / n for k in range(n)])


def test_a_mixed_workload_keeps_both_modes_of_its_prompt_lengths() -> None:
    """hol_long_prefills: 16 decoders with 10-word prompts and 900 tokens, and 1,900-word prompts
    with 4 tokens. The histograms count them in buckets (≤ 10 and ≤ 2,000 tokens); the rebuilt
    requests stay in those buckets and pair the long prompts with the short answers."""
    w = whatif.infer_workload(recording("hol_long_prefills"))
    assert w is not None
    done = [r for r in w.requests if r.finished]
    decoders = [r for r in done if r.prompt <= 10]
    documents = [r for r in done if r.prompt > 1000]
    assert len(decoders) + len(documents) == len(done)
    assert len(decoders) == 16 and all(r.output > 500 for r in decoders)
    assert documents and all(r.output <= 5 for r in documents)


def test_length_positions_put_each_value_in_its_bucket_at_the_exact_mean() -> None:
    # 16 requests of 9 tokens and 10 of 1,800: buckets (5, 10] and (1000, 2000], both at 80 % of
    # their width; the histogram keeps only the counts and the sum.
    bounds = (5.0, 10.0, 1000.0, 2000.0, float("inf"))
    hist = Histogram(bounds, (0.0, 16.0, 16.0, 26.0, 26.0), 16 * 9 + 10 * 1800, 26.0)
    dist = whatif.LengthDist.from_histogram(hist)
    assert dist is not None
    values = dist.values()
    assert [v for v, _ in values] == pytest.approx([9.0, 1800.0])
    assert [share for _, share in values] == pytest.approx([16 / 26, 10 / 26])


# -- calibration ----------------------------------------------------------------------------------


def simulated_window(cost: whatif.StepCost, seconds: int = 60, seed: int = 3) -> list[Scrape]:
    """A window of /metrics from the simulated engine with a step time the test chose: clients ramp
    4 → 16 → 32 closed-loop, short prompts plus a 1,500-token prompt every 7 s."""
    config = EngineConfig(block_size=16, num_gpu_blocks=4000, max_num_seqs=64, max_num_batched_tokens=2048,
                          served_model_name="m", step_cost=cost)
    engine = SimEngine(config)
    metrics = SimMetrics(config, engine.num_gpu_blocks)
    rng = random.Random(seed)

    def submit(prompt: int, output: int) -> None:
        base = rng.randrange(1 << 40)
        engine.add_request(list(range(base, base + prompt)), output)

    out: list[Scrape] = []
    clients = 0
    next_long = 7.0
    for second in range(1, seconds + 1):
        want = 4 if second < 20 else 16 if second < 40 else 32
        while clients < want:
            submit(rng.randint(20, 60), rng.randint(40, 120))
            clients += 1
        while engine.now < second:
            if engine.now >= next_long:
                submit(1500, 4)
                next_long += 7.0
            if engine.idle():
                engine.advance_idle(second)
                break
            stats = engine.step()
            metrics.update(stats)
            for sim in stats.finished:
                if sim.max_tokens > 4:
                    submit(rng.randint(20, 60), rng.randint(40, 120))
        out.append(Scrape(float(second), parse_snapshot(metrics.text())))
    return out


def test_calibration_recovers_a_known_step_time_model() -> None:
    truth = whatif.StepCost(0.004, 0.0005, 0.00002)
    scrapes = simulated_window(truth)
    cal = whatif.calibrate(scrapes, scrapes[-1].snapshot.cache_config if scrapes[-1].snapshot else None)
    assert cal is not None and cal.batch_identified
    assert cal.cost.base == pytest.approx(truth.base, rel=0.25)
    assert cal.cost.per_seq == pytest.approx(truth.per_seq, rel=0.25)
    assert cal.cost.per_prefill_token == pytest.approx(truth.per_prefill_token, rel=0.25)
    assert cal.fit_error is not None and cal.fit_error < 0.1
    assert (cal.num_gpu_blocks, cal.block_size) == (4000, 16)


# -- flags ----------------------------------------------------------------------------------------


def calibration(**kw: object) -> whatif.Calibration:
    base = dict(cost=whatif.StepCost(0.01, 0.001, 0.0), num_gpu_blocks=100, block_size=16, enable_prefix_caching=True,
                kv_cache_memory_bytes=None, gpu_memory_utilization=0.9, cache_dtype="auto", fit_error=0.0, points=10,
                batch_identified=True, max_running=8.0)
    base.update(kw)
    return whatif.Calibration(**base)  # type: ignore[arg-type]


FLAGS = whatif.Flags(max_num_seqs=8, max_num_batched_tokens=2048, num_gpu_blocks=100, block_size=16,
                     enable_prefix_caching=True, max_model_len=4096)


def test_flag_changes_turn_into_the_engine_they_describe() -> None:
    cal = calibration(kv_cache_memory_bytes=100 * 2**20)  # 1 MiB a block
    assert whatif.apply(FLAGS, cal, {"--max-num-seqs": "32"}).max_num_seqs == 32
    assert whatif.apply(FLAGS, cal, {"--block-size": "32"}).num_gpu_blocks == 50  # same tokens, half the blocks
    assert whatif.apply(FLAGS, cal, {"--kv-cache-memory-bytes": str(150 * 2**20)}).num_gpu_blocks == 150
    assert whatif.apply(FLAGS, cal, {"--num-gpu-blocks-override": "180"}).num_gpu_blocks == 180
    assert whatif.apply(FLAGS, calibration(), {"--kv-cache-dtype": "fp8"}).num_gpu_blocks == 200
    assert whatif.apply(FLAGS, cal, {"--no-enable-prefix-caching": "true"}).enable_prefix_caching is False


@pytest.mark.parametrize(("changes", "says"), [
    ({"--tensor-parallel-size": "2"}, "not modelled"),
    ({"--quantization": "fp8"}, "not modelled"),
    ({"--kv-cache-memory-bytes": "1000000"}, "current KV size in bytes is unknown"),
    ({"--max-num-seqs": "many"}, "not a number"),
])
def test_a_change_the_simulator_cannot_apply_says_why(changes: dict[str, str], says: str) -> None:
    with pytest.raises(whatif.NotModelled, match=says):
        whatif.apply(FLAGS, calibration(), changes)


def test_the_utilization_of_a_pinned_kv_cache_is_not_modelled() -> None:
    with pytest.raises(whatif.NotModelled, match="pinned by --kv-cache-memory-bytes"):
        whatif.apply(FLAGS, calibration(kv_cache_memory_bytes=2**30), {"--gpu-memory-utilization": "0.95"})


# -- the replay and the prediction on real recordings ---------------------------------------------


@pytest.mark.parametrize("name", ["queue_cap_closed_loop", "hol_long_prefills", "kv_pressure_blocks_override",
                                  "slow_decode_small"])
def test_the_baseline_replay_reproduces_the_recording(name: str) -> None:
    """Measured bands on four real recordings (three model shapes, a 2-core host whose step times
    swing 10× under contention): the replay under the current flags gives the recording's ITL p95
    within 50 % and its output tokens/s within 30 %."""
    base = whatif.baseline(recording(name), KnownFlags())
    assert base.baseline_error["itl_p95_seconds"] is not None and base.baseline_error["itl_p95_seconds"] <= 0.5
    assert base.baseline_error["output_tokens_per_second"] is not None
    assert base.baseline_error["output_tokens_per_second"] <= 0.3  # 27 % on the KV-pressure recording


def test_raising_the_cap_of_a_queue_at_the_cap_drains_it() -> None:
    p = whatif.baseline(recording("queue_cap_closed_loop"), KnownFlags()).predict({"--max-num-seqs": "20"})
    waiting, ttft = p.metric("max_num_requests_waiting"), p.metric("ttft_p50_seconds")
    assert waiting["after"] is not None and waiting["before"] is not None and waiting["after"] < waiting["before"]
    assert ttft["after"] is not None and ttft["before"] is not None and ttft["after"] < ttft["before"] / 2


def test_more_kv_blocks_for_a_preempting_server_means_fewer_preemptions() -> None:
    p = whatif.baseline(recording("kv_pressure_blocks_override"), KnownFlags()).predict({"--num-gpu-blocks-override": "36"})
    pre = p.metric("preemptions_per_minute")
    assert pre["before"] and pre["after"] is not None and pre["after"] < pre["before"]


def test_smaller_prefill_chunks_cut_the_longest_head_of_line_stalls() -> None:
    """hol_long_prefills: 1,900-token prompts in one step stall 16 decoders for seconds. Chunks of
    512 split each stall into four shorter ones: the longest gaps (p99.9) shrink. (p99 may rise:
    four steps now carry a piece of each prompt; the real server did that too, see the README's
    what-if table.)"""
    p = whatif.baseline(recording("hol_long_prefills"), KnownFlags()).predict({"--max-num-batched-tokens": "512"})
    p999 = p.metric("itl_p999_seconds")
    assert p999["before"] and p999["after"] is not None and p999["after"] < 0.7 * p999["before"]


def test_every_warning_suggestion_gets_a_prediction_or_says_why_not() -> None:
    scrapes = recording("slow_decode_small")
    ctx = prepare(scrapes, budgets=Budgets(itl_ms=60))
    findings, base, why = whatif.with_predictions(diagnose(ctx), scrapes, KnownFlags())
    assert base is not None and why is None
    slow = next(f for f in findings if f.id == "slow_decode")
    first = slow.suggestions[0]
    assert first.flag == "--max-num-seqs" and first.prediction is not None
    assert set(first.to_json()["prediction"]) == set(whatif.METRICS)
    itl_p95 = first.prediction.metric("itl_p95_seconds")
    assert itl_p95["after"] is not None and itl_p95["before"] is not None and itl_p95["after"] < itl_p95["before"]
    assert first.to_json()["prediction_note"].startswith("ITL")
    unmodelled = [s for s in slow.suggestions if s.flag == "--quantization"]
    assert unmodelled and unmodelled[0].prediction is None and "not modelled" in (unmodelled[0].prediction_note or "")
    assert all(s.prediction is None and s.prediction_note is None
               for f in findings if f.severity == "info" for s in f.suggestions)


def test_a_window_without_traffic_gives_a_reason_not_a_prediction() -> None:
    quiet = recording("healthy_closed_loop")[:3]
    with pytest.raises(ValueError):
        whatif.baseline(quiet, KnownFlags())


# -- the CLI --------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnostics", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_whatif_cli_json_holds_the_prediction_the_workload_and_the_calibration() -> None:
    out = cli("whatif", "--replay", str(INCIDENTS / "queue_cap_closed_loop.jsonl.gz"), "--set", "max-num-seqs=20",
              "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["changes"] == {"--max-num-seqs": "20"}
    assert set(doc["prediction"]) == set(whatif.METRICS)
    assert doc["workload"]["closed_loop_clients"] == 20
    assert doc["calibration"]["step_time_fit_error"] is not None
    assert set(doc["baseline_error"]) == set(whatif.METRICS)


def test_whatif_cli_says_not_modelled_and_rejects_a_malformed_change() -> None:
    path = str(INCIDENTS / "queue_cap_closed_loop.jsonl.gz")
    out = cli("whatif", "--replay", path, "--set", "tensor-parallel-size=2")
    assert out.returncode == 2 and "not modelled" in out.stderr
    out = cli("whatif", "--replay", path, "--set", "max-num-seqs")
    assert out.returncode == 2 and "FLAG=VALUE" in out.stderr
    human = cli("whatif", "--replay", path, "--set", "max-num-seqs=20")
    assert human.returncode == 0 and "predicted:" in human.stdout and "closed loop of 20 clients" in human.stdout


def test_a_suggestion_without_a_value_is_not_replayed_as_a_guess() -> None:
    with pytest.raises(whatif.NotModelled, match="names no value"):
        whatif.suggestion_changes("--max-num-seqs", None)
    assert whatif.suggestion_changes("--enable-prefix-caching", None) == {"--enable-prefix-caching": "true"}


def test_diagnose_cli_prints_each_prediction_and_can_skip_them() -> None:
    path = str(INCIDENTS / "queue_cap_closed_loop.jsonl.gz")
    out = cli("diagnose", "--replay", path)
    assert out.returncode == 1 and "predicted: TTFT" in out.stdout
    doc = json.loads(cli("diagnose", "--replay", path, "--json").stdout)
    first = next(f for f in doc["findings"] if f["id"] == "queue_at_cap")["suggestions"][0]
    assert first["prediction"]["max_num_requests_waiting"]["after"] < first["prediction"]["max_num_requests_waiting"][
        "before"]
    skipped = cli("diagnose", "--replay", path, "--no-predict")
    assert skipped.returncode == 1 and "predicted:" not in skipped.stdout


# -- against a known truth: the simulated engine run again with the flag changed ------------------


@pytest.mark.parametrize(("scenario", "flag", "field", "value", "checks"), [
    # queue at the cap of 8, raised to 32: the queue drains, throughput doubles, ITL grows a little.
    ("queue_at_cap", "--max-num-seqs", "max_num_seqs", 32,
     {"output_tokens_per_second": 0.10, "itl_p95_seconds": 0.15}),
    # 700 KV blocks preempting, given 1,400: more in flight, more served.
    ("kv_pressure", "--num-gpu-blocks-override", "num_gpu_blocks", 1400,
     {"output_tokens_per_second": 0.10, "ttft_p95_seconds": 0.10, "preemptions_per_minute": 0.20}),
    # 512 sequences a step on an L4, cut to 64: fewer tokens a second, the decode step as before.
    ("slow_decode", "--max-num-seqs", "max_num_seqs", 64, {"output_tokens_per_second": 0.10,
                                                          "itl_p95_seconds": 0.10}),
])
def test_a_prediction_from_a_simulated_window_matches_the_simulated_engine_run_with_the_change(
    scenario: str, flag: str, field: str, value: int, checks: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The what-if sees only /metrics (as of a real server) and fits its own step-time model; the
    truth is the simulated engine (roofline step times) run again with the flag changed. Tolerances
    are what is reached here, per metric."""
    from dataclasses import replace

    from diagnostics.core.simulator.scenarios import SCENARIOS
    from diagnostics.sim.driver import Simulation

    def window(name: str) -> list[Scrape]:
        return [Scrape(ts, parse_snapshot(text)) for ts, text in Simulation(name).run_for(120)]

    base = SCENARIOS[scenario]
    known = KnownFlags(max_num_seqs=base.config.max_num_seqs, max_num_batched_tokens=base.config.max_num_batched_tokens)
    prediction = whatif.baseline(window(scenario), known).predict({flag: str(value)})
    monkeypatch.setitem(SCENARIOS, "changed", replace(base, name="changed",
                                                      config=replace(base.config, **{field: value})))
    truth = whatif.recorded(window("changed")).metrics
    for metric, tolerance in checks.items():
        after, real = prediction.metric(metric)["after"], truth[metric]
        assert after is not None and real is not None
        assert abs(after - real) <= tolerance * real, (metric, after, real)


@pytest.mark.parametrize(("name", "clients"), [
    ("healthy_closed_loop", 4),   # 4 closed-loop streaming clients (record.py)
    ("healthy_small_steady", 4),  # 4 closed-loop clients on the 6-layer model
    ("queue_cap_burst", None),    # 40 requests at once, drained 4 at a time: a burst, not clients
    ("healthy_bursty", None),     # 8 bursts of 12 requests, 4 s apart
])
def test_closed_loops_and_bursts_are_told_apart(name: str, clients: int | None) -> None:
    w = whatif.infer_workload(recording(name))
    assert w is not None and w.closed_loop_clients == clients


# -- from the sceptic's review --------------------------------------------------------------------


def test_parallel_samples_are_counted_and_replayed_as_vllm_counts_them() -> None:
    """sharing_off_n8: 10 requests with n = 8 (labels.json: 10 ok), 32 tokens each, prefix caching
    off. vLLM counts each sample as a request of its own: 80, each replayed as one sequence."""
    w = whatif.infer_workload(recording("sharing_off_n8"))
    assert w is not None
    assert (w.n, len(w.requests), w.requests_finished) == (8.0, 80, 80.0)
    assert w.prefix_hit_fraction == 0.0 and w.max_tokens_mean == 32.0
    base = whatif.baseline(recording("sharing_off_n8"), KnownFlags())
    err = base.baseline_error["output_tokens_per_second"]
    assert err is not None and err < 0.9  # each sample replayed once (8× too much work before the fix)


def test_generator_settings_come_back_out_of_the_window() -> None:
    w = whatif.infer_workload(recording("queue_cap_closed_loop"))  # 128-token answers, no shared prefix
    assert w is not None and w.max_tokens_mean == 128.0 and w.prefix_hit_fraction == 0.0


def test_max_model_len_turns_away_exactly_the_requests_that_do_not_fit() -> None:
    # kv_pressure_blocks_override: 30 requests of 10 words and 200 tokens: none fits in 150.
    p = whatif.baseline(recording("kv_pressure_blocks_override"), KnownFlags()).predict({"--max-model-len": "150"})
    assert p.after.requests_rejected == 30 and p.metric("output_tokens_per_second")["after"] == 0.0
    # queue_cap_closed_loop: 20 closed-loop clients, 40-word prompts and 128 tokens: the first
    # request of each client is turned away under 100, and a turned-away client sends no more.
    q = whatif.baseline(recording("queue_cap_closed_loop"), KnownFlags()).predict({"--max-model-len": "100"})
    assert q.after.requests_rejected == 20


def test_apply_by_hand_arithmetic() -> None:
    cal = calibration(gpu_memory_utilization=0.45)
    assert whatif.apply(FLAGS, cal, {"--gpu-memory-utilization": "0.9"}).num_gpu_blocks == 200
    assert whatif.apply(FLAGS, cal, {"--enable-prefix-caching": "false"}).enable_prefix_caching is False
    assert whatif.apply(FLAGS, calibration(cache_dtype="fp8"), {"--kv-cache-dtype": "fp8"}).num_gpu_blocks == 100
    assert whatif.apply(FLAGS, cal, {"--max-model-len": "2048.0"}).max_model_len == 2048
    with pytest.raises(whatif.NotModelled, match="only fp8"):
        whatif.apply(FLAGS, cal, {"--kv-cache-dtype": "bfloat16"})


def test_position_is_clamped_to_the_buckets() -> None:
    bounds = (10.0, 20.0, float("inf"))
    low = whatif.LengthDist.from_histogram(Histogram(bounds, (0.0, 4.0, 4.0), 4 * 5.0, 4.0))  # mean below (10, 20]
    high = whatif.LengthDist.from_histogram(Histogram(bounds, (4.0, 4.0, 4.0), 4 * 50.0, 4.0))  # above (0, 10]
    assert low is not None and high is not None
    assert (low.position(), high.position()) == (0.0, 1.0)


def test_the_simulated_engine_spends_no_time_outside_its_engine() -> None:
    scrapes = simulated_window(whatif.StepCost(0.004, 0.0005, 0.00002))
    cal = whatif.calibrate(scrapes, scrapes[-1].snapshot.cache_config if scrapes[-1].snapshot else None)
    assert cal is not None and cal.ttft_offset == pytest.approx(0.0, abs=1e-3)


def test_a_window_that_cannot_be_replayed_notes_every_suggestion_and_costs_no_finding() -> None:
    scrapes = recording("queue_cap_closed_loop")
    findings = diagnose(prepare(scrapes))
    noted, base, why = whatif.with_predictions(findings, scrapes[:2], KnownFlags())
    assert base is None and why is not None
    assert [f.id for f in noted] == [f.id for f in findings]
    suggestions = [s for f in noted if f.severity != "info" for s in f.suggestions]
    assert suggestions and all((s.prediction_note or "").startswith("no prediction:") for s in suggestions)


def test_whatif_on_an_empty_window_is_unknown_not_bad_usage(tmp_path: Path) -> None:
    path = tmp_path / "idle.jsonl"
    lines = [json.dumps({"ts": 1000.0 + i, "target": "http://h:1", "metrics": "vllm:num_requests_running 0\n"})
             for i in range(5)]
    path.write_text("\n".join(lines) + "\n")
    out = cli("whatif", "--replay", str(path), "--set", "max-num-seqs=8")
    assert out.returncode == 3 and "cannot replay this window" in out.stderr


def predicted(before: dict[str, float | None], after: dict[str, float | None]) -> whatif.Prediction:
    """A prediction with these metrics before and after (the workload and the recording do not matter)."""
    lengths = whatif.LengthDist(10.0, ((0.0, 20.0, 1.0),))
    workload = whatif.InferredWorkload(60.0, (0.0,), lengths, lengths, 1.0, 0.0, None, 1.0)
    return whatif.Prediction({}, workload, calibration(), whatif.Outcome(before), whatif.Outcome(after),
                             whatif.Outcome({}), {})


def test_the_prediction_chart_colours_gains_green_and_costs_red() -> None:
    from diagnostics.core.figures.prediction import prediction_figure

    fig = prediction_figure(predicted({"itl_p95_seconds": 0.1, "output_tokens_per_second": 100.0,
                                       "preemptions_per_minute": 0.0},
                                      {"itl_p95_seconds": 0.05,             # halved: a gain
                                       "output_tokens_per_second": 80.0,    # fewer: a cost
                                       "preemptions_per_minute": 0.0}))     # nothing: no bar
    assert fig is not None
    bar = fig.data[0]
    assert list(bar.y) == ["ITL p95", "output tok/s"]
    assert list(bar.x) == pytest.approx([-50.0, -20.0])
    assert list(bar.marker.color) == ["#2ca02c", "#d62728"]
    assert "100 ms → ~50 ms" in bar.text[0]
    assert prediction_figure(predicted({"itl_p95_seconds": None}, {"itl_p95_seconds": 0.1})) is None
