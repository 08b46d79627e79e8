"""The edges of the rules that nothing else pinned: each test here fails when one condition, term or
threshold of a rule is dropped or moved (issue 19 found eight such mutations passing every unit test;
the others were found by mutating the rules the same way). Synthetic histories, one behaviour each;
the diagnosis is read only through ``prepare`` and ``diagnose``."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from diagnostics.core.diagnosis import Budgets, Finding, Thresholds, diagnose, prepare
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape, histogram_delta
from tests.unit.synth import ITL_BOUNDS, PROMPT_BOUNDS, STEP_BOUNDS, cumulative, scrape
from tests.unit.synth import text as synth_text

ITL_SLOTS, STEP_SLOTS, PROMPT_SLOTS = len(ITL_BOUNDS) + 1, len(STEP_BOUNDS) + 1, len(PROMPT_BOUNDS) + 1


def ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]


def find(findings: list[Finding], fid: str) -> Finding:
    return next(f for f in findings if f.id == fid)


def counts(slots: int, **at: float) -> list[float]:
    """Bucket counts: ``b3=200`` puts 200 observations in bucket 3."""
    out = [0.0] * slots
    for bucket, n in at.items():
        out[int(bucket[1:])] = n
    return out


def _decoders(seconds: int, gaps: Mapping[str, float], spikes_at: Mapping[int, Mapping[str, float]],
              prefills_at: set[int]) -> list[Scrape]:
    """16 decoders for ``seconds``: ``gaps`` per second (ITL bucket counts); ``spikes_at`` adds ITL
    counts at those seconds; ``prefills_at`` holds one 1,024–2,048-token step and a 1,000–2,000-token
    prompt."""
    return cumulative([{
        "gen": 200.0, "running": 16,
        "itl_counts": [a + b for a, b in zip(counts(ITL_SLOTS, **gaps), counts(ITL_SLOTS, **spikes_at.get(t, {})))],
        "step_counts": counts(STEP_SLOTS, b7=20, b9=1 if t in prefills_at else 0),
        "prompt_len_counts": counts(PROMPT_SLOTS, b2=8, b10=1 if t in prefills_at else 0),
    } for t in range(seconds)])


@pytest.mark.parametrize(("spike_bucket", "fires"), [
    (6, False),  # gaps in (150, 200] ms over a 62 ms median: above the 100 ms floor, under 3 × the median
    (8, True),  # gaps in (300, 400] ms: more than three times the median
])
def test_a_head_of_line_spike_is_three_times_the_median_not_just_over_the_floor(spike_bucket: int, fires: bool) -> None:
    history = _decoders(20, {"b3": 200}, {t: {f"b{spike_bucket}": 20} for t in (5, 10, 15)}, {5, 10, 15})
    assert ("head_of_line_blocking" in ids(diagnose(prepare(history)))) == fires


@pytest.mark.parametrize(("seconds_before", "fires"), [(1, True), (2, False)])
def test_a_large_step_in_the_neighbouring_interval_explains_a_spike(seconds_before: int, fires: bool) -> None:
    """vLLM updates the histograms asynchronously: the large step and the gaps it causes can land one
    scrape apart, never two."""
    spikes = {t: {"b8": 20} for t in (6, 11, 16)}
    history = _decoders(20, {"b0": 200}, spikes, {t - seconds_before for t in spikes})
    assert ("head_of_line_blocking" in ids(diagnose(prepare(history)))) == fires


def test_a_histogram_after_a_restart_is_the_new_process_s_even_when_every_bucket_grew() -> None:
    """The new process observed more than the old one had: no bucket dropped, only the start time
    says the counts began again."""
    old = scrape(0.0, itl_counts=counts(ITL_SLOTS, b0=5, b2=4), itl_sum=0.1)
    new = scrape(1.0, itl_counts=counts(ITL_SLOTS, b0=8, b2=6), itl_sum=0.2, started_at=2000)
    delta = histogram_delta([old, new], "inter_token_latency_seconds")
    assert delta is not None and delta.count == 14 and delta.cumulative[0] == 8


def test_a_restart_while_the_server_answered_is_a_warning_with_the_run_that_ended() -> None:
    history = [scrape(float(t), gen=100 * t, running=4) for t in range(5)]
    history += [scrape(float(t), gen=50 * (t - 4), running=2, started_at=2000) for t in range(5, 10)]
    findings = diagnose(prepare(history))
    restarted = find(findings, "server_restarted")
    assert restarted.severity == "warning" and restarted.time_range == (4.0, 5.0)
    assert restarted.evidence["started_at"] == 2000 and restarted.evidence["seen_at"] == 5.0
    assert restarted.evidence["before_max_num_requests_running"] == 4  # the old process's, not the new one's
    assert "server_down" not in ids(findings)


def test_an_engine_recomputing_preempted_requests_has_not_stopped() -> None:
    """Requests running, no token for 3 s, but preemptions still counting: the engine is busy
    recomputing under a full cache, so the KV-pressure advice stands ("tokens stopped" would hold it
    back)."""
    per_second = [{"gen": 100.0 if t < 10 else 0.0, "preempt": 2.0, "running": 10, "waiting": 5, "usage": 1.0}
                  for t in range(14)]
    findings = diagnose(prepare(cumulative(per_second)))
    assert "tokens_stopped" not in ids(findings)
    assert find(findings, "kv_pressure").suggestions


@pytest.mark.parametrize(("min_scrapes", "fires"), [(3, False), (2, True)])
def test_a_stall_needs_enough_scrapes_not_only_enough_seconds(min_scrapes: int, fires: bool) -> None:
    """6 s without a token seen by only two late scrapes (3 s apart): too few to call a stall."""
    times = [0, 1, 2, 3, 4, 7, 10, 11, 12]
    gen = [0, 100, 200, 300, 400, 400, 400, 500, 600]
    history = [scrape(float(t), gen=g, running=4) for t, g in zip(times, gen)]
    findings = diagnose(prepare(history, thresholds=Thresholds(stall_min_scrapes=min_scrapes)))
    assert ("silent_stall" in ids(findings)) == fires


@pytest.mark.parametrize(("usage", "severity"), [(0.7, "warning"), (1.0, "critical")])
def test_kv_pressure_is_critical_only_with_a_full_cache(usage: float, severity: str) -> None:
    history = [scrape(float(t), gen=100 * t, running=10, waiting=5, usage=usage, preempt=2 * t) for t in range(20)]
    assert find(diagnose(prepare(history)), "kv_pressure").severity == severity


@pytest.mark.parametrize(("finished", "severity"), [(0, "warning"), (40, "critical"), (41, "warning")])
def test_kv_pressure_is_critical_when_half_the_finished_requests_were_preempted(finished: int, severity: str) -> None:
    """20 preemptions spread over a 100 s window (0.2 a second, far under one a second) with the
    cache full and requests waiting: critical once they reach half of the requests finished (20 of
    40), not with 41 finished; with none finished (fewer than 10) the share says nothing."""
    history = [Scrape(float(t), parse_snapshot(
        synth_text(gen=100 * t, running=10, waiting=5, usage=1.0, preempt=t // 5)
        + f'vllm:request_success_total{{model_name="m",finished_reason="length"}} {finished * t / 100}\n'))
        for t in range(101)]
    assert find(diagnose(prepare(history)), "kv_pressure").severity == severity


def test_decode_over_budget_at_a_single_sequence_leads_with_the_model_not_the_batch() -> None:
    """One sequence running all along and ITL p95 ~74 ms over a 50 ms budget: no smaller batch exists,
    so fewer sequences cannot help and are not suggested; quantized weights (read faster per step) come first."""
    history = cumulative([{"gen": 100.0, "running": 1, "itl_counts": counts(ITL_SLOTS, b3=100)} for _ in range(12)])
    f = find(diagnose(prepare(history, budgets=Budgets(itl_ms=50))), "slow_decode")
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == ("--quantization", "set")
    assert "--max-num-seqs" not in [s.flag for s in f.suggestions]


@pytest.mark.parametrize(("running", "seats"), [(2, False), (3, True)])
def test_fewer_sequences_are_withheld_at_two_running_and_offered_second_at_three(running: int, seats: bool) -> None:
    """ITL p95 ~74 ms over a 50 ms budget with the running count constant: at 2 there is no smaller batch
    worth trying (the batch size ruled out, no --max-num-seqs); at 3 the window cannot tell (not checked),
    so fewer sequences come second, after quantized weights."""
    history = cumulative([{"gen": 100.0, "running": running, "itl_counts": counts(ITL_SLOTS, b3=100)}
                          for _ in range(12)])
    f = find(diagnose(prepare(history, budgets=Budgets(itl_ms=50))), "slow_decode")
    assert f.suggestions[0].flag == "--quantization"
    assert ("--max-num-seqs" in [s.flag for s in f.suggestions[1:]]) is seats
    fit = {r["cause"]: r["fit"] for r in f.evidence["causes"]}["batch_size"]
    assert fit == ("unknown" if seats else "ruled_out")


@pytest.mark.parametrize(("seconds", "rises"), [(6, False), (9, True)])
def test_a_median_rising_with_the_batch_is_judged_on_six_intervals_at_least(seconds: int, rises: bool) -> None:
    """4 running with gaps under 10 ms, then 16 running with gaps of 50–75 ms: over 8 intervals the
    median rose with the batch; over 5, one interval a side says too little to claim it."""
    half = seconds // 2
    history = cumulative([{"gen": 100.0, "running": 4 if t < half else 16,
                           "itl_counts": counts(ITL_SLOTS, b0=100) if t < half else counts(ITL_SLOTS, b3=100)}
                          for t in range(seconds)])
    f = find(diagnose(prepare(history, budgets=Budgets(itl_ms=40))), "slow_decode")
    assert f.evidence["median_rises_with_batch"] is rises


@pytest.mark.parametrize(("spikes", "fires"), [(5, False), (20, True)])
def test_a_spike_interval_has_one_percent_of_its_gaps_in_the_tail(spikes: int, fires: bool) -> None:
    """1,000 gaps a second under 10 ms; next to each long prefill, 5 (0.5 %) or 20 (2 %) of 300–400 ms."""
    history = _decoders(20, {"b0": 1000}, {t: {"b8": spikes} for t in (5, 10, 15)}, {5, 10, 15})
    assert ("head_of_line_blocking" in ids(diagnose(prepare(history)))) == fires


@pytest.mark.parametrize(("grown_to", "rises"), [(12, False), (16, True)])
def test_a_median_rises_with_the_batch_only_when_the_batch_at_least_doubled(grown_to: int, rises: bool) -> None:
    """8 running with gaps under 10 ms, then ``grown_to`` with gaps of 50–75 ms: from 8 to 12 the
    batch did not change enough to blame it."""
    history = cumulative([{"gen": 100.0, "running": 8 if t < 5 else grown_to,
                           "itl_counts": counts(ITL_SLOTS, b0=100) if t < 5 else counts(ITL_SLOTS, b3=100)}
                          for t in range(10)])
    f = find(diagnose(prepare(history, budgets=Budgets(itl_ms=40))), "slow_decode")
    assert f.evidence["median_rises_with_batch"] is rises


@pytest.mark.parametrize(("prefills_at", "fires"), [({4, 8}, False), ({4, 8, 12}, True)])
def test_most_spike_intervals_sit_next_to_a_long_prefill(prefills_at: set[int], fires: bool) -> None:
    """Spikes in five intervals; two of them next to a long prefill are a coincidence (under half),
    three are the pattern."""
    history = _decoders(24, {"b0": 200}, {t: {"b8": 20} for t in (4, 8, 12, 16, 20)}, prefills_at)
    assert ("head_of_line_blocking" in ids(diagnose(prepare(history)))) == fires


def test_a_batch_whose_itl_p95_is_exactly_the_budget_is_within_it() -> None:
    """At 4 running, 95 of every 100 gaps in (25, 50] ms: p95 is 50 ms exactly, within a 50 ms
    budget, so 4 is the batch the budget defends; 16 running is over it."""
    history = cumulative([{"gen": 100.0, "running": 4 if t < 6 else 16,
                           "itl_counts": counts(ITL_SLOTS, b2=95, b4=5) if t < 6 else counts(ITL_SLOTS, b4=100)}
                          for t in range(12)])
    f = find(diagnose(prepare(history, budgets=Budgets(itl_ms=50))), "slow_decode")
    assert f.evidence["defended_num_requests_running"] == 4


def _rejected(t: float, num_rejected: float, usage: float) -> Scrape:
    """Four running at a cap of four, two waiting, ``num_rejected`` turned away so far."""
    text = synth_text(gen=100 * t, running=4, waiting=2, usage=usage)
    return Scrape(t, parse_snapshot(text + f'vllm:admission_rejections_total{{model_name="m",'
                                           f'reason="max_num_queued_reqs"}} {num_rejected}\n'))


def test_requests_turned_away_with_the_kv_cache_not_yet_full_name_the_batch_cap() -> None:
    """85 % of the KV cache in use: room the batch cap is not using, not a full cache."""
    history = [_rejected(float(t), 0 if t < 3 else 10, usage=0.85) for t in range(8)]
    f = find(diagnose(prepare(history, max_num_seqs=4)), "admission_rejected")
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == ("--max-num-seqs", "increase")


def test_the_batch_cap_is_read_up_to_five_seconds_before_the_first_rejection() -> None:
    """Running sat at the cap of 4 (two waiting) only at t = 2 s; the first rejection lands in the interval that
    begins at 6 s. Five seconds ahead (admission_lead_seconds) still sees the cap, so the advice is the
    batch cap; the limit itself is named when the cap is seen only further back (t = 0 s)."""
    def history(at_cap: int) -> list[Scrape]:
        return [Scrape(float(t), parse_snapshot(
            synth_text(gen=100 * t, running=4 if t == at_cap else 1, waiting=2 if t == at_cap else 0, usage=0.5)
            + f'vllm:admission_rejections_total{{model_name="m",reason="max_num_queued_reqs"}} '
              f'{0 if t < 7 else 10}\n')) for t in range(12)]

    near = find(diagnose(prepare(history(at_cap=2), max_num_seqs=4)), "admission_rejected")
    assert (near.suggestions[0].flag, near.suggestions[0].direction) == ("--max-num-seqs", "increase")
    far = find(diagnose(prepare(history(at_cap=0), max_num_seqs=4)), "admission_rejected")
    assert (far.suggestions[0].flag, far.suggestions[0].direction) == ("--max-num-queued-reqs", "increase")


def _turned_away(states: Mapping[int, tuple[float, float] | None], seconds: int, **extra: object) -> list[Scrape]:
    """A burst turned away between 3 and 4 s (10 requests) under --max-num-seqs 4; ``states``: (running,
    waiting) from each second on (the last given holds until the next), None for a failed scrape."""
    out, state = [], (0.0, 0.0)
    for t in range(seconds):
        if t in states:
            given = states[t]
            if given is None:
                out.append(Scrape(float(t), None, error="timed out"))
                state = (-1.0, -1.0)
                continue
            state = given
        elif state == (-1.0, -1.0):
            out.append(Scrape(float(t), None, error="timed out"))
            continue
        running, waiting = state
        out.append(Scrape(float(t), parse_snapshot(
            synth_text(gen=100 * t, running=running, waiting=waiting, usage=0.3, **extra)  # type: ignore[arg-type]
            + f'vllm:admission_rejections_total{{model_name="m",reason="max_num_queued_reqs"}} {0 if t < 4 else 10}\n')))
    return out


def _advice(history: list[Scrape]) -> Finding:
    return find(diagnose(prepare(history, max_num_seqs=4)), "admission_rejected")


@pytest.mark.parametrize(("failed_for", "flag"), [(10, "--max-num-seqs"), (119, "--max-num-seqs"),
                                                  (120, "--max-num-queued-reqs"), (200, "--max-num-queued-reqs")])
def test_the_batch_cap_is_read_through_the_drain_until_the_server_is_idle(failed_for: int, flag: str) -> None:
    """A burst turned away at 3–4 s while one request was running (the engine still ramping); then
    the busy host's scrapes fail for ``failed_for`` seconds; the drain after them shows the batch at
    its cap of 4 (two waiting) until the server goes idle 10 s later. The batch cap held that queue,
    however long after the 10 s drain window the scrapes came back, up to ``admission_settle_seconds``
    (120 s) after the last rejection was counted: seen later it is another episode, and the limit
    itself is named."""
    f = _advice(_turned_away({0: (1, 0), 5: None, 5 + failed_for: (4, 2), 15 + failed_for: (0, 0)}, failed_for + 20))
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == (flag, "increase")
    if flag == "--max-num-seqs":  # what was read through the drain: 4 running and 2 waiting
        assert f.suggestions[0].value == 6 and f.evidence["max_num_requests_waiting"] == 2
        assert f.time_range == (3.0, 4.0)


@pytest.mark.parametrize(("states", "flag"), [
    # Idle from 5 s: the queue had drained; a batch at its cap from 15 s is another episode.
    ({0: (1, 0), 5: (0, 0), 15: (4, 2), 21: (0, 0)}, "--max-num-queued-reqs"),
    # Not yet idle at 15 s (3 waiting, none running yet): the drain goes on, and the cap is seen from 16 s.
    ({0: (1, 0), 5: None, 15: (0, 3), 16: (4, 2), 21: (0, 0)}, "--max-num-seqs"),
    # The recording ends mid-drain, never idle: the drain is read to its end.
    ({0: (1, 0), 5: None, 15: (4, 2)}, "--max-num-seqs"),
    # The scrape that counted the rejections read idle (the gauges missed the burst): the drain starts after it.
    ({0: (1, 0), 4: (0, 0), 5: None, 15: (4, 2), 21: (0, 0)}, "--max-num-seqs"),
])
def test_the_drain_ends_at_the_first_idle_scrape_after_the_rejections(
    states: Mapping[int, tuple[float, float] | None], flag: str
) -> None:
    f = _advice(_turned_away(states, 25))
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == (flag, "increase")


def test_requests_that_queued_through_the_drain_show_the_batch_at_its_cap_when_no_gauge_does() -> None:
    """The gauges never read more than 1 running (a busy host's gauges missed the burst); the requests that finished over the drain (after the
    10 s window, before the server was idle at 30 s) had queued 2 s a request against 4 s of decode:
    they waited for a running one to finish, so the batch cap held them."""
    history = _turned_away({0: (1, 0), 30: (0, 0)}, 35)
    finished = {t: 4 for t in range(20, 30)}  # 4 requests a second finish from 20 s
    queued = 0
    for i, taken in enumerate(history):
        queued += finished.get(int(taken.ts), 0)
        history[i] = Scrape(taken.ts, parse_snapshot(
            synth_text(gen=100 * taken.ts, running=1 if taken.ts < 30 else 0, waiting=0, usage=0.3,
                       queue_seconds=(2.0 * queued, queued), decode_seconds=(4.0 * queued, queued))
            + f'vllm:admission_rejections_total{{model_name="m",reason="max_num_queued_reqs"}} '
              f'{0 if taken.ts < 4 else 10}\n'))
    f = _advice(history)
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == ("--max-num-seqs", "increase")
    assert f.evidence["mean_queue_seconds"] == pytest.approx(2.0)
    # No gauge saw the queue: the batch grows by the half of a decode its requests queued, 4 → 6 (not
    # 4 + 0 waiting, the cap it already has, which the runner would drop as no change).
    assert f.suggestions[0].value == 6


def test_one_second_without_tokens_is_not_yet_tokens_stopped() -> None:
    """A queue at the cap whose last scrape saw no new token: too short to hold the queue advice back."""
    per_second = [{"gen": 100.0 if t < 9 else 0.0, "running": 4, "waiting": 10, "usage": 0.3} for t in range(10)]
    findings = diagnose(prepare(cumulative(per_second), max_num_seqs=4))
    assert "tokens_stopped" not in ids(findings)
    assert "queue_at_cap" in ids(findings)


@pytest.mark.parametrize(("prompt_bucket", "fires"), [(3, False), (5, True), (9, True)])
def test_parallel_samples_that_miss_the_cache_matter_only_with_prompts_of_two_blocks(
    prompt_bucket: int, fires: bool
) -> None:
    """n > 1 with prefix caching on and no cache hit: with 5–10-token prompts (under two 16-token
    blocks) there is no full block to share; with 20–50-token prompts (a median of 35, just over two
    blocks) or 500–1,000-token prompts sharing is missing."""
    history = cumulative([{"gen": 100.0, "queries": 500.0, "n_counts": counts(6, b0=1, b3=5),
                           "prompt_len_counts": counts(PROMPT_SLOTS, **{f"b{prompt_bucket}": 6})} for _ in range(6)])
    assert ("sharing_not_happening" in ids(diagnose(prepare(history)))) == fires
