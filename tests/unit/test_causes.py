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
from diagnostics.core.metrics.derive import histogram_delta
from tests.fixtures.incidents.corpus import HELDOUT, Case, cases

ROOT = Path(__file__).resolve().parents[2]
BY_NAME = {c.name: c for c in (*cases(), *cases(HELDOUT))}


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


@pytest.mark.parametrize("name", ["alt_queue_token_budget_h8", "alt_queue_token_budget_wide"])
def test_a_queue_held_by_the_token_budget_withholds_max_num_seqs(name: str) -> None:
    fs = findings(name)
    assert ("--max-num-seqs", "increase") not in advice(fs)
    top = next(f for f in fs if f.severity != "info")
    assert top.id == "queue_token_budget" and top.suggestions[0].flag == "--max-num-batched-tokens"
    assert fits(top)["token_budget"] == "fits" and fits(top)["kv_full"] == "ruled_out"
    # The seats: running never above its own peak (2 here, against caps of 8 and 16 the server had).
    assert _peak_running(name) == 2
    assert "head_of_line_blocking" not in [f.id for f in fs]


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
    assert fits(top)["seat_cap"] == "fits" and fits(top)["token_budget"] == "ruled_out"


def test_ttft_over_budget_from_a_token_budget_queue_withholds_max_num_seqs() -> None:
    """A 1 s TTFT budget on the token-budget queue: the TTFT finding follows the same cause."""
    fs = findings("alt_queue_token_budget_h8", Budgets(ttft_ms=1000))
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
    assert fits(top)["prefix_cache_misses"] in ("ruled_out", "unknown")



# -- the what-if on a token-budget queue ---------------------------------------------------------------------


def test_the_what_if_does_not_price_a_budget_it_cannot_read_from_the_window() -> None:
    """vLLM 0.32's iteration_tokens counts a prompt in the step that finishes it: on the token-budget
    queue most steps read 0 tokens, so the largest observation (a whole prompt) is no budget. With the
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
