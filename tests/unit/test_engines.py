"""The hung-rank rule on hand-written two-engine windows: a rank silent while its peer batches, or
that last reported requests, is hung; a rank left idle while its peer takes one request at a time
is not; nothing is said when every engine is silent (that is the stall rule's) or of a single
engine; and the real DP recordings of the corpus are judged the same way."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diagnostics.core.diagnosis import Thresholds, diagnose, prepare
from diagnostics.core.diagnosis.data_parallel import load_skews, per_engine, silent_ranks, slow_ranks
from diagnostics.core.figures.engines import ENGINE_PANELS, engines_figure
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape, derive_state
from diagnostics.recording import read_recording
from diagnostics.sim.driver import Simulation

INCIDENTS = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

ENGINE_FAMILIES = ("generation_tokens_total", "prompt_tokens_total")
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0)  # vLLM 0.32's, up to 30 s


def payload(engines: Sequence[dict[str, Any]]) -> str:
    """/metrics text of a two-engine (DP) server: each engine's counters, gauges and step count."""
    lines = []
    for i, e in enumerate(engines):
        lab = f'engine="{i}",model_name="m"'
        lines += [
            f"vllm:generation_tokens_total{{{lab}}} {e['gen']}",
            f"vllm:prompt_tokens_total{{{lab}}} {e.get('prompt', 0.0)}",
            f"vllm:num_requests_running{{{lab}}} {e.get('running', 0.0)}",
            f"vllm:num_requests_waiting{{{lab}}} {e.get('waiting', 0.0)}",
            f"vllm:kv_cache_usage_perc{{{lab}}} {e.get('usage', 0.0)}",
            f'vllm:iteration_tokens_total_bucket{{{lab},le="+Inf"}} {e["steps"]}',
            f"vllm:iteration_tokens_total_count{{{lab}}} {e['steps']}",
            f"vllm:iteration_tokens_total_sum{{{lab}}} {e['gen'] + e.get('prompt', 0.0)}",
        ]
        if "e2e" in e:  # requests finished, by the lower bound of their end-to-end latency bucket
            done = e["e2e"]
            for bound in E2E_BOUNDS:
                below = sum(n for lower, n in done.items() if lower < bound)
                lines.append(f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="{bound}"}} {below}')
            lines += [f'vllm:e2e_request_latency_seconds_bucket{{{lab},le="+Inf"}} {sum(done.values())}',
                      f"vllm:e2e_request_latency_seconds_count{{{lab}}} {sum(done.values())}",
                      f"vllm:e2e_request_latency_seconds_sum{{{lab}}} {sum(k * n for k, n in done.items())}"]
    return "\n".join(lines) + "\n"


def window(rows: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[Scrape]:
    return [Scrape(float(t), parse_snapshot(payload(row))) for t, row in enumerate(rows)]


def stop_engine_1(seconds: int, peer_tokens_per_step: float, last_running: float = 0.0) -> list[Scrape]:
    """Both engines serve 4 s; then engine 1's counters freeze for ``seconds`` while engine 0 makes
    100 steps a second carrying ``peer_tokens_per_step`` tokens each (and admits 10 prompt tokens)."""
    rows = []
    e0 = {"gen": 0.0, "prompt": 0.0, "steps": 0.0}
    e1 = {"gen": 0.0, "prompt": 0.0, "steps": 0.0}
    for t in range(4 + seconds):
        if t < 4:
            e1 = {"gen": e1["gen"] + 100, "prompt": e1["prompt"] + 10, "steps": e1["steps"] + 100,
                  "running": last_running}
        e0 = {"gen": e0["gen"] + 100 * peer_tokens_per_step, "prompt": e0["prompt"] + 10,
              "steps": e0["steps"] + 100}
        rows.append((dict(e0), dict(e1)))
    return window(rows)


def test_a_rank_silent_while_its_peer_batches_is_hung() -> None:
    ranks = silent_ranks([(s, s.snapshot) for s in stop_engine_1(8, 1.5)], min_seconds=5.0, peer_batch=1.05)
    assert len(ranks) == 1
    rank = ranks[0]
    # Engine 1 last moved between t=2 and t=3 (its counters equal from t=3 on): silent 3 → 11.
    assert rank.engine == ("m", "1") and (rank.since, rank.until) == (3.0, 11.0) and rank.ongoing
    assert rank.peer_generation_tokens == 8 * 150 and rank.peer_max_batch == 1.5


def test_a_rank_that_reported_running_requests_is_hung_even_if_its_peer_does_not_batch() -> None:
    ranks = silent_ranks([(s, s.snapshot) for s in stop_engine_1(8, 1.0, last_running=3)], 5.0, 1.05)
    assert [r.engine for r in ranks] == [("m", "1")] and ranks[0].last_running == 3


def test_an_idle_rank_beside_a_peer_serving_one_request_at_a_time_is_not_hung() -> None:
    # One token a step: one sequence at a time, which the balancer sends to engine 0 on ties.
    assert silent_ranks([(s, s.snapshot) for s in stop_engine_1(8, 1.0)], 5.0, 1.05) == []


def resumed_engine_1(held_e2e_seconds: float) -> list[Scrape]:
    """Both engines serve 4 s, engine 1 is silent 10 s beside a peer decoding one sequence a step
    (its gauges frozen at 0), then resumes and finishes one request whose end-to-end latency lies
    in the bucket starting at ``held_e2e_seconds``, and serves on for 3 s."""
    rows = []
    e0: dict[str, Any] = {"gen": 0.0, "prompt": 0.0, "steps": 0.0}
    e1: dict[str, Any] = {"gen": 0.0, "prompt": 0.0, "steps": 0.0, "e2e": {0.3: 0.0}}
    for t in range(18):
        if t < 4 or t >= 14:
            e1 = {**e1, "gen": e1["gen"] + 100, "prompt": e1["prompt"] + 10, "steps": e1["steps"] + 100}
        if t == 15:
            e1 = {**e1, "e2e": {**e1["e2e"], held_e2e_seconds: 1.0}}
        e0 = {"gen": e0["gen"] + 100, "prompt": e0["prompt"] + 10, "steps": e0["steps"] + 100}
        rows.append((dict(e0), dict(e1)))
    return window(rows)


def test_a_rank_whose_first_requests_after_a_silence_took_as_long_held_them() -> None:
    """Frozen gauges at 0 and a peer decoding one sequence a step say nothing; a request engine 1
    finished right after its 10 s silence that took 10-15 s end to end was in flight on it all
    along. One of 2.5-5 s (under half the silence) may have come in late: not evidence."""
    held = silent_ranks([(s, s.snapshot) for s in resumed_engine_1(10.0)], 5.0, 1.05)
    assert [(r.engine, r.held_through, r.ongoing) for r in held] == [(("m", "1"), 1.0, False)]
    assert held[0].holds_requests and not held[0].last_running
    assert silent_ranks([(s, s.snapshot) for s in resumed_engine_1(2.5)], 5.0, 1.05) == []
    assert silent_ranks([(s, s.snapshot) for s in resumed_engine_1(5.0)], 5.0, 1.05) != []  # 5 s: half of 10


def test_a_real_stopped_rank_on_a_busy_host_is_hung_though_its_gauges_froze_at_zero() -> None:
    """The integration test's workload (4 requests a second of 128 tokens, rank 1 SIGSTOPped 10 s)
    on a host with one core kept busy: engine 0 decoded exactly one token a step (the requests came
    one after another), rank 1's gauges froze at 0 running, and the diagnosis said nothing but
    'no ITL budget' (the clients' longest request took 12.9 s). Once rank 1 resumed, the frontend's
    end-to-end histogram for it counted the request it had held through the stop."""
    recording = read_recording(FIXTURES / "recording-hung-rank-busy-host-0.32.0.jsonl.gz")
    scrapes = list(recording.scrapes())
    ok = [s.snapshot for s in scrapes if s.snapshot is not None]
    # Engine 1's requests over 5 s end to end in the whole window, from its own histogram.
    first, last = ok[0].histogram("e2e_request_latency_seconds", ("tiny", "1")), \
        ok[-1].histogram("e2e_request_latency_seconds", ("tiny", "1"))
    assert first is not None and last is not None
    at_5 = last.bounds.index(5.0)
    slow = (last.count - last.cumulative[at_5]) - (first.count - first.cumulative[at_5])
    assert slow == 1
    findings = diagnose(prepare(scrapes, info=recording.info()))
    assert findings[0].id == "hung_rank" and findings[0].severity == "critical", [f.id for f in findings]
    ev = findings[0].evidence
    assert ev["engine"] == "1" and ev["requests_held_through_silence"] == slow and "last_num_requests_running" not in ev
    assert ev["peer_max_sequences_per_step"] == 1.0 and 9.0 <= ev["seconds_without_tokens"] <= 12.0


def test_a_silence_shorter_than_the_threshold_is_not_reported() -> None:
    assert silent_ranks([(s, s.snapshot) for s in stop_engine_1(4, 2.0)], 5.0, 1.05) == []


def test_every_engine_silent_is_not_a_hung_rank() -> None:
    still = {"gen": 500.0, "prompt": 50.0, "steps": 400.0, "running": 2.0}
    scrapes = window([(dict(still), dict(still))] * 10)
    assert silent_ranks([(s, s.snapshot) for s in scrapes], 5.0, 1.05) == []


def test_per_engine_steps_and_batch_are_counted_per_interval() -> None:
    work = per_engine([(s, s.snapshot) for s in stop_engine_1(2, 1.5)])
    first = work[("m", "0")][0]
    assert (first.generation_tokens, first.steps, first.batch) == (150.0, 100.0, 1.5)
    assert work[("m", "1")][4].moved is False and work[("m", "1")][1].moved is True


def test_the_diagnosis_names_the_engine_and_gives_no_tuning_advice() -> None:
    findings = diagnose(prepare(stop_engine_1(8, 1.5, last_running=2)))
    hung = [f for f in findings if f.id == "hung_rank"]
    assert findings[0].id == "hung_rank" and findings[0].severity == "critical"
    assert hung[0].evidence["engine"] == "1" and hung[0].evidence["last_num_requests_running"] == 2
    assert hung[0].suggestions == () and "EngineCore_DP1" in hung[0].checks[0]
    assert "Hung rank: engine 1 (m)" in hung[0].title and "(ongoing)" in hung[0].title


def test_derived_state_and_engine_charts_split_by_engine() -> None:
    scrapes = stop_engine_1(8, 1.5)
    state = derive_state(scrapes, 4.0)  # the last 4 s: engine 1 silent, engine 0 at 150 tok/s
    rates = {e.engine: e.generation_tokens_rate for e in state.engines}
    assert rates == {"0": 100 * 1.5, "1": 0.0}  # 100 steps a second of 1.5 tokens
    for concept, title, unit, kind in ENGINE_PANELS:
        fig = engines_figure(scrapes, concept, title, unit, kind)
        assert fig is not None and [t.name for t in fig.data] == ["engine 0", "engine 1"]


def test_one_engine_has_no_engines_panel_or_rows() -> None:
    scrapes = [Scrape(t, parse_snapshot(text)) for t, text in Simulation("healthy").run_for(5)]
    assert derive_state(scrapes).engines == ()
    assert engines_figure(scrapes, *ENGINE_PANELS[0]) is None


def test_the_simulated_hung_rank_freezes_one_engines_counters_only() -> None:
    scrapes = [Scrape(t, parse_snapshot(text)) for t, text in Simulation("hung_rank").run_for(40)]
    late = scrapes[25:]  # the rank stops 20 s in
    gen = {k: [s.snapshot.value("generation_tokens", ("sim-llama-3.1-8b", k)) for s in late] for k in ("0", "1")}
    assert len(set(gen["1"])) == 1 and gen["0"][-1] > gen["0"][0]


def test_a_rank_serving_a_sixth_of_its_peers_tokens_is_slow_not_hung() -> None:
    # Engine 1 makes 100 steps a second of 1 token, engine 0 400 steps of 1.5 tokens, for 20 s.
    rows = [({"gen": 600.0 * t, "steps": 400.0 * t}, {"gen": 100.0 * t, "steps": 100.0 * t}) for t in range(20)]
    scrapes = window(rows)
    ranks = slow_ranks([(s, s.snapshot) for s in scrapes], 10.0, 0.4)
    assert [r.engine for r in ranks] == [("m", "1")]
    rank = ranks[0]
    assert (rank.tokens_per_second, rank.peer_tokens_per_second) == (100.0, 600.0)
    assert (rank.steps_per_second, rank.peer_steps_per_second) == (100.0, 400.0)
    findings = diagnose(prepare(scrapes))
    assert [f.id for f in findings if f.severity != "info"] == ["engine_imbalance"]
    assert "17 % of its peers' tokens" in findings[0].title


def test_engines_within_the_ratio_or_briefly_apart_are_not_slow() -> None:
    for share in (0.5, 0.45):  # just above the 0.4 line
        even = window([({"gen": 300.0 * t, "steps": 300.0 * t}, {"gen": 300.0 * share * t, "steps": 150.0 * t})
                       for t in range(20)])
        assert slow_ranks([(s, s.snapshot) for s in even], 10.0, 0.4) == []
        assert "engine_imbalance" not in [f.id for f in diagnose(prepare(even))]
    brief = window([({"gen": 600.0 * t, "steps": 400.0 * t}, {"gen": 100.0 * t if t < 6 else 600 + 600.0 * (t - 6),
                                                              "steps": 100.0 * t}) for t in range(14)])
    assert slow_ranks([(s, s.snapshot) for s in brief], 10.0, 0.4) == []


def test_the_real_dp_recordings_show_no_slow_rank() -> None:
    """Two real --data-parallel-size 2 servers, healthy and with a rank stopped: the stopped one is
    the hung-rank rule's (it produced nothing), neither is called slow."""
    for name in ("healthy_data_parallel", "hung_rank_dp2", "hung_rank_dp2_mid"):
        scrapes = read_recording(INCIDENTS / f"{name}.jsonl.gz").scrapes()
        ok = [(s, s.snapshot) for s in scrapes if s.snapshot is not None]
        assert slow_ranks(ok, 10.0, 0.4) == [], name


def test_the_simulated_slow_rank_is_named() -> None:
    scrapes = [Scrape(t, parse_snapshot(text)) for t, text in Simulation("slow_rank").run_for(40)]
    found = [f for f in diagnose(prepare(scrapes)) if f.id == "engine_imbalance"]
    assert [f.evidence["engine"] for f in found] == ["1"] and found[0].evidence["share_of_peer_tokens_perc"] < 0.4


def test_the_default_thresholds_keep_an_idle_rank_and_a_short_silence_quiet() -> None:
    for scrapes in (stop_engine_1(8, 1.0), stop_engine_1(4, 2.0)):
        assert "hung_rank" not in [f.id for f in diagnose(prepare(scrapes))]


def test_a_rank_silent_for_long_is_hung_and_never_also_called_slow() -> None:
    ids = [f.id for f in diagnose(prepare(stop_engine_1(30, 1.5)))]
    assert "hung_rank" in ids and "engine_imbalance" not in ids


def test_a_rank_that_resumes_is_reported_with_its_end() -> None:
    """Engine 1 frozen from t=3 (see stop_engine_1) until the scrape at t=12 shows it moving again:
    the silence spans the intervals 3 → 11, the last one without a token of its own."""
    rows = []
    e0 = {"gen": 0.0, "prompt": 0.0, "steps": 0.0}
    e1 = {"gen": 0.0, "prompt": 0.0, "steps": 0.0}
    for t in range(15):
        if t < 4 or t >= 12:
            e1 = {"gen": e1["gen"] + 100, "prompt": e1["prompt"] + 10, "steps": e1["steps"] + 100}
        e0 = {"gen": e0["gen"] + 150, "prompt": e0["prompt"] + 10, "steps": e0["steps"] + 100}
        rows.append((dict(e0), dict(e1)))
    hung = [f for f in diagnose(prepare(window(rows))) if f.id == "hung_rank"]
    assert len(hung) == 1 and hung[0].evidence["ongoing"] is False and "then it resumed" in hung[0].title
    assert hung[0].time_range == (3.0, 11.0) and hung[0].evidence["seconds_without_tokens"] == 8.0


# -- requests not spread: one engine queues while a peer has room ---------------------------------


def pinned(seconds: int, *, peer_waiting: float = 0.0, usage: float = 0.01, peer_usage: float = 0.0,
           waiting: float = 8.0) -> list[Scrape]:
    """Engine 0 decodes 4 sequences a step (100 steps/s) with ``waiting`` queued; engine 1 one
    sequence a step (50 steps/s): a router sends nearly everything to engine 0."""
    rows = []
    for t in range(seconds):
        rows.append(({"gen": 400.0 * t, "steps": 100.0 * t, "running": 4.0, "waiting": waiting, "usage": usage},
                     {"gen": 50.0 * t, "steps": 50.0 * t, "running": 1.0, "waiting": peer_waiting,
                      "usage": peer_usage}))
    return window(rows)


def ok_of(scrapes: Sequence[Scrape]) -> list[tuple[Scrape, object]]:
    return [(s, s.snapshot) for s in scrapes if s.snapshot is not None]


def test_an_engine_queueing_beside_a_peer_with_room_is_a_routing_skew_not_a_slow_rank_or_the_cap() -> None:
    scrapes = pinned(20)
    skews = load_skews(ok_of(scrapes), 10.0, 0.95, 0.4)
    assert [(k.engine, k.peer, k.kind, k.max_waiting, k.running, k.peer_running) for k in skews] == [
        (("m", "0"), ("m", "1"), "waiting", 8.0, 4.0, 1.0)]
    assert (skews[0].since, skews[0].until) == (0.0, 19.0)
    # Engine 1 made 50 tokens/s against 400 (12.5 %), but one sequence a step against four: starved, not slow.
    assert slow_ranks(ok_of(scrapes), 10.0, 0.4) == []
    findings = [f for f in diagnose(prepare(scrapes, max_num_seqs=4)) if f.severity != "info"]
    assert [f.id for f in findings] == ["engine_imbalance"]
    assert findings[0].evidence["skew"] == "waiting" and findings[0].knobs == ("dp-balance",)
    assert "engine 0 (m) held up to 8 waiting at 4 running while engine 1 (m) had room" in findings[0].title
    assert not findings[0].suggestions  # no flag: the routing is the fix


def test_a_short_skew_or_a_peer_that_queues_too_is_not_a_routing_skew() -> None:
    assert load_skews(ok_of(pinned(8)), 10.0, 0.95, 0.4) == []  # 7 s < 10 s
    both = pinned(20, peer_waiting=2.0)  # both engines queue: the capacity, not the routing
    assert load_skews(ok_of(both), 10.0, 0.95, 0.4) == []
    assert "queue_at_cap" in [f.id for f in diagnose(prepare(both, max_num_seqs=4))]


def test_a_kv_cache_full_beside_an_emptier_peer_is_a_kv_skew() -> None:
    scrapes = pinned(20, waiting=0.0, usage=0.97, peer_usage=0.30)
    skews = load_skews(ok_of(scrapes), 10.0, 0.95, 0.4)
    assert [(k.engine, k.kind, k.max_kv_usage, k.peer_kv_usage) for k in skews] == [(("m", "0"), "kv", 0.97, 0.30)]
    near = pinned(20, waiting=0.0, usage=0.97, peer_usage=0.60)  # 37 points apart: under the 40-point gap
    assert load_skews(ok_of(near), 10.0, 0.95, 0.4) == []


def test_the_diagnosis_judges_a_kv_skew_by_the_near_full_line_it_was_given() -> None:
    """prepare computes the skews once, with the context's thresholds: a 90 % cache beside a 10 % one
    is under the default 95 % "near full" line (no skew), and over an 85 % one (a KV skew)."""
    scrapes = pinned(20, waiting=0.0, usage=0.90, peer_usage=0.10)

    def skews(thresholds: Thresholds) -> list[object]:
        return [f.evidence["skew"] for f in diagnose(prepare(scrapes, thresholds=thresholds))
                if f.id == "engine_imbalance"]

    assert skews(Thresholds()) == []
    assert skews(Thresholds(kv_full_perc=0.85)) == ["kv"]


def test_a_skew_too_short_to_report_still_keeps_the_queue_off_the_cap() -> None:
    """7 s of engine 0 queueing beside a peer with room: under the 10 s a routing finding needs, yet
    over the 3 s a queue needs to count, so the queue rule must see it as routing, not the cap (the
    context keeps skews of any length; each rule picks those lasting long enough for it)."""
    ids = [f.id for f in diagnose(prepare(pinned(8), max_num_seqs=4))]
    assert "engine_imbalance" not in ids and "queue_at_cap" not in ids, ids


def test_the_diagnosis_reports_a_skew_of_exactly_the_minimum_length() -> None:
    def skews(seconds: int) -> list[object]:
        return [f.evidence["skew"] for f in diagnose(prepare(pinned(seconds), max_num_seqs=4))
                if f.id == "engine_imbalance"]

    assert (skews(11), skews(10)) == (["waiting"], [])  # 10 s is enough, 9 s is not


def test_the_real_pinned_recording_is_a_skew_and_its_idle_rank_is_not_hung() -> None:
    """Real vLLM 0.32, --data-parallel-size 2 --max-num-seqs 4, 12 clients pinned to engine 0 by
    the X-data-parallel-rank header and one placed by the balancer. When the free client stops,
    engine 1 goes silent while engine 0 still drains 4 a step: silent_ranks sees a silence, and
    the diagnosis must not call it hung (requests were routed away from it all along)."""
    scrapes = read_recording(INCIDENTS / "pinned_rank_dp2.jsonl.gz").scrapes()
    ok = ok_of(scrapes)
    skews = load_skews(ok, 10.0, 0.95, 0.4)
    assert [(k.engine[1], k.peer[1], k.kind) for k in skews] == [("0", "1", "waiting")]
    assert skews[0].seconds >= 20 and skews[0].max_waiting == 8 and skews[0].running == 4
    assert [r.engine[1] for r in silent_ranks(ok, 5.0, 1.05)] == ["1"]
    ids = [f.id for f in diagnose(prepare(scrapes)) if f.severity != "info"]
    assert ids == ["engine_imbalance"]


def test_the_simulated_sticky_router_is_a_skew_on_engine_0() -> None:
    scrapes = [Scrape(t, parse_snapshot(text)) for t, text in Simulation("pinned_rank").run_for(40)]
    assert slow_ranks(ok_of(scrapes), 10.0, 0.4) == []
    found = [f for f in diagnose(prepare(scrapes)) if f.id == "engine_imbalance"]
    assert [(f.evidence["engine"], f.evidence["skew"]) for f in found] == [("0", "waiting")]


def test_a_peer_without_room_or_a_modest_kv_gap_is_no_skew() -> None:
    # Both engines hold 4 running; engine 1 has no queue but no fewer running either: no room.
    even = window([({"gen": 400.0 * t, "steps": 100.0 * t, "running": 4.0, "waiting": 8.0},
                    {"gen": 400.0 * t, "steps": 100.0 * t, "running": 4.0, "waiting": 0.0}) for t in range(20)])
    assert load_skews(ok_of(even), 10.0, 0.95, 0.4) == []
    # KV 60 % against 10 %: a wide gap, but nobody near full (nothing waits for blocks).
    half = pinned(20, waiting=0.0, usage=0.60, peer_usage=0.10)
    assert load_skews(ok_of(half), 10.0, 0.95, 0.4) == []


def test_skew_boundaries_are_inclusive() -> None:
    assert [k.seconds for k in load_skews(ok_of(pinned(11)), 10.0, 0.95, 0.4)] == [10.0]  # exactly 10 s
    assert load_skews(ok_of(pinned(10)), 10.0, 0.95, 0.4) == []  # 9 s
    # At the "full" line and exactly the gap apart (values binary fractions represent exactly).
    exact = pinned(20, waiting=0.0, usage=0.75, peer_usage=0.25)
    assert [k.kind for k in load_skews(ok_of(exact), 10.0, 0.75, 0.5)] == ["kv"]
    assert load_skews(ok_of(pinned(20, waiting=0.0, usage=0.75, peer_usage=0.375)), 10.0, 0.75, 0.5) == []


def test_a_skew_reports_its_typical_gauges_not_the_last_or_extreme_ones() -> None:
    rows = []
    for t in range(20):
        running = 4.0 if t != 7 else 5.0  # one scrape caught mid-step with one more
        rows.append(({"gen": 400.0 * t, "steps": 100.0 * t, "running": running, "waiting": 2.0 + t % 5},
                     {"gen": 50.0 * t, "steps": 50.0 * t, "running": 1.0 if t < 19 else 0.0, "waiting": 0.0}))
    (skew,) = load_skews(ok_of(window(rows)), 10.0, 0.95, 0.4)
    assert (skew.kind, skew.running, skew.max_waiting, skew.peer_running, skew.peer_waiting) == (
        "waiting", 4.0, 6.0, 1.0, 0.0)


def test_a_rank_that_hangs_holding_requests_is_hung_even_after_a_skew() -> None:
    """Engine 0 is pinned and queues from t=0; at t=12 engine 1 stops holding 2 running requests
    (its gauges freeze, which look like room). It is a hang: critical, and not also "fix the
    routing" for the queue its silence leaves."""
    rows = []
    e1 = {"gen": 0.0, "steps": 0.0, "running": 1.0, "waiting": 0.0}
    for t in range(30):
        if t < 12:
            e1 = {"gen": 50.0 * t, "steps": 50.0 * t, "running": 1.0 if t < 11 else 2.0, "waiting": 0.0}
        rows.append(({"gen": 400.0 * t, "steps": 100.0 * t, "running": 4.0, "waiting": 8.0}, dict(e1)))
    ids = [f.id for f in diagnose(prepare(window(rows)))]
    assert "hung_rank" in ids
    imbalance = [f for f in diagnose(prepare(window(rows))) if f.id == "engine_imbalance"]
    assert all(f.time_range is not None and f.time_range[1] <= 12.0 for f in imbalance)


def test_room_that_flickers_is_no_way_around_the_cap() -> None:
    """Engine 0 at its cap of 4 with 3 waiting for 40 s; engine 1 has room in two scrapes of every
    three (then fills): no sustained routing skew, so the queue is the cap's."""
    rows = []
    for t in range(40):
        room = t % 3 != 2
        rows.append(({"gen": 400.0 * t, "steps": 100.0 * t, "running": 4.0, "waiting": 3.0},
                     {"gen": 300.0 * t, "steps": 100.0 * t, "running": 2.0 if room else 4.0,
                      "waiting": 0.0 if room else 1.0}))
    ids = [f.id for f in diagnose(prepare(window(rows), max_num_seqs=4))]
    assert "queue_at_cap" in ids or "engine_imbalance" in ids


def test_a_slow_rank_without_step_counts_is_still_slow() -> None:
    lines = []
    for t in range(20):
        lines.append((float(t), f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {600.0 * t}\n'
                                f'vllm:generation_tokens_total{{engine="1",model_name="m"}} {100.0 * t}\n'))
    scrapes = [Scrape(ts, parse_snapshot(text)) for ts, text in lines]
    assert [r.engine for r in slow_ranks(ok_of(scrapes), 10.0, 0.4)] == [("m", "1")]


def test_the_simulated_sticky_router_pins_most_but_not_all_requests() -> None:
    scrapes = [Scrape(t, parse_snapshot(text)) for t, text in Simulation("pinned_rank").run_for(30)]
    last = scrapes[-1].snapshot
    assert last is not None
    e1 = last.value("generation_tokens", ("sim-llama-3.1-8b", "1"))
    assert e1 is not None and e1 > 0  # the free tenth reaches engine 1
