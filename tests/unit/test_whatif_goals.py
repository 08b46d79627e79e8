"""Goal seeking (issue 22 step 3): the smallest modelled change that meets every goal, on the
incident's own recorded workload.

Goals are set from the recording's own measured numbers (computed here from its histograms), and
"smallest" is checked by replaying the smaller candidates directly, not by reading the search's own
bookkeeping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics.core import whatif
from diagnostics.core.diagnosis import KnownFlags
from diagnostics.core.metrics.derive import Scrape, histogram_delta, histogram_quantile
from diagnostics.core.whatif.goals import Goal, candidates, parse_goal, seek, worst_span
from diagnostics.recording import read_recording

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "tests" / "fixtures" / "incidents"


def recording(name: str) -> list[Scrape]:
    return read_recording(INCIDENTS / f"{name}.jsonl.gz").scrapes()


def quantile(scrapes: list[Scrape], q: float, concept: str) -> float:
    value = histogram_quantile(q, histogram_delta([s for s in scrapes if s.snapshot is not None], concept))
    assert value is not None
    return value


def test_goals_as_a_person_types_them() -> None:
    assert parse_goal("itl-p99=100ms") == Goal("itl_p99_seconds", 0.1)
    assert parse_goal("ttft-p95=2s") == Goal("ttft_p95_seconds", 2.0)
    assert parse_goal("ITL-P99.9=250") == Goal("itl_p999_seconds", 0.25)  # a bare latency is in ms, as budgets are
    assert parse_goal("throughput=500") == Goal("output_tokens_per_second", 500.0)
    assert parse_goal("preemptions=0") == Goal("preemptions_per_minute", 0.0)
    assert parse_goal("throughput=500tok/s") == Goal("output_tokens_per_second", 500.0)
    assert parse_goal("preemptions=2/min") == Goal("preemptions_per_minute", 2.0)
    for bad in ("itl=100ms", "itl-p99", "itl-p99=fast", "ttft-p95=-1s"):
        with pytest.raises(ValueError):
            parse_goal(bad)


@pytest.mark.parametrize("typed", ["itl-p99=2/min", "ttft-p95=3tok/s", "throughput=2ms", "throughput=2s",
                                   "preemptions=1s", "waiting=4/s"])
def test_a_unit_of_another_kind_of_goal_is_refused_with_the_units_this_one_takes(typed: str) -> None:
    """Issue 42: a rate's unit on a latency (or a latency's on a rate) was read as the goal's own unit
    (``itl-p99=2/min`` became 2 s): refused, naming what this goal takes."""
    with pytest.raises(ValueError, match="is not a unit of"):
        parse_goal(typed)


def test_a_goal_is_met_or_missed_by_hand_arithmetic() -> None:
    itl = Goal("itl_p99_seconds", 0.1)
    assert itl.met(0.1) and not itl.met(0.11) and not itl.met(None)
    assert itl.miss(0.09) == 0.0
    assert itl.miss(0.21) == pytest.approx(__import__("math").log((0.21 + 0.01) / (0.1 + 0.01)))  # the 10 ms floor
    rate = Goal("output_tokens_per_second", 500.0)
    assert rate.at_least and rate.met(501) and not rate.met(499)
    assert rate.text() == "output tok/s ≥ 500" and itl.text() == "ITL p99 ≤ 100 ms"


def test_changes_that_cannot_bind_in_the_replay_are_not_searched_and_would_change_nothing() -> None:
    """hol_burst_p99: nobody ever waits nor is preempted in its replay, so a higher cap replays the
    same steps (checked by replaying it) and the search leaves it out (more KV blocks too, unless
    prompts share prefixes a bigger cache could keep); a smaller token budget is searched."""
    scrapes = recording("hol_burst_p99")
    base = whatif.baseline(scrapes, KnownFlags())
    assert not base.before.metrics["max_num_requests_waiting"] and not base.before.metrics["preemptions_per_minute"]
    axes = {s.axis for s in candidates(base.flags, base)}
    assert "seqs-up" not in axes and "tokens-down" in axes
    assert ("kv" in axes) == (base.workload.prefix_hit_fraction > 0)
    same = base.predict({"--max-num-seqs": str(base.flags.max_num_seqs * 2)})
    assert same.after.metrics == base.before.metrics


def test_a_queue_at_the_cap_is_answered_with_the_smallest_cap_that_meets_the_ttft_goal() -> None:
    """queue_cap_closed_loop: 20 closed-loop clients on a cap of 6, TTFT p95 tens of seconds as
    recorded. Goal: a tenth of that. The answer raises the cap (the only lever for a queue of
    clients that the blocks are not limiting); every smaller raise, replayed directly, misses the goal."""
    scrapes = recording("queue_cap_closed_loop")
    recorded = quantile(scrapes, 0.95, "time_to_first_token_seconds")
    goal = Goal("ttft_p95_seconds", recorded / 10)
    answer = seek(scrapes, KnownFlags(), [goal])
    assert answer.reproduces and answer.met and not answer.already_met
    best = answer.found[0]
    (flag, value), = best.changes.items()
    assert flag == "--max-num-seqs" and int(value) > 6
    after = best.prediction.after.metrics["ttft_p95_seconds"]
    assert after is not None and after <= goal.limit
    base = whatif.baseline(scrapes, KnownFlags())
    smaller = [s for s in candidates(base.flags, base) if s.size < best.steps[0].size]
    assert smaller  # there were smaller changes, and none meets it
    for s in smaller:
        miss = base.predict({s.flag: s.value}).after.metrics["ttft_p95_seconds"]
        assert miss is None or miss > goal.limit, s
    assert len(answer.to_json()["next_best"]) == 2
    # Issue 42: once a step met the goals, no bigger step on its axis is an answer (a bigger change of the
    # same flag), and the answers come smallest first.
    axes = [t.steps[0].axis for t in answer.found if len(t.steps) == 1]
    assert len(axes) == len(set(axes))
    sizes = [t.size for t in answer.found]
    assert sizes == sorted(sizes)


def test_when_nothing_modelled_meets_the_goals_it_says_so_and_what_the_closest_reaches() -> None:
    """kv_pressure_blocks_override: 30 requests of 200 tokens at once on 12 KV blocks (the
    recording's cache_config_info). No preemption at all and the throughput kept cannot both be
    had from 4× the blocks or a lower cap: the closest is given, with what it reaches."""
    scrapes = recording("kv_pressure_blocks_override")
    answer = seek(scrapes, KnownFlags(), [Goal("preemptions_per_minute", 0.0)], ["throughput"])
    assert answer.reproduces and not answer.met and answer.closest is not None
    doc = answer.to_json()
    assert doc["met"] is False and doc["best"] is None and doc["closest"]["meets_goals"] is False
    assert {g["metric"] for g in doc["closest"]["goals"]} == {"preemptions_per_minute", "output_tokens_per_second"}


def test_a_window_the_replay_does_not_reproduce_gets_no_answer() -> None:
    """heldout/ho_kv_bytes_wide: the replay preempts under half as often as the recording (6.6 a
    minute, its own counter): no search, no answer."""
    scrapes = read_recording(INCIDENTS / "heldout" / "ho_kv_bytes_wide.jsonl.gz").scrapes()
    ok = [s for s in scrapes if s.snapshot is not None]
    assert ok[0].snapshot is not None and ok[-1].snapshot is not None
    rate = ((ok[-1].snapshot.value("num_preemptions") or 0) - (ok[0].snapshot.value("num_preemptions") or 0)) \
        / (ok[-1].ts - ok[0].ts) * 60
    answer = seek(scrapes, KnownFlags(), [Goal("preemptions_per_minute", rate / 10)], span_seconds=1e6)
    assert not answer.reproduces and not answer.found and answer.closest is None and answer.trials == 0
    assert answer.checks[0].recorded == pytest.approx(rate)


def test_goals_the_window_already_meets_need_no_change() -> None:
    scrapes = recording("queue_cap_closed_loop")
    ttft = quantile(scrapes, 0.95, "time_to_first_token_seconds")
    answer = seek(scrapes, KnownFlags(), [Goal("ttft_p95_seconds", ttft * 1.3)])  # inside the ±50 % gate too
    assert answer.already_met and answer.trials == 0


def test_a_long_window_is_searched_on_its_part_that_misses_worst() -> None:
    """slow_decode_small: clients ramped 4 → 24 → 96, so ITL is worst at the end. A 15 s span that
    misses an ITL p95 goal worst has a recorded ITL p95 at least that of the first 15 s and of the
    whole window (nothing waited in it, so the span is not stretched back)."""
    scrapes = [s for s in recording("slow_decode_small") if s.snapshot is not None]
    goal = Goal("itl_p95_seconds", 0.01)
    span = worst_span(scrapes, [goal], 15.0)
    assert span[-1].ts - span[0].ts <= 15.0 and len(span) >= 3
    first = [s for s in scrapes if s.ts - scrapes[0].ts <= 15.0]
    got = quantile(span, 0.95, "inter_token_latency_seconds")
    assert got >= quantile(first, 0.95, "inter_token_latency_seconds")
    assert got >= quantile(scrapes, 0.95, "inter_token_latency_seconds")
    assert worst_span(scrapes, [goal], 1e6) == scrapes


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnostics", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_whatif_cli_goal_seeking_text_and_json() -> None:
    path = str(INCIDENTS / "queue_cap_closed_loop.jsonl.gz")
    out = cli("whatif", "--replay", path, "--goal", "ttft-p95=2s", "--keep", "throughput")
    assert out.returncode == 0, out.stderr
    assert "the smallest change that meets every goal:" in out.stdout and "--max-num-seqs" in out.stdout
    assert "trade-off:" in out.stdout and "next best" in out.stdout
    doc = json.loads(cli("whatif", "--replay", path, "--goal", "ttft-p95=2s", "--json").stdout)
    assert doc["met"] is True and doc["best"]["meets_goals"] is True
    assert doc["best"]["goals"][0]["predicted"]["value"] <= 2.0
    assert doc["best"]["goals"][0]["predicted"]["low"] <= doc["best"]["goals"][0]["predicted"]["value"]
    bad = cli("whatif", "--replay", path, "--goal", "speed=fast")
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
    both = cli("whatif", "--replay", path, "--goal", "ttft-p95=2s", "--set", "max-num-seqs=8")
    assert both.returncode == 2 and "either --set" in both.stderr


def test_a_search_out_of_time_says_so() -> None:
    """With no time left after the baseline, no change is tried, and the answer says the search
    was cut short rather than that nothing modelled meets the goal."""
    scrapes = recording("queue_cap_closed_loop")
    answer = seek(scrapes, KnownFlags(), [Goal("ttft_p95_seconds", 1.0)], time_budget_s=0.0)
    assert answer.cut_short and answer.trials == 0 and not answer.met and answer.to_json()["cut_short"] is True


def _candidates_for(max_running: float) -> list:
    from types import SimpleNamespace

    from diagnostics.core.whatif.flags import Flags

    flags = Flags(max_num_seqs=128, max_num_batched_tokens=2048, num_gpu_blocks=1000, block_size=16,
                  enable_prefix_caching=True, max_model_len=4096)
    base = SimpleNamespace(before=SimpleNamespace(metrics={"max_num_requests_waiting": 0.0,
                                                           "preemptions_per_minute": 0.0}),
                           workload=SimpleNamespace(requests=[], prefix_hit_fraction=0.0),
                           calibration=SimpleNamespace(max_running=max_running))
    return candidates(flags, base)  # type: ignore[arg-type]


def test_the_cap_is_lowered_as_far_as_a_thirty_second_of_what_ran_by_hand() -> None:
    """A cap of 128 of which 96 ran at most: lowering it tries 96 × ¾, ½, ¼, ⅛, 1/16, 1/32 = 72, 48,
    24, 12, 6, 3 (a ramp to 96 that stopped at 12 needed 6), each as big a change as log2(96 / value)
    = 0.415, 1, 2, 3, 4, 5. Nothing waited nor was preempted, so no raise is searched. With 10
    running: 10 × ¾ = 7.5 → 8, 5, 2.5 → 2, 1.25 → 1, and 0.625 → 1 again, tried once."""
    steps = _candidates_for(96.0)
    down = [s for s in steps if s.axis == "seqs-down"]
    assert [s.value for s in down] == ["72", "48", "24", "12", "6", "3"]
    assert [s.size for s in down] == pytest.approx([0.415, 1, 2, 3, 4, 5], abs=1e-3)
    assert all(s.flag == "--max-num-seqs" for s in down) and not any(s.axis == "seqs-up" for s in steps)
    assert [s.value for s in _candidates_for(10.0) if s.axis == "seqs-down"] == ["8", "5", "2", "1"]


def test_keep_holds_a_rate_from_below_and_a_latency_from_above_by_five_percent() -> None:
    """Issue 42: ``--keep throughput`` is "at least 95 % of the replay under the current flags", ``--keep
    itl-p95`` "at most 105 %" — the direction follows the metric (more tokens/s is better, less latency)."""
    from diagnostics.core.whatif.goals import keep_goal

    scrapes = recording("queue_cap_burst")
    base = whatif.baseline(scrapes, KnownFlags())
    rate, itl = base.before.metrics["output_tokens_per_second"], base.before.metrics["itl_p95_seconds"]
    assert rate and itl
    kept = keep_goal("throughput", base)
    assert kept.at_least and kept.limit == pytest.approx(0.95 * rate)
    assert kept.met(rate) and not kept.met(0.9 * rate)
    latency = keep_goal("itl-p95", base)
    assert not latency.at_least and latency.limit == pytest.approx(1.05 * itl)
    assert latency.met(itl) and not latency.met(1.1 * itl)
    with pytest.raises(ValueError, match="no such metric"):
        keep_goal("latency", base)


def _flat(seconds: int, waiting_from: int | None = None) -> list[Scrape]:
    """``seconds`` of one scrape a second with the same ITL every second (200 gaps in (25, 50] ms), and
    requests waiting from ``waiting_from`` on."""
    from tests.unit.synth import cumulative

    return cumulative([{"gen": 200.0, "itl_counts": [0.0, 0.0, 200.0] + [0.0] * 11, "running": 4.0,
                        "waiting": 5.0 if waiting_from is not None and t >= waiting_from else 0.0, "usage": 0.2}
                       for t in range(seconds)])


def test_on_a_tie_the_latest_part_is_searched() -> None:
    """Issue 42: every 15 s part of a flat 60 s window misses a 10 ms ITL goal alike: the latest one is
    searched (the incident as it is now), ending at the window's last scrape."""
    scrapes = _flat(60)
    span = worst_span(scrapes, [Goal("itl_p95_seconds", 0.01)], 15.0)
    assert span[-1].ts == scrapes[-1].ts and span[-1].ts - span[0].ts <= 15.0


def test_a_span_reaches_back_to_where_nothing_waited_but_not_past_three_spans() -> None:
    """Requests waited from second 40 of 60: the last 15 s span reaches back to second 39, the last scrape
    with nothing waiting, so the queue's start is replayed. Waiting from second 5 (a queue older than three
    spans, 45 s, back from the end): the span is not stretched."""
    goal = [Goal("itl_p95_seconds", 0.01)]
    recent = worst_span(_flat(60, waiting_from=40), goal, 15.0)
    assert recent[0].ts == 39.0 and recent[-1].ts == 59.0
    old = worst_span(_flat(60, waiting_from=5), goal, 15.0)
    assert old[-1].ts - old[0].ts <= 15.0
