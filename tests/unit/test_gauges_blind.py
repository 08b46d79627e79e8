"""The queue rule when vLLM's running/waiting gauges read 0 while requests flow (vLLM 0.32's
per-engine gauges under data parallelism on a busy host): judged from the queue-time histogram and
the finished-request counts instead. Proven on real histograms: the corpus's real recordings with
their gauges zeroed by ``zero_gauges.py`` (every other line as the server wrote it)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from diagnostics.core.diagnosis import Finding, Thresholds, diagnose, prepare
from diagnostics.core.metrics.catalog import Snapshot, parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.recording import Recording, read_lines, read_recording
from tests.fixtures.incidents import record, zero_gauges
from tests.fixtures.incidents.corpus import labels
from tests.fixtures.incidents.zero_gauges import GAUGES, zero_line, zero_metrics
from tests.unit.synth import text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
INCIDENTS = FIXTURES / "incidents"


def _zeroed(name: str) -> Recording:
    """A real recording with every running/waiting gauge sample at 0, as zero_gauges.py writes it."""
    lines = []
    with gzip.open(INCIDENTS / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            if isinstance(obj.get("metrics"), str):
                obj["metrics"] = zero_metrics(obj["metrics"])
            lines.append(json.dumps(obj))
    return read_lines(lines)


def _diagnose(recording: Recording) -> list[Finding]:
    return diagnose(prepare(recording.scrapes(), info=recording.info()))


def _queue(findings: list[Finding]) -> Finding | None:
    return next((f for f in findings if f.id == "queue_at_cap"), None)


def test_the_transformation_zeroes_the_gauge_samples_and_nothing_else() -> None:
    assert zero_line('vllm:num_requests_running{engine="0",model_name="m"} 4.0') == \
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0'
    assert zero_line('vllm:num_requests_waiting_by_reason{engine="1",reason="capacity"} 7.0') == \
        'vllm:num_requests_waiting_by_reason{engine="1",reason="capacity"} 0.0'
    for untouched in ("# HELP vllm:num_requests_running Number of requests in model execution batches.",
                      'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4',
                      'vllm:request_queue_time_seconds_bucket{engine="0",le="1.0",model_name="m"} 12.0',
                      'vllm:num_requests_running_total{engine="0"} 3.0'):
        assert zero_line(untouched) == untouched



def test_on_a_real_scrape_only_the_gauge_lines_change_and_the_counters_read_the_same() -> None:
    record = next(r for r in read_recording(INCIDENTS / "queue_cap_burst.jsonl.gz").records
                  if r.metrics and 'vllm:num_requests_running{engine="0",model_name="tiny"} 4.0' in r.metrics)
    assert record.metrics is not None
    before, after = record.metrics.split("\n"), zero_metrics(record.metrics).split("\n")
    changed = [a for a, b in zip(before, after) if a != b]
    assert len(before) == len(after)
    assert changed and all(line.startswith(GAUGES) and not line.endswith(" 0.0") for line in changed)
    was, now = parse_snapshot(record.metrics), parse_snapshot(zero_metrics(record.metrics))
    assert was.value("num_requests_running") == 4.0 and now.value("num_requests_running") == 0.0
    for concept in ("generation_tokens", "kv_cache_usage_perc", "prompt_tokens"):
        assert now.value(concept) == was.value(concept)
    assert now.histogram("request_queue_time_seconds") == was.histogram("request_queue_time_seconds")


def test_a_real_queue_with_the_gauges_zeroed_is_found_from_the_histograms_with_the_same_advice() -> None:
    """queue_cap_burst: 40 requests at once against --max-num-seqs 4 (the recipe). With the gauges its
    finding rests on them; with them zeroed, on the histograms, and the advice is the same."""
    real = _queue(_diagnose(read_recording(INCIDENTS / "queue_cap_burst.jsonl.gz")))
    blind = _queue(_diagnose(_zeroed("queue_cap_burst")))
    assert real is not None and real.evidence["evidence_basis"] == "gauges"
    assert blind is not None and blind.evidence["evidence_basis"] == "histograms"
    assert blind.severity == "warning"
    assert (blind.suggestions[0].flag, blind.suggestions[0].direction) == ("--max-num-seqs", "increase")
    # The cap was 4 (the recipe's flag, not known to the diagnosis): Little's law over the finished
    # requests puts the mean running count at most there, and what waited on top of it.
    assert 3.0 <= blind.evidence["estimated_running_per_engine"] <= 4.0
    assert blind.evidence["estimated_waiting_per_engine"] > 1.0
    # No value without the flag (a mean occupancy under the cap would "raise" it to itself); with the
    # flag known, the cap plus what waited.
    assert blind.suggestions[0].value is None and "not known" in blind.suggestions[0].why
    recording = _zeroed("queue_cap_burst")
    known = _queue(diagnose(prepare(recording.scrapes(), info=recording.info(), max_num_seqs=4)))
    assert known is not None and known.evidence["evidence_basis"] == "histograms"
    assert known.suggestions[0].value is not None and known.suggestions[0].value > 4


def test_a_flickering_gauge_that_caught_the_queue_at_the_cap_gives_the_cap_and_a_value() -> None:
    """A real recording (vLLM 0.32, --max-num-seqs 4 not passed to the diagnosis, 7 closed-loop
    clients, a busy 2-core host; a rehearsal's artifact): the running gauge read 0 in most intervals
    with tokens, so the queue is judged from the histograms, yet some scrapes caught requests
    waiting for capacity at 4 running. Counted here from the raw gauges: those scrapes make 4 the
    cap and the suggestion a number above it (it had no value: a finding with no flag to change)."""
    recording = read_recording(FIXTURES / "recording-queue-cap-flickering-gauge-0.32.0.jsonl.gz")
    scrapes = recording.scrapes()
    snaps = [s.snapshot for s in scrapes if s.snapshot is not None]
    top = max(snap.value("num_requests_running") or 0.0 for snap in snaps)
    caught = [snap for snap in snaps if (snap.value("num_requests_running") or 0.0) == top
              and (snap.by_label("num_requests_waiting_by_reason") or {}).get("capacity", 0.0) > 0]
    assert top == 4.0 and len(caught) >= 2
    waited = max(snap.value("num_requests_waiting") or 0.0 for snap in caught)
    found = _queue(diagnose(prepare(scrapes, info=recording.info())))
    assert found is not None and found.evidence["evidence_basis"] == "histograms"
    assert found.evidence["num_requests_running_cap"] == 4 and not found.evidence["cap_known_from_flags"]
    assert found.evidence["scrapes_queued_at_gauge_cap"] == len(caught)
    value = found.suggestions[0].value
    assert value is not None and value >= 4 + max(1, waited)
    assert "that is the cap" in found.suggestions[0].why and "not known" not in found.suggestions[0].why
    # One such scrape is not enough to call the window's highest running count the cap.
    once = Thresholds(hist_cap_min_scrapes=len(caught) + 1)
    unsure = _queue(diagnose(prepare(scrapes, info=recording.info(), thresholds=once)))
    assert unsure is not None and unsure.suggestions[0].value is None


def test_preemption_beside_a_running_gauge_at_0_sizes_fewer_seqs_from_tokens_per_step() -> None:
    """A real recording (vLLM 0.32, 60 requests of 200 tokens at once on 12 KV blocks, two cores
    kept busy): the running gauge read 0 at every scrape while the preemption counter rose (a CI
    rehearsal's recording of the same burst lost the --max-num-seqs advice so: it read the gauge
    at the onset). The sequences at the onset come from the engine's own counters instead: tokens
    generated per engine step in the two intervals ending at the scrapes around the onset, counted
    here from the raw scrapes."""
    recording = read_recording(FIXTURES / "recording-kv-pressure-gauges-zero-0.32.0.jsonl.gz")
    scrapes = recording.scrapes()
    snaps = [s.snapshot for s in scrapes if s.snapshot is not None]
    onset = next(i for i, (a, b) in enumerate(zip(snaps, snaps[1:]), 1)
                 if (b.value("num_preemptions") or 0) > (a.value("num_preemptions") or 0))
    assert all(snap.value("num_requests_running") == 0 for snap in snaps[onset - 1:onset + 1])
    assert not any(snap.has("spec_decode_num_accepted_tokens") and snap.value("spec_decode_num_accepted_tokens")
                   for snap in snaps)

    def per_step(a: Snapshot, b: Snapshot) -> float:
        ha, hb = a.histogram("iteration_tokens"), b.histogram("iteration_tokens")
        assert ha is not None and hb is not None and hb.count > ha.count
        return ((b.value("generation_tokens") or 0) - (a.value("generation_tokens") or 0)) / (hb.count - ha.count)

    decoded = max(per_step(snaps[i - 1], snaps[i]) for i in (onset - 1, onset))
    found = [f for f in diagnose(prepare(scrapes, info=recording.info())) if f.id == "kv_pressure"]
    assert len(found) == 1 and found[0].evidence["preemptions"] > 0
    evidence = found[0].evidence
    assert evidence["num_requests_running_at_onset"] == round(decoded)
    assert evidence["running_at_onset_basis"] == "tokens per step"
    fewer = [s for s in found[0].suggestions if s.flag == "--max-num-seqs"]
    assert [s.direction for s in fewer] == ["decrease"] and fewer[0].value is not None
    assert 1 <= fewer[0].value < round(decoded) < 12  # fewer than the blocks: each running sequence holds one at least
    assert "about" in fewer[0].why and "read 0 around the onset" in fewer[0].why


def test_preemption_advice_reads_the_running_gauge_around_the_onset_not_its_later_peak() -> None:
    """The corpus's real kv_pressure_memory_bytes: its preemption episode lasts 25 s and the running
    gauge peaks well after the onset. What ran at the onset is the gauge at the scrapes either side
    of the first preemption (read here from the raw scrapes), not the episode's highest reading."""
    recording = read_recording(INCIDENTS / "kv_pressure_memory_bytes.jsonl.gz")
    scrapes = recording.scrapes()
    snaps = [s.snapshot for s in scrapes if s.snapshot is not None]
    onset = next(i for i, (a, b) in enumerate(zip(snaps, snaps[1:]), 1)
                 if (b.value("num_preemptions") or 0) > (a.value("num_preemptions") or 0))
    around = max(snap.value("num_requests_running") or 0 for snap in snaps[onset - 1:onset + 1])
    peak = max(snap.value("num_requests_running") or 0 for snap in snaps[onset:])
    assert 0 < around < peak
    found = [f for f in diagnose(prepare(scrapes, info=recording.info())) if f.id == "kv_pressure"]
    assert found[0].evidence["num_requests_running_at_onset"] == around
    assert found[0].evidence["running_at_onset_basis"] == "gauge"
    fewer = [s.value for s in found[0].suggestions if s.flag == "--max-num-seqs"]
    assert fewer and fewer[0] is not None and 1 <= fewer[0] < around


def test_the_gauges_of_a_short_request_data_parallel_recording_read_0_and_it_stays_quiet() -> None:
    """hung_rank_dp2's gauges read 0 in every scrape (real vLLM 0.32, two ranks): blind, and with no
    request queued a second it gives no queue finding."""
    recording = read_recording(INCIDENTS / "hung_rank_dp2.jsonl.gz")
    ctx = prepare(recording.scrapes(), info=recording.info())
    assert ctx.gauges_blind
    assert _queue(diagnose(ctx)) is None
    assert not prepare(read_recording(INCIDENTS / "queue_cap_burst.jsonl.gz").scrapes()).gauges_blind


def test_a_full_cache_that_preempts_is_never_read_as_the_cap_when_the_gauges_are_zeroed() -> None:
    """kv_pressure_blocks_override: requests queue because the KV cache is full (preemptions counted).
    Zeroing the running/waiting gauges must not turn that into "raise --max-num-seqs"."""
    findings = _diagnose(_zeroed("kv_pressure_blocks_override"))
    assert _queue(findings) is None
    assert not any((s.flag, s.direction) == ("--max-num-seqs", "increase") for f in findings for s in f.suggestions)


def test_a_healthy_bursty_load_with_blind_gauges_has_no_queue() -> None:
    """healthy_bursty's short requests finish between scrapes (blind gauges), and none queued a second."""
    recording = read_recording(INCIDENTS / "healthy_bursty.jsonl.gz")
    ctx = prepare(recording.scrapes(), info=recording.info())
    assert ctx.gauges_blind and _queue(diagnose(ctx)) is None


def test_requests_held_by_a_sleeping_engine_are_not_read_as_the_cap_when_the_gauges_are_zeroed() -> None:
    """asleep_level0: the engine slept 12 s with requests kept; they finish after waking with long queue
    times. Zeroed gauges must not turn that into "raise --max-num-seqs": the sleep rule names it."""
    findings = _diagnose(_zeroed("asleep_level0"))
    assert findings and findings[0].id == "engine_asleep"
    assert _queue(findings) is None


def _two_engines(t: float, running: float, waiting: float) -> Scrape:
    """Two engines of one server with the same gauges (synth's lines for engine 0, copied for engine 1)."""
    one = text(gen=100 * t, prompt=50 * t, running=running, waiting=waiting, usage=0.2)
    other = "\n".join(line.replace('engine="0"', 'engine="1"') for line in one.splitlines()
                      if 'engine="0"' in line and not line.startswith("vllm:cache_config_info"))
    return Scrape(t, parse_snapshot(one + other + "\n"))


def test_under_data_parallelism_the_cap_and_the_advice_are_per_engine() -> None:
    """--max-num-seqs holds per engine: two engines at 4 running with 3 waiting each are at a cap of 4,
    and the advice is 4 + 3, not the server's 8 running plus its 6 waiting."""
    ctx = prepare([_two_engines(float(t), 4, 3) for t in range(12)])
    finding = _queue(diagnose(ctx))
    assert finding is not None and finding.evidence["evidence_basis"] == "gauges"
    assert finding.evidence["num_engines"] == 2 and finding.evidence["num_requests_running_cap"] == 4
    assert finding.suggestions[0].value == 7
    assert "per engine (2 engines)" in finding.title


@pytest.mark.parametrize("name", sorted(record.DERIVED))
def test_a_derived_fixture_is_its_recorded_source_transformed_and_says_so(name: str) -> None:
    """A "gauges read 0" fixture is the real recording with only the gauge samples rewritten (every
    record, in order), named and labelled for the transformation, and judged by its source's label."""
    source = record.DERIVED[name]
    assert name.endswith("_gauges_zeroed") and name.startswith(source)
    src, derived = read_recording(record.HERE / f"{source}.jsonl.gz"), read_recording(record.HERE / f"{name}.jsonl.gz")
    assert [(r.ts, zero_gauges.zero_metrics(r.metrics) if r.metrics else None) for r in src.records] == \
        [(r.ts, r.metrics) for r in derived.records]
    label, source_label = labels()[name], labels()[source]
    assert label == record.derived_label(name, source_label)
    assert label["expect"] == source_label["expect"] and "derived" in label["how"]


# -- the histogram path gate by gate --------------------------------------------------------------
# A synthetic window in vLLM 0.32's shape where the running and waiting gauges read 0 every scrape
# (tokens flowing: blind) and each second 2 requests finish having queued 2.2 s each (the (2.0, 2.5]
# bucket of vLLM's queue-time buckets) after a 50 ms prefill, the KV cache 20 % full: the histograms
# show a queue at the cap. Each test below changes one thing the rule's docstring names.

QUEUE_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0)


def _queue_lines(long: float, short: float, long_seconds: float = 2.2, short_seconds: float = 0.1) -> list[str]:
    """request_queue_time_seconds with ``long`` observations of ``long_seconds`` (its bucket) and
    ``short`` of ``short_seconds`` (≤ 0.3 s), cumulative."""
    lines, total = [], 0.0
    for bound in QUEUE_BOUNDS:
        total = (short if bound >= short_seconds else 0.0) + (long if bound >= long_seconds else 0.0)
        lines.append(f'vllm:request_queue_time_seconds_bucket{{engine="0",model_name="m",le="{bound}"}} {total}')
    lines.append(f'vllm:request_queue_time_seconds_bucket{{engine="0",model_name="m",le="+Inf"}} {long + short}')
    lines.append(f'vllm:request_queue_time_seconds_count{{engine="0",model_name="m"}} {long + short}')
    lines.append(f'vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} '
                 f'{long * long_seconds + short * short_seconds}')
    return lines


def _blind_queue(seconds: int = 10, *, long: list[float] | None = None, short: list[float] | None = None,
                 preempt_at: int | None = None, prefill_seconds: float = 0.05, usage: list[float] | None = None,
                 asleep_at: int | None = None) -> list[Scrape]:
    """``long[t]`` / ``short[t]``: the requests finished in the second before scrape t (t ≥ 1) that
    queued 2.2 s / 0.1 s (default 2 and 0); ``preempt_at``: one preemption counted from that scrape;
    ``usage[t]``: the KV usage gauge; ``asleep_at``: the engine reported asleep at that scrape."""
    long = long if long is not None else [0.0] + [2.0] * (seconds - 1)
    short = short if short is not None else [0.0] * seconds
    usage = usage if usage is not None else [0.2] * seconds
    history, n_long, n_short = [], 0.0, 0.0
    for t in range(seconds):
        n_long, n_short = n_long + long[t], n_short + short[t]
        done = n_long + n_short
        body = text(gen=100 * t, prompt=50 * t, running=0, waiting=0, usage=usage[t],
                    preempt=1 if preempt_at is not None and t >= preempt_at else 0,
                    finished=(done, 0, 0, 0), prefill_seconds=(done * prefill_seconds, done))
        body += "\n".join(_queue_lines(n_long, n_short)) + "\n"
        awake = 0 if asleep_at == t else 1
        body += (f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="awake"}} {awake}\n'
                 f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="weights_offloaded"}} '
                 f'{1 - awake}\n')
        history.append(Scrape(float(t), parse_snapshot(body)))
    return history


def _blind_finding(history: list[Scrape], **kw: object) -> Finding | None:
    ctx = prepare(history, **kw)  # type: ignore[arg-type]
    assert ctx.gauges_blind
    return _queue(diagnose(ctx))


def test_the_synthetic_blind_queue_is_found_from_the_histograms_and_the_value_is_littles_law() -> None:
    """18 requests in 9 s (2 a second), each queued 2.2 s: on average 2 × 2.2 = 4.4 waited (Little's
    law). With --max-num-seqs 4 known, the advice is 4 + ⌈4.4⌉ = 9."""
    found = _blind_finding(_blind_queue(), max_num_seqs=4)
    assert found is not None and found.evidence["evidence_basis"] == "histograms"
    assert (found.evidence["requests_queued_over_min"], found.evidence["requests_finished_in_window"]) == (18, 18)
    assert found.evidence["estimated_waiting_per_engine"] == 4.4
    assert found.suggestions[0].value == 9
    assert found.time_range == (0.0, 9.0)


def test_the_advice_rounds_the_waiting_count_up_onto_a_known_cap() -> None:
    """1 request a second queued 2.2 s, beside 1 that queued 0.1 s: 2 a second × a mean 1.15 s = 2.3
    waited, ⌈2.3⌉ = 3 on top of the cap of 4 → 7."""
    found = _blind_finding(_blind_queue(long=[0.0] + [1.0] * 9, short=[0.0] + [1.0] * 9), max_num_seqs=4)
    assert found is not None and found.suggestions[0].value == 7


@pytest.mark.parametrize(("short", "expected"), [(30.0, True), (40.0, False)],
                         ids=["18 of 288 (6.3 %)", "18 of 378 (4.8 %)"])
def test_long_queue_times_must_be_a_share_of_the_windows_requests(short: float, expected: bool) -> None:
    """18 requests queued ≥ 1 s either way (over the 5 needed); beside 30 short ones a second that is
    6.3 % of the requests, over the 5 % share; beside 40 a second, 4.8 %: too few to say the cap."""
    history = _blind_queue(short=[0.0] + [short] * 9)
    assert (_blind_finding(history) is not None) is expected


@pytest.mark.parametrize(("share", "expected"), [(0.10, True), (0.12, False)])
def test_the_share_gate_on_a_real_data_parallel_queue_with_its_gauges_zeroed(share: float, expected: bool) -> None:
    """queue_cap_dp2_mid (real, two engines), gauges zeroed: 18 of its 165 finished requests queued
    past the 1 s bucket bound, 10.9 %: found at a 10 % share, not at 12 %."""
    recording = _zeroed("queue_cap_dp2_mid")
    ctx = prepare(recording.scrapes(), info=recording.info(), thresholds=Thresholds(hist_queue_share=share))
    assert (_queue(diagnose(ctx)) is not None) is expected


def test_preempted_requests_are_the_kv_caches_not_the_caps() -> None:
    """One preemption in the window: the waits may be recomputation, never "raise --max-num-seqs"."""
    assert _blind_finding(_blind_queue(preempt_at=5)) is None


def test_a_queue_shorter_than_the_prefill_is_not_the_cap() -> None:
    """A mean 2.2 s in the queue against a mean 3 s of prefill: the requests waited on long prefills."""
    assert _blind_finding(_blind_queue(prefill_seconds=3.0)) is None
    assert _blind_finding(_blind_queue(prefill_seconds=2.0)) is not None


@pytest.mark.parametrize(("queued", "expected"), [(range(4, 6), False), (range(4, 8), True)],
                         ids=["2 s of queueing", "4 s of queueing"])
def test_the_queue_must_span_queue_min_seconds(queued: range, expected: bool) -> None:
    """3 long waits a second in the intervals ending at the seconds listed (short ones elsewhere):
    the intervals 3-5 span 2 s, under the 3 s asked; 3-7 span 4 s."""
    long = [3.0 if t in queued else 0.0 for t in range(10)]
    short = [0.0] + [2.0] * 9
    found = _blind_finding(_blind_queue(long=long, short=short))
    assert (found is not None) is expected
    if found is not None:
        assert found.time_range == (3.0, 7.0)


def test_requests_held_by_an_engine_asleep_in_the_window_are_not_the_cap() -> None:
    assert _blind_finding(_blind_queue(asleep_at=5)) is None


@pytest.mark.parametrize(("peak", "expected"), [(0.8, False), (0.75, True)])
def test_a_kv_cache_at_kv_low_perc_is_not_a_cache_with_room(peak: float, expected: bool) -> None:
    """The KV usage gauge at 80 % (kv_low_perc) in one scrape: memory may be what queues; at 75 %, not."""
    usage = [0.2] * 10
    usage[5] = peak
    assert (_blind_finding(_blind_queue(usage=usage)) is not None) is expected
