"""The diagnosis on every labelled real-incident recording (``tests/fixtures/incidents``, recorded
from real ``vllm serve`` by ``record.py``): the label's top finding, severity, first knob and its
direction; the healthy ones quiet. The held-out split (``incidents/heldout``: recorded after the rules
were tuned, from recipes committed before, ``heldout/RECIPES.md``) is judged alike, and no rule or
threshold is tuned to it: a miss there is listed below, not fixed by fitting. Deterministic: the
recordings are committed. Also: that the labels are complete and say what the recorder says, that
every check a label makes can fail, and that a real kill-and-restart leaves no spike in the rates."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from diagnostics.core.diagnosis import prepare
from diagnostics.core.metrics import series
from diagnostics.core.metrics.derive import counter_increase, counter_steps, merge_histograms, quantile_estimate
from diagnostics.core.simulator.scenarios import SCENARIOS
from tests.fixtures.incidents import record
from tests.fixtures.incidents.corpus import HELDOUT, SIMULATED, Case, cases, judge, labels, run

CASES = list(cases())
HELDOUT_CASES = list(cases(HELDOUT))
HELDOUT_RECORDED = [c for c in record.HELDOUT_CASES if c.name in labels(HELDOUT)]

# Cases where the diagnosis is not what the label says; each is a miss the bench reports too. Strict:
# when the rules get it right, the entry has to go.
KNOWN_MISSES = {
    # Held-out. Long prompts under a 120 ms ITL budget: head_of_line_blocking is found, with the right knob,
    # but second; slow_decode comes first (ITL p95 372 ms outside the long-prefill intervals, on a host
    # at load average 10-14; clients' token gap p50 102 ms) and leads with --quantization.
    "ho_hol_wide": "top: expected head_of_line_blocking, got slow_decode (forbidden)",
    # Held-out (issue 41). TTFT p95 0.42 → 2.05 s once the prompts stopped sharing a prefix, but the early
    # third began with the recording's 3 idle seconds and the late one held the backlog: requests started
    # per second read 0.93 → 1.72 and the mean running 0.86 → 2.29, so the change reads as more load and
    # no change finding is made (quiet).
    "alt_ttft_prefix_miss_wide": "top: expected latency_changed, got quiet",
    # Held-out (issue 41). vLLM 0.32 observes iteration_tokens only in a step that emits a token and counts a
    # split prompt whole in the step that finishes it (as many steps observed as tokens generated: 392 of
    # 392, 342 of 342), so no series shows the split; --max-num-batched-tokens is not known (no log), and
    # running sat at its own peak of 2 in 9 of 16 (7 of 14) waiting scrapes: neither the 80 % a cap is
    # inferred from nor under the half that rules one out. Said as "cause not identified", no flag. With
    # the server's flags typed in, the budget is named (test_causes).
    "alt_queue_token_budget_h8": "top: expected queue_token_budget, got requests_waiting",
    "alt_queue_token_budget_wide": "top: expected queue_token_budget, got requests_waiting",
    # Held-out, third set. Long prompts computed whole are named, no flag given; the token budget is "not
    # checked", not ruled out: the CPU's default --max-num-batched-tokens is not in any series or log here.
    "alt_ttft_long_prompts_h3": "alternatives: token_budget not ruled out (unknown)",
    "alt_ttft_long_prompts_wide": "alternatives: token_budget not ruled out (unknown)",
    # Held-out, third set. The co-tenant slowed the clients 1.6× (median 0.22 → 0.35 s), but the server's
    # ITL p95 stayed in the first bucket (< 10 ms) in both thirds and 10 / 6 first tokens were counted:
    # nothing the histograms show moved 2×, so no change is claimed (quiet).
    "alt_change_noisy_neighbour_wide": "top: expected unexplained_change, got quiet",
    # Tuned corpus, since the token budget is no longer ruled out from iteration_tokens (vLLM 0.32 cannot
    # show a split there): --max-num-seqs 3 held in 9 of 15 waiting scrapes (60 %, under the 80 % a cap is
    # inferred from) with the budget unknown, so the give-ups are said with no flag. With --max-num-seqs 3
    # typed in, the seats are named and raised (test_whatif_gate).
    "gave_up_open_loop_mid": "knob: expected --max-num-seqs increase, got no suggestion",
    # Held-out (issue 41). The recipe's 4 ms ITL budget sits inside vLLM's first inter_token_latency bucket
    # (10 ms): the clients saw 5.9 ms median gaps, but every server-side gap reads "< 10 ms", so the budget
    # cannot be judged; the diagnosis says so (itl_budget_below_buckets, info) and is quiet.
    "alt_slow_decode_small_batch_h8": "top: expected slow_decode, got quiet",
}


def _params(group: list[Case]) -> list[Any]:
    return [pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN_MISSES[c.name], strict=True))
            if c.name in KNOWN_MISSES else c for c in group]


@pytest.mark.parametrize("case", _params(CASES), ids=[c.name for c in CASES])
def test_the_diagnosis_matches_the_label(case: Case) -> None:
    verdict = judge(run(case), case.expect, len(case.scrapes))
    assert verdict.ok, verdict.why


@pytest.mark.parametrize("case", _params(HELDOUT_CASES), ids=[c.name for c in HELDOUT_CASES])
def test_the_diagnosis_matches_the_held_out_label(case: Case) -> None:
    verdict = judge(run(case), case.expect, len(case.scrapes))
    assert verdict.ok, verdict.why


def test_the_corpus_has_two_recordings_per_class_and_several_healthy_ones() -> None:
    per_class = Counter(label["class"] for label in labels().values())
    for incident in ("queue_at_cap", "kv_pressure", "sharing_off", "head_of_line", "slow_decode", "stall", "outage",
                     "hung_rank", "admission", "deferred", "unexplained_change", "rejected", "gave_up",
                     "context_cut", "failed"):
        assert per_class[incident] >= 2, per_class
    assert per_class["healthy"] >= 3
    assert len({label["shape"] for label in labels().values()}) >= 3


def test_the_held_out_split_covers_every_class_on_shapes_the_rules_were_not_tuned_on() -> None:
    held_out = labels(HELDOUT).values()
    per_class = Counter(label["class"] for label in held_out)
    for incident in ("queue_at_cap", "kv_pressure", "sharing_off", "head_of_line", "slow_decode", "stall", "outage",
                     "hung_rank", "admission", "deferred", "spec_decode", "asleep"):
        assert per_class[incident] >= 1, per_class
    tuned_shapes = {label["shape"] for label in labels().values()}
    assert len({label["shape"] for label in held_out} - tuned_shapes) >= 3


def _judged(expect: dict[str, Any]) -> bool:
    return not expect.get("quiet") and not expect.get("no_advice")


ALL_LABELS = [(folder, name) for folder in (record.HERE, HELDOUT) for name in sorted(labels(folder))]


@pytest.mark.parametrize(("folder", "name"), ALL_LABELS, ids=[name for _, name in ALL_LABELS])
def test_every_label_names_the_severity_and_the_first_knob(folder: Path, name: str) -> None:
    label = labels(folder)[name]
    for expect in [label["expect"]] + [w["expect"] for w in label["windows"]]:
        if _judged(expect):
            assert expect["severity"] in ("critical", "warning"), expect
            assert "flag" in expect and (expect["flag"] is None or expect["direction"] in ("increase", "decrease",
                                                                                            "set")), expect


def test_every_simulator_scenario_is_labelled_with_its_severity_and_first_knob() -> None:
    assert set(SIMULATED) == set(SCENARIOS)
    for name, label in SIMULATED.items():
        assert bool(label["expect"].get("quiet")) == (not SCENARIOS[name].knob), name
        if SCENARIOS[name].knob:
            assert label["expect"]["severity"] in ("critical", "warning") and "flag" in label["expect"], name


# Every recorded case of both sets with the folder of its labels (a held-out recipe whose runs never
# showed their condition has no label: the README's held-out section names it).
RECORDED = [(record.HERE, c) for c in record.CASES] + [(HELDOUT, c) for c in HELDOUT_RECORDED]


@pytest.mark.parametrize(("folder", "case"), RECORDED, ids=[c.name for _, c in RECORDED])
def test_labels_json_says_what_the_recorder_says(folder: Path, case: record.Case) -> None:
    """``labels.json`` is written from ``record.CASES`` (``record --relabel``): they must not drift."""
    label = labels(folder)[case.name]
    assert {k: label[k] for k in record._label(case)} == record._label(case)


@pytest.mark.parametrize(("folder", "case"), RECORDED, ids=[c.name for _, c in RECORDED])
def test_every_labelled_run_showed_its_condition_to_the_clients(folder: Path, case: record.Case) -> None:
    """Judged on what the load generator's own clients saw, independent of the diagnosis: the same
    check the recorder applied before it kept the recording (``Case.shows``)."""
    label = labels(folder)[case.name]
    assert label["clients"]["requests"] > 0
    if label["class"] in ("admission", "rejected", "gave_up", "failed"):
        # The incident is the failures: 503s from the queue limits, 400s, the clients' own timeouts, 500s.
        assert label["clients"]["failed"] > 0, label["clients"]
    elif label["class"] not in ("outage", "stall"):
        assert label["clients"]["failed"] == 0, label["clients"]
    assert case.shows(label), (case.name, label["clients"])


@pytest.mark.parametrize(("folder", "case"), RECORDED, ids=[c.name for _, c in RECORDED])
def test_no_case_counts_a_run_whose_clients_saw_nothing(folder: Path, case: record.Case) -> None:
    """Every ``shows`` reads the clients' evidence: a run that sent nothing and saw no token shows
    nothing (the recorder would run it again)."""
    nothing = {"clients": {"requests": 0, "ok": 0, "failed": 0, "token_gaps": 0, "gap_p50_s": None,
                           "gap_p90_s": None, "gap_p99_s": None, "gap_max_s": None, "request_max_s": None},
               "events": labels(folder)[case.name]["events"], "gap_timeline": []}
    assert not case.shows(nothing)


FORBIDS_SLOW_DECODE = [c for c in CASES if "slow_decode" in c.expect.get("forbid", [])]


def test_some_head_of_line_case_forbids_slow_decode() -> None:
    assert [c.name for c in FORBIDS_SLOW_DECODE if c.incident == "head_of_line"]


@pytest.mark.parametrize("case", FORBIDS_SLOW_DECODE, ids=[c.name for c in FORBIDS_SLOW_DECODE])
def test_a_forbidden_slow_decode_is_judged_where_it_could_fire(case: Case) -> None:
    """Without an ITL budget slow_decode never fires, and with one the window's whole ITL p95 is
    under, it cannot: the forbid means something only when the window's p95 breaks the budget and
    the head-of-line tail is all that explains it."""
    assert case.budgets.itl_ms is not None
    ctx = prepare(case.scrapes, info=case.info, budgets=case.budgets)
    p95 = quantile_estimate(0.95, merge_histograms([iv.itl for iv in ctx.itl.intervals]))
    assert p95 is not None and p95.over(case.budgets.itl_ms / 1000), p95


RESTART = next(c for c in CASES if c.name == "outage_restart")
# The recipe: a burst of 8 streaming requests of 64 tokens (ignore_eos: exactly 64 each), kill -9,
# restart, the same burst again.
TOKENS_PER_BURST = 8 * 64


def _restart_index(case: Case) -> int:
    starts = [(i, s.snapshot.process_start_time_seconds) for i, s in enumerate(case.scrapes) if s.snapshot]
    return next(i for (_, a), (i, b) in zip(starts, starts[1:]) if a != b)


def test_the_real_restart_counts_each_bursts_tokens_once() -> None:
    first_after = RESTART.scrapes[_restart_index(RESTART)].snapshot
    # The new process's first scrape already holds part of the second burst: it counts from 0, not
    # from the old process's last value.
    assert first_after is not None and 0 < (first_after.value("generation_tokens") or 0) < TOKENS_PER_BURST
    whole = counter_increase(RESTART.scrapes, "generation_tokens")
    before = counter_increase(RESTART.scrapes[:_restart_index(RESTART)], "generation_tokens")
    assert whole is not None and before is not None
    assert (before[0], whole[0]) == (TOKENS_PER_BURST, 2 * TOKENS_PER_BURST)


@pytest.mark.parametrize("concept", ["generation_tokens", "prompt_tokens"])
def test_the_rates_right_after_the_real_restart_stay_within_the_range_seen_before(concept: str) -> None:
    """No spike: the same burst before the kill and after the restart, so every rate after it (per
    interval, and the page's smoothed series) lies within what the first burst reached."""
    restart_ts = RESTART.scrapes[_restart_index(RESTART)].ts
    per_interval = [(t1, inc / (t1 - t0)) for t0, t1, inc in counter_steps(RESTART.scrapes,
                                                                           lambda s: s.value(concept))]
    smooth = series.rate_series(RESTART.scrapes, lambda s: s.value(concept))
    for points in (per_interval, [(t, v) for t, v in zip(smooth.ts, smooth.values) if v is not None]):
        before = [v for t, v in points if t < restart_ts]
        after = [v for t, v in points if t >= restart_ts]
        assert after and max(before) > 0
        assert all(0 <= v <= max(before) for v in after), (concept, before, after)
