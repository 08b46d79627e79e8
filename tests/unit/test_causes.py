"""The cause table (issue 41): its rows point to real knob rows and findings, the docs carry it, and on
real recordings each symptom's usual knob is withheld where its signature is absent and given where
it is present, with the alternative's number on the card. Expected numbers are read from the
recordings here (the gauges, the log's lines), not from the rules' output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diagnostics.core.diagnosis import RULES, Budgets, Finding, diagnose, prepare
from diagnostics.core.diagnosis.causes import (
    SYMPTOMS,
    Ruling,
    card_lines,
    cause_knobs,
    differential,
    markdown,
    with_table,
)
from diagnostics.core.diagnosis.knobs import KNOBS_BY_ID
from diagnostics.core.metrics.derive import Scrape, histogram_delta
from tests.fixtures.incidents.corpus import HELDOUT, Case, cases, labels
from tests.unit.synth import scrape

ROOT = Path(__file__).resolve().parents[2]
BY_NAME = {c.name: c for c in (*cases(), *cases(HELDOUT))}
BY_NAME_LABELS = labels(HELDOUT)


def findings(name: str, budgets: Budgets | None = None) -> list[Finding]:
    case: Case = BY_NAME[name]
    return diagnose(prepare(case.scrapes, info=case.info, budgets=budgets or case.budgets, log_text=case.log_text))


def advice(fs: list[Finding]) -> set[tuple[str, str]]:
    return {(s.flag, s.direction) for f in fs for s in f.suggestions}


def fits(f: Finding) -> dict[str, str]:
    return {r["cause"]: r["fit"] for r in f.evidence["causes"]}


# -- the table ---------------------------------------------------------------------------------------------


def test_every_cause_points_to_a_knob_row_that_exists_and_every_symptom_to_declared_findings() -> None:
    declared = {fid for rule in RULES for fid in rule.finding_ids}
    for symptom in SYMPTOMS.values():
        assert set(symptom.findings) <= declared, symptom.id
        assert len({c.id for c in symptom.causes}) == len(symptom.causes), symptom.id
        for cause in symptom.causes:
            assert cause.knob is None or cause.knob in KNOBS_BY_ID, (symptom.id, cause.id)
            assert cause.confirms and cause.rules_out, (symptom.id, cause.id)


def test_docs_diagnosis_carries_the_generated_cause_table() -> None:
    doc = (ROOT / "docs" / "diagnosis.md").read_text()
    assert with_table(doc) == doc
    assert markdown() in doc


def test_a_differential_names_the_first_cause_that_fits_and_says_the_unchecked_are_unknown() -> None:
    diff = differential("waiting", [Ruling("seat_cap", "fits", "a"), Ruling("token_budget", "fits", "b"),
                                    Ruling("kv_full", "ruled_out", "KV 30 %")])
    assert diff.named is not None and diff.named.id == "seat_cap"  # table order: the seats before the budget
    assert diff.ruling("stalled").fit == "unknown"
    assert "Not the KV cache: KV 30 %." in diff.checks()
    with pytest.raises(KeyError):
        differential("waiting", [Ruling("no_such_cause", "fits", "x")])


def test_a_finding_with_no_cause_identified_rests_on_no_knob_row() -> None:
    assert cause_knobs({"symptom": "rejected_4xx", "cause": None}) == ()
    assert cause_knobs({"symptom": "rejected_4xx", "cause": "model_not_served"}) == ("rejected-model-name",)
    assert cause_knobs({"no": "differential"}) is None


# -- HTTP 4xx on real servers ----------------------------------------------------------------------------------


def test_4xx_of_an_unserved_model_name_withhold_max_model_len_and_name_the_404s() -> None:
    """A real server refusing requests for `gpt-4o` (404): the context limit is ruled out by the refused
    requests' size, the log's access lines name the 404s, the change is --served-model-name."""
    name = "alt_rejected_model_name_h3"
    fs = findings(name)
    (found,) = [f for f in fs if f.id == "requests_rejected"]
    assert ("--max-model-len", "increase") not in advice(fs)
    assert [(s.flag, s.direction) for s in found.suggestions] == [("--served-model-name", "set")]
    assert fits(found)["context_limit"] == "ruled_out" and fits(found)["model_not_served"] == "fits"
    log = BY_NAME[name].log_text or ""
    n404 = len(re.findall(r'"POST /v1/completions HTTP/1\.1" 404', log))
    named = card_lines(found.evidence).named
    assert n404 > 0 and named is not None and f"shows {n404} of its {n404} 4xx answers on /v1/ as 404 Not Found" in named


def test_4xx_of_a_bad_parameter_without_a_log_name_no_cause_and_no_flag() -> None:
    fs = findings("alt_rejected_bad_param_wide")
    (found,) = [f for f in fs if f.id == "requests_rejected"]
    assert found.evidence["cause"] is None and found.suggestions == () and found.knobs == ()
    assert found.title.endswith("cause not identified")
    assert ("--max-model-len", "increase") not in advice(fs)


def test_4xx_of_prompts_over_the_limit_still_raise_max_model_len() -> None:
    """800-word prompts under --max-model-len 512 (the tuned corpus): the context limit fits, and its knob
    is given — the same rule that withheld it above."""
    fs = findings("rejected_over_len_512")
    (found,) = [f for f in fs if f.id == "requests_rejected"]
    assert found.evidence["cause"] == "context_limit"
    assert found.suggestions[0].flag == "--max-model-len" and found.suggestions[0].direction == "increase"


# -- waiting and TTFT on real servers -------------------------------------------------------------------------


def _peak_running(name: str) -> float:
    return max((s.snapshot.value("num_requests_running") or 0.0) for s in BY_NAME[name].scrapes if s.snapshot)


def _flag(name: str, flag: str) -> int | None:
    """A flag's value as the recipe served it (labels.json ``args``), None where it was not given."""
    args = BY_NAME_LABELS[name]["args"]
    return int(args[args.index(flag) + 1]) if flag in args else None


@pytest.mark.parametrize("name", ["alt_queue_token_budget_h8", "alt_queue_token_budget_wide"])
def test_a_queue_held_by_the_token_budget_withholds_max_num_seqs(name: str) -> None:
    """With neither flag known (no log), the queue is said with no cause and no flag: the seats cannot be
    inferred from a count held so rarely, and vLLM 0.32's iteration_tokens cannot show a split (it counts a
    split prompt whole). With the flags the server ran, typed in, the budget is named: 400 / 700-token
    prompts against 32 / 48 tokens, the seats ruled out by the running peak."""
    fs = findings(name)
    assert ("--max-num-seqs", "increase") not in advice(fs) and "head_of_line_blocking" not in [f.id for f in fs]
    top = next(f for f in fs if f.severity != "info")
    assert top.id == "requests_waiting" and top.suggestions == () and top.evidence["cause"] is None
    assert fits(top)["token_budget"] == "unknown" and fits(top)["kv_full"] == "ruled_out"
    # Running never above 2 (read from the recording) against the caps of 8 and 16 the server had: with the
    # cap not known, a count held in so few waiting scrapes infers no cap, so the seats are not checked.
    assert _peak_running(name) == 2 and fits(top)["seat_cap"] == "unknown"
    assert "too rarely to infer a cap from it" in _because(top, "seat_cap")
    cap, budget = _flag(name, "--max-num-seqs"), _flag(name, "--max-num-batched-tokens")
    assert cap and budget
    case = BY_NAME[name]
    known = diagnose(prepare(case.scrapes, info=case.info, max_num_seqs=cap, max_num_batched_tokens=budget))
    top = next(f for f in known if f.severity != "info")
    assert top.id == "queue_token_budget" and top.suggestions[0].flag == "--max-num-batched-tokens"
    assert top.suggestions[0].value is not None and top.suggestions[0].value > budget
    prompt = histogram_delta(list(case.scrapes), "request_prompt_tokens")
    assert prompt is not None and prompt.sum / prompt.count > budget  # the recording's own prompts
    assert fits(top)["token_budget"] == "fits" and fits(top)["seat_cap"] == "ruled_out"
    assert ("--max-num-seqs", "increase") not in advice(known)
    assert "head_of_line_blocking" not in [f.id for f in known]


@pytest.mark.parametrize("name", ["alt_queue_token_budget_h8", "alt_queue_token_budget_wide"])
def test_with_the_cap_known_the_seats_are_ruled_out_by_the_running_peak(name: str) -> None:
    """The same recordings with the --max-num-seqs the server ran (the recipe's flag, as an operator
    types it in): 'running peaked at 2 of --max-num-seqs N'."""
    case = BY_NAME[name]
    cap = {"alt_queue_token_budget_h8": 8, "alt_queue_token_budget_wide": 16}[name]  # heldout/RECIPES.md 19, 20
    fs = diagnose(prepare(case.scrapes, info=case.info, max_num_seqs=cap))
    top = next(f for f in fs if f.severity != "info")
    assert top.id == "queue_token_budget" and fits(top)["seat_cap"] == "ruled_out"
    assert f"Not the --max-num-seqs seat cap: running peaked at 2 of --max-num-seqs {cap}" in " ".join(top.checks)


def test_a_queue_at_the_seat_cap_still_raises_max_num_seqs() -> None:
    fs = findings("queue_cap_burst")
    top = next(f for f in fs if f.severity != "info")
    assert top.id == "queue_at_cap" and (top.suggestions[0].flag, top.suggestions[0].direction) == (
        "--max-num-seqs", "increase")
    assert fits(top)["seat_cap"] == "fits" and fits(top)["token_budget"] != "fits"


def test_ttft_over_budget_from_a_token_budget_queue_withholds_max_num_seqs() -> None:
    """A 1 s TTFT budget on the token-budget queue, the server's --max-num-seqs 8 typed in: the seats
    ruled out (running peaked at 2), the budget is the limit left, and the TTFT finding follows it."""
    case = BY_NAME["alt_queue_token_budget_h8"]
    fs = diagnose(prepare(case.scrapes, info=case.info, budgets=Budgets(ttft_ms=1000), max_num_seqs=8))
    (ttft,) = [f for f in fs if f.id.startswith("ttft_")]
    assert ("--max-num-seqs", "increase") not in advice(fs)
    assert ttft.suggestions and ttft.suggestions[0].flag == "--max-num-batched-tokens"
    # The window's own queue time, read here: over a second on average, so the TTFT is mostly queue.
    hist = histogram_delta(list(BY_NAME["alt_queue_token_budget_h8"].scrapes), "request_queue_time_seconds")
    assert hist is not None and hist.sum / hist.count > 1.0 and ttft.id == "ttft_queue_dominated"


def test_ttft_over_budget_at_the_seat_cap_still_raises_max_num_seqs() -> None:
    fs = findings("queue_cap_burst", Budgets(ttft_ms=100))
    (ttft,) = [f for f in fs if f.id.startswith("ttft_")]
    assert ttft.id == "ttft_queue_dominated" and ttft.suggestions[0].flag == "--max-num-seqs"


# -- a change at the same load ----------------------------------------------------------------------------------


def test_a_change_from_prefix_cache_misses_is_named_with_no_flag() -> None:
    fs = findings("alt_ttft_prefix_miss_h3")
    top = next(f for f in fs if f.severity != "info")
    assert top.id == "latency_changed" and top.evidence["cause"] == "prefix_cache_misses" and top.suggestions == ()
    assert fits(top)["more_load"] == "ruled_out"


def test_a_change_with_the_cache_unchanged_stays_unexplained_and_says_the_cache_was_checked() -> None:
    """The tuned corpus's throttled-host change: the hit rate had nothing to fall from, so it is not
    the cause; the finding is the unexplained change, with no flag."""
    fs = findings("changed_itl_duty_mid")
    top = next(f for f in fs if f.severity != "info")
    assert top.id == "unexplained_change" and top.evidence["cause"] is None and top.suggestions == ()
    # The recording's own counters: no prefix-cache hit in either part, 30-token prompts computed whole.
    assert fits(top) == {"more_load": "ruled_out", "prefix_cache_misses": "ruled_out", "preemption": "ruled_out",
                         "queueing": "ruled_out"}
    assert "hit rate went 0 % → 0 %" in _because(top, "prefix_cache_misses")



# -- the what-if on a token-budget queue ---------------------------------------------------------------------


def test_the_what_if_does_not_price_a_budget_it_cannot_read_from_the_window() -> None:
    """vLLM 0.32's iteration_tokens counts a prompt whole in the step that finishes it: on the token-budget
    queue the largest observation (a whole prompt) is no budget. With the
    budget unknown a change to it has no "before" and gets no prediction; given (32, the recipe's), it
    is replayed."""
    from diagnostics.core import whatif
    from diagnostics.core.diagnosis import KnownFlags
    from diagnostics.core.whatif.flags import NotModelled

    scrapes = list(BY_NAME["alt_queue_token_budget_h8"].scrapes)
    with pytest.raises(NotModelled, match="current value is not known"):
        whatif.baseline(scrapes, KnownFlags()).predict({"--max-num-batched-tokens": "512"})
    known = whatif.baseline(scrapes, KnownFlags(max_num_batched_tokens=32))
    assert known.flags.max_num_batched_tokens == 32
    known.predict({"--max-num-batched-tokens": "512"})  # replayed (or gated), not refused
    assert whatif.aimed_for(["queue_token_budget"]) == ("ttft_p95_seconds", "itl_p95_seconds")


# -- the edges of the signatures (a sceptic's mutations): synthetic windows whose numbers are set here ----


def _queue(at_cap: set[int], *, cap_run: float = 4, low: float = 2, prompt: float = 400) -> list[Scrape]:
    """6 waiting from t = 2 (20 scrapes with requests waiting), KV 20 %; running ``cap_run`` at the seconds
    in ``at_cap`` and ``low`` at the others; two requests a second finish with ``prompt``-token prompts;
    50 engine steps a second observed, 10 of them at one token (vLLM 0.32 observes only steps that emit
    a token, so these say nothing of a split)."""
    return [scrape(float(t), gen=100 * t, running=cap_run if t in at_cap else low, waiting=6 if t >= 2 else 0,
                   usage=0.2, step_counts=[10 * t, 40 * t] + [0] * 12, step_sum=8.0 * 40 * t,
                   lengths=(prompt * 2 * t, 8 * 2 * t, 2 * t))
            for t in range(22)]


def _top(fs: list[Finding]) -> Finding:
    return next(f for f in fs if f.severity != "info")


def _because(f: Finding, cause: str) -> str:
    return next(r["because"] for r in f.evidence["causes"] if r["cause"] == cause)


def test_a_cap_is_inferred_from_a_count_held_in_80_percent_of_the_waiting_scrapes_not_50() -> None:
    """The budget not known (so not checked): running at 4 in 16 of the 20 waiting scrapes infers the cap;
    in 10 of 20 it does not, neither the seats nor the budget is ruled out, nothing wins by elimination
    and no flag is given; with the cap of 4 known, 10 of 20 (half) is enough."""
    held = _top(diagnose(prepare(_queue(set(range(6, 22))))))
    assert held.id == "queue_at_cap" and "running held at 4 in 16 of 20" in _because(held, "seat_cap")
    half = _top(diagnose(prepare(_queue(set(range(12, 22))))))
    assert half.id == "requests_waiting" and half.suggestions == ()
    assert fits(half)["seat_cap"] == "unknown" and fits(half)["token_budget"] == "unknown"
    assert "--max-num-batched-tokens is not known here" in _because(half, "token_budget")
    known = _top(diagnose(prepare(_queue(set(range(12, 22))), max_num_seqs=4)))
    assert known.id == "queue_at_cap" and "cap of 4 in 10 of 20" in _because(known, "seat_cap")


def test_a_known_cap_reached_in_a_quarter_of_the_waiting_scrapes_is_not_the_cause_by_elimination() -> None:
    """--max-num-seqs 8 reached in 5 of 20 waiting scrapes (3 running the rest): the seats stay 'not
    checked' (measured, not eliminated). 400-token prompts over a known 256-token budget name the budget;
    within a 512-token one they rule it out, and nothing is named."""
    h = _queue({t for t in range(22) if t % 4 == 0}, cap_run=8, low=3)
    top = _top(diagnose(prepare(h, max_num_seqs=8, max_num_batched_tokens=256)))
    assert top.id == "queue_token_budget" and fits(top)["seat_cap"] == "unknown"
    assert "prompts averaged 400 tokens against the --max-num-batched-tokens budget of 256" in _because(
        top, "token_budget")
    within = _top(diagnose(prepare(h, max_num_seqs=8, max_num_batched_tokens=512)))
    assert within.id == "requests_waiting" and within.suggestions == ()
    assert fits(within)["token_budget"] == "ruled_out"


def test_running_below_its_peak_in_most_waiting_scrapes_rules_an_inferred_cap_out() -> None:
    """At 8 in 7 of the 20 waiting scrapes, 3 the rest: no seat cap held. With the KV cache, deferral,
    a stall and sleep ruled out too, the token budget is the one admission limit left (by elimination);
    with a budget known to hold the prompts, nothing is left and no flag is given."""
    h = _queue({t for t in range(22) if t % 3 == 0}, cap_run=8, low=3)
    top = _top(diagnose(prepare(h)))
    assert fits(top)["seat_cap"] == "ruled_out" and "below its own peak in 13 of 20" in _because(top, "seat_cap")
    assert top.id == "queue_token_budget" and _because(top, "token_budget").startswith("by elimination")
    held = _top(diagnose(prepare(h, max_num_batched_tokens=2048)))
    assert held.id == "requests_waiting" and held.suggestions == () and fits(held)["token_budget"] == "ruled_out"


def test_the_budget_is_not_named_by_elimination_while_the_kv_cache_is_not_ruled_out() -> None:
    """The seats ruled out as above, but the KV cache at 85 % (neither full nor clearly free): one admission
    limit other than the budget is still open, so nothing is named and no flag is given."""
    h = [scrape(s.ts, gen=100 * int(s.ts), running=3 if int(s.ts) % 3 else 8, waiting=6 if s.ts >= 2 else 0,
                usage=0.85, lengths=(800 * s.ts, 16 * s.ts, 2 * s.ts)) for s in _queue(set())]
    top = _top(diagnose(prepare(h)))
    assert fits(top)["kv_full"] == "unknown" and fits(top)["token_budget"] == "unknown"
    assert top.id == "requests_waiting" and top.suggestions == ()


@pytest.mark.parametrize(("budget", "budget_fit"), [(256, "fits"), (400, "ruled_out"), (None, "fits")])
def test_a_known_budget_is_judged_against_the_prompts_and_an_unknown_one_by_elimination(
        budget: int | None, budget_fit: str) -> None:
    """400-token prompts, running at most 4 of a known cap of 8: a 256-token budget splits them (fits), a
    400-token one holds them (ruled out: the prompt mean equal to the budget still fits in one step);
    unknown, the seats ruled out leave the budget by elimination."""
    top = _top(diagnose(prepare(_queue(set()), max_num_seqs=8, max_num_batched_tokens=budget)))
    assert fits(top)["seat_cap"] == "ruled_out" and fits(top)["token_budget"] == budget_fit
    assert ("by elimination" in _because(top, "token_budget")) is (budget is None)


@pytest.mark.parametrize(("budget", "expected"), [(42, "queue_token_budget"), (43, "requests_waiting")])
def test_steps_averaging_three_quarters_of_a_known_budget_fit(budget: int, expected: str) -> None:
    """Steps of 32 tokens each (every one producing tokens: the scheduled-tokens reading of a later vLLM):
    32 / 42 = 0.76 of the budget fits, 32 / 43 = 0.74 does not; the suggested budget is twice the current
    one (no prompt lengths, 3 running: 2 × 42 = 84 over the 4 the p95-and-decodes rule would give)."""
    h = [scrape(float(t), gen=10 * t, running=1 + t % 3, waiting=6 if t >= 2 else 0, usage=0.2,
                step_counts=[0, 0, 0, 50 * t] + [0] * 10, step_sum=32.0 * 50 * t) for t in range(12)]
    top = _top(diagnose(prepare(h, max_num_seqs=8, max_num_batched_tokens=budget)))
    assert top.id == expected
    if expected == "queue_token_budget":
        assert top.suggestions[0].value == 2 * budget


def test_a_differential_says_unknown_causes_apart_from_the_ruled_out() -> None:
    diff = differential("waiting", [Ruling("seat_cap", "fits", "a"), Ruling("kv_full", "unknown", "KV 85 %")])
    assert "Not the KV cache: KV 85 %." not in diff.checks()
    assert "Not checked here, the KV cache: KV 85 %." in diff.checks()


def test_ttft_queued_with_the_waiting_gauge_at_zero_names_the_seats_without_a_value() -> None:
    """Queue time 0.6 s a request against 0.2 s of prefill while the waiting gauge read 0 and 8 ran at
    every scrape: the seat cap (held at 8), and how many more is unknown — not the current cap as a value."""
    h = [scrape(float(t), gen=100 * t, running=8, waiting=0, usage=0.3, ttft_counts=[0, 20 * t, 0],
                queue_seconds=(12 * t, 20 * t), prefill_seconds=(4 * t, 20 * t), step_counts=[0, 50 * t] + [0] * 12,
                step_sum=400.0 * t) for t in range(10)]
    (f,) = [f for f in diagnose(prepare(h, budgets=Budgets(ttft_ms=500))) if f.id.startswith("ttft")]
    assert f.id == "ttft_queue_dominated" and f.evidence["cause"] == "seat_cap"
    assert [(s.flag, s.value) for s in f.suggestions] == [("--max-num-seqs", None)]


def test_queue_rules_step_aside_when_the_kv_cache_is_what_holds_admission() -> None:
    h = [scrape(float(t), gen=100 * t, running=4, waiting=6, usage=0.3, preempt=2 * t) for t in range(12)]
    ids = {f.id for f in diagnose(prepare(h))}
    assert "kv_pressure" in ids and not {"queue_at_cap", "queue_token_budget", "requests_waiting"} & ids


def test_give_ups_on_a_timeout_shorter_than_an_answer_withhold_max_num_seqs() -> None:
    """Non-streaming 1,200-token answers against a 1.5 s client timeout on a server with 128 seats: every
    answer given up, nothing waited; the seats are ruled out and no flag is given."""
    fs = findings("alt_gave_up_timeout_h3")
    top = next(f for f in fs if f.severity != "info")
    assert top.id == "clients_gave_up" and top.evidence["cause"] == "client_timeout" and top.suggestions == ()
    assert fits(top)["seat_cap"] == "ruled_out" and ("--max-num-seqs", "increase") not in advice(fs)
    # The clients' own record: every request ended by their timeout (labels.json, what the load generator saw).
    clients = BY_NAME_LABELS["alt_gave_up_timeout_h3"]["clients"]
    assert clients["ok"] == 0 and clients["by_status"] == {"-1": clients["requests"]}


def test_a_budget_inside_the_first_itl_bucket_is_said_not_judged() -> None:
    fs = findings("alt_slow_decode_small_batch_h8")
    (said,) = [f for f in fs if f.id == "itl_budget_below_buckets"]
    assert said.severity == "info" and "4 ms budget sits inside vLLM's first ITL bucket" in said.title
    assert not [f for f in fs if f.severity != "info"]


def test_every_symptom_has_two_held_out_alternatives_recorded() -> None:
    """Issue 41: for every symptom of the table, at least two real recordings labelled with a cause (or
    none) and the alternatives to rule out, each the top finding of a symptom the table lists."""
    by_finding = {f: s.id for s in SYMPTOMS.values() for f in s.findings}
    per_symptom: dict[str, list[str]] = {s: [] for s in SYMPTOMS}
    for name, label in BY_NAME_LABELS.items():
        expect = label["expect"]
        if "cause" in expect or "ruled_out" in expect:
            per_symptom[by_finding[expect["top"]]].append(name)
            assert expect.get("cause") is None or SYMPTOMS[by_finding[expect["top"]]].cause(expect["cause"])
    assert {s: len(names) for s, names in per_symptom.items() if len(names) < 2} == {}


# -- the third set of alternatives (heldout/RECIPES.md 25-34): each beside a recording of the usual cause ---


def _clients(name: str) -> dict:  # type: ignore[type-arg]
    return BY_NAME_LABELS[name]["clients"]


def test_give_ups_behind_the_token_budget_raise_it_not_the_seats_and_give_ups_at_the_cap_raise_the_seats() -> None:
    fs = findings("alt_gave_up_token_budget_h3")
    top = _top(fs)
    assert top.id == "clients_gave_up" and top.evidence["cause"] == "token_budget"
    assert top.suggestions[0].flag == "--max-num-batched-tokens" and ("--max-num-seqs", "increase") not in advice(fs)
    # The recording's own gauges: at most 2 ran (of vLLM's default seats) while requests waited, and the
    # clients saw their own timeouts (status -1), not refusals.
    assert _peak_running("alt_gave_up_token_budget_h3") <= 2 and fits(top)["seat_cap"] == "ruled_out"
    timed_out = _clients("alt_gave_up_token_budget_h3")["by_status"].get("-1", 0)
    assert abs(top.evidence["gave_up"] - timed_out) <= 1  # the server's count against the clients' own (32)
    # With the budget the server ran typed in (16), the prompts of about 1,000 tokens exceed it: named by it.
    case = BY_NAME["alt_gave_up_token_budget_h3"]
    known = _top(diagnose(prepare(case.scrapes, info=case.info,
                                  max_num_batched_tokens=_flag("alt_gave_up_token_budget_h3",
                                                               "--max-num-batched-tokens"))))
    assert known.evidence["cause"] == "token_budget" and "against the --max-num-batched-tokens budget of 16" in (
        _because(known, "token_budget"))
    assert fits(_top(findings("alt_gave_up_timeout_h3")))["token_budget"] == "ruled_out"
    at_cap = _top(findings("gave_up_streaming_cap2"))
    assert at_cap.id == "clients_gave_up" and at_cap.evidence["cause"] == "seat_cap"
    assert (at_cap.suggestions[0].flag, at_cap.suggestions[0].direction) == ("--max-num-seqs", "increase")


@pytest.mark.parametrize(("name", "pin"), [("alt_preempt_blocks_h8", "--num-gpu-blocks-override"),
                                           ("alt_preempt_kvbytes_h3", "--kv-cache-memory-bytes")])
def test_preemptions_in_a_pinned_cache_raise_the_pin_and_without_a_pin_the_utilization(name: str, pin: str) -> None:
    """The recipes pin the cache (heldout/RECIPES.md 27, 28): the pin is raised, never the utilization it
    overrides. The same recording with the pin's label taken out of vllm:cache_config_info (what a GPU
    server whose utilization sized the cache exports) names the utilization instead."""
    import dataclasses

    case = BY_NAME[name]
    snaps = [s.snapshot for s in case.scrapes if s.snapshot is not None]
    assert (snaps[-1].value("num_preemptions") or 0) > (snaps[0].value("num_preemptions") or 0)  # it preempted
    fs = findings(name)
    top = _top(fs)
    assert top.id == "kv_pressure" and top.evidence["cause"] == "kv_pinned" and top.suggestions[0].flag == pin
    assert ("--gpu-memory-utilization", "increase") not in advice(fs) and fits(top)["kv_small"] == "ruled_out"

    def unpinned(s: Scrape) -> Scrape:
        if s.snapshot is None or s.snapshot.cache_config is None:
            return s
        config = dataclasses.replace(s.snapshot.cache_config, num_gpu_blocks_override=None, kv_cache_memory_bytes=None)
        return dataclasses.replace(s, snapshot=dataclasses.replace(s.snapshot, cache_config=config))

    sized = _top(diagnose(prepare([unpinned(s) for s in case.scrapes], info=case.info)))
    assert sized.id == "kv_pressure" and sized.evidence["cause"] == "kv_small"
    assert (sized.suggestions[0].flag, sized.suggestions[0].direction) == ("--gpu-memory-utilization", "increase")


@pytest.mark.parametrize("name", ["alt_failed_queued_reqs_wide", "alt_failed_queued_tokens_h3"])
def test_503s_shed_by_a_queue_limit_are_load_shed_not_failures(name: str) -> None:
    fs = findings(name)
    top = _top(fs)
    assert top.id == "admission_rejected" and top.evidence["cause"] == "admission_limit"
    assert fits(top)["engine_error"] == "ruled_out" and "requests_failed" not in [f.id for f in fs]
    # The clients' own record: every failure a 503 (labels.json, what the load generator saw), as many as
    # the finding counts.
    assert top.evidence["admission_rejections_total"] == _clients(name)["by_status"]["503"]
    # Never the cap the server already had as the "new" value (4, the recipe's): more than it, or none.
    (seats,) = [x for x in top.suggestions if x.flag == "--max-num-seqs"]
    cap = _flag(name, "--max-num-seqs")
    assert seats.direction == "increase" and (seats.value is None or seats.value > cap)
    waited = max((x.snapshot.value("num_requests_waiting") or 0) for x in BY_NAME[name].scrapes if x.snapshot)
    if waited:
        assert seats.value == cap + waited  # the cap plus the most waiting at a scrape, read from the gauges
    dead = _top(findings("failed_engine_dead_kept_alive"))
    assert dead.id == "requests_failed" and dead.evidence["cause"] == "server_error"
    assert fits(dead)["admission_limit"] == "ruled_out"


def test_slow_decode_with_one_running_withholds_fewer_sequences_and_a_growing_batch_gets_them() -> None:
    fs = findings("alt_slow_decode_one_wide")
    top = _top(fs)
    assert top.id == "slow_decode" and top.evidence["cause"] == "slow_steps"
    assert _peak_running("alt_slow_decode_one_wide") == 1 and fits(top)["batch_size"] == "ruled_out"
    assert "--max-num-seqs" not in [s.flag for f in fs for s in f.suggestions]
    waves = _top(findings("slow_decode_waves"))
    assert waves.evidence["cause"] == "batch_size"
    assert (waves.suggestions[0].flag, waves.suggestions[0].direction) == ("--max-num-seqs", "decrease")


@pytest.mark.parametrize("name", ["alt_ttft_long_prompts_h3", "alt_ttft_long_prompts_wide"])
def test_ttft_from_long_prompts_computed_whole_withholds_the_token_budget(name: str) -> None:
    """700 / 800-word prompts (a token a word) at vLLM's default budget: TTFT is prefill, the prompts are
    long, and no --max-num-batched-tokens change is given (the budget is not known: not checked, never
    assumed). test_rules covers the given side: prompts over a known budget raise it."""
    fs = findings(name)
    top = _top(fs)
    assert top.id == "ttft_prefill_dominated" and top.evidence["cause"] == "long_prompts" and top.suggestions == ()
    assert ("--max-num-batched-tokens", "increase") not in advice(fs)
    prompt = histogram_delta(list(BY_NAME[name].scrapes), "request_prompt_tokens")
    assert prompt is not None and prompt.sum / prompt.count >= 700
    assert fits(top)["preemption"] == "ruled_out" and fits(top)["token_budget"] == "unknown"
    # With vLLM's CPU default typed in (2,048: recipe 25), the prompts fit it whole and the budget is ruled out.
    case = BY_NAME[name]
    known = _top(diagnose(prepare(case.scrapes, info=case.info, budgets=case.budgets, max_num_batched_tokens=2048)))
    assert known.evidence["cause"] == "long_prompts" and fits(known)["token_budget"] == "ruled_out"


def test_a_co_tenant_at_the_same_request_rate_is_a_change_no_rule_explains() -> None:
    """Two processes spinning on the host from 20 s in (heldout/RECIPES.md 33): more requests running only
    because each stayed longer, at the request rate of before: not more load, cause not identified."""
    fs = findings("alt_change_noisy_neighbour_h3")
    top = _top(fs)
    assert top.id == "unexplained_change" and top.evidence["cause"] is None and top.suggestions == ()
    assert fits(top) == {"more_load": "ruled_out", "prefix_cache_misses": "ruled_out", "preemption": "ruled_out",
                         "queueing": "ruled_out"}
    assert "each request stayed longer" in _because(top, "more_load")
    e = top.evidence
    assert e["requests_started_per_second_after"] < 1.5 * e["requests_started_per_second_before"]
    assert e["mean_num_requests_running_after"] >= 1.5 * e["mean_num_requests_running_before"]
