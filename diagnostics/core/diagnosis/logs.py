"""Startup-log parsing: vLLM's exact error strings (every version) and the facts its log states.

Matches on message bodies, never on the log-record prefix (it changed at 0.11 and 0.31).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace
from typing import Any

# (kind, pattern): the first group names are read into LogError.numbers.
ERROR_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "kv_too_small",
        re.compile(
            r"max seq len \((?P<max_model_len>\d+)\).*?\((?P<needed_gib>[\d.]+) GiB KV cache is needed.*?"
            r"available KV cache memory \((?P<available_gib>[\d.]+) GiB\)"
            r"(?:.*?estimated maximum model length is (?P<estimated_max_model_len>\d+))?"
        ),
    ),
    (
        "kv_too_small",
        re.compile(
            r"max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number of tokens that can be "
            r"stored in KV cache \((?P<estimated_max_model_len>\d+)\)"
        ),
    ),
    (
        "no_kv_memory",
        re.compile(
            r"No available memory for the cache blocks|"
            # CPU backend, 0.32: "... on kv cache allocation is less than requested memory for kv (-0.54/0.01 GiB)"
            r"on kv cache allocation is less than requested memory for kv \((?P<kv_available_gib>-?[\d.]+)/"
        ),
    ),
    ("autofit_impossible", re.compile(r"Cannot auto-fit max_model_len")),
    (
        "free_memory_low",
        re.compile(
            r"(?:Free|Available) memory on (?:device|node)[^(]*\((?P<free_gib>[\d.]+)/(?P<total_gib>[\d.]+) GiB\) "
            r"on startup is less than desired (?:GPU|CPU) memory utilization \((?P<utilization>[\d.]+)"
        ),
    ),
    ("profiling_changed", re.compile(r"Error in memory profiling")),
    ("oom_model_load", re.compile(r"Failed to load model - not enough GPU memory")),
    ("oom_sampler", re.compile(r"out of memory occurred when warming up (?:sampler|pooler) with (?P<num_reqs>\d+)")),
    ("cuda_oom", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError")),
    ("engine_dead", re.compile(r"EngineDeadError|Engine core initialization failed")),
    # A server that will not start for a reason outside memory: vLLM's own validation messages
    # (vllm/config/model.py, scheduler.py; engine/arg_utils.py), the entrypoint's socket, the Hub and
    # transformers' refusals, and the GPU-only failures quoted from vLLM's and torch's source.
    ("max_model_len_too_long", re.compile(
        r"User-specified max_model_len \((?P<max_model_len>\d+)\) is greater than the derived max_model_len "
        r"\((?P<max_len_key>\w+)=(?P<derived_max_model_len>\d+)")),
    ("batched_below_max_model_len", re.compile(
        r"max_num_batched_tokens \((?P<max_num_batched_tokens>\d+)\) is smaller than max_model_len "
        r"\((?P<max_model_len>\d+)\)")),
    ("batched_below_max_num_seqs", re.compile(
        r"max_num_batched_tokens \((?P<max_num_batched_tokens>\d+)\) must be greater than or equal to "
        r"max_num_seqs \((?P<max_num_seqs>\d+)\)")),
    ("tp_attention_heads", re.compile(
        r"Total number of attention heads \((?P<num_attention_heads>\d+)\) must be divisible by tensor "
        r"parallel size \((?P<tensor_parallel_size>\d+)\)")),
    # vllm/distributed/utils.py ensure_divisibility, from QKVParallelLinear's divide(tp, kv_heads) or
    # divide(kv_heads, tp): kept only when one side is the server's --tensor-parallel-size.
    ("tp_kv_heads", re.compile(r"AssertionError: (?P<numerator>\d+) is not divisible by (?P<denominator>\d+)")),
    # vllm/platforms/cuda.py (and rocm.py), interface.py, v1/worker/utils.py: no attention kernel takes this
    # block size / dtype / head size.
    ("attention_unsupported", re.compile(
        r"No valid attention backend found for \S+ with .*?Reasons: (?P<reasons>\{.*\})|"
        r"Selected backend \S+ is not valid for this configuration\. Reason: (?P<reason>.*)|"
        r"Aligned KV cache block size (?P<block_size>\d+) is not supported by attention backend|"
        # vllm/v1/worker/utils.py select_common_block_size: no kernel block size divides --block-size.
        r"No common block size for (?P<kv_block_size>\d+) \((?P<kernel_block_sizes>.*)\)")),
    ("dtype_unsupported", re.compile(
        r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0|"
        r"Unknown dtype: (?P<dtype>\S+)|does not support float16\. Reason")),
    # argparse (engine/arg_utils.py builds every flag from the config's types: a Literal is a choice).
    ("invalid_argument", re.compile(
        r"error: argument (?P<flag>--[\w-]+)[^:]*: (?P<problem>.+)|error: unrecognized arguments: (?P<unknown>\S+)")),
    ("port_in_use", re.compile(r"\[Errno (?:98|48|10048)\].*?[Aa]ddress already in use")),
    # huggingface_hub/utils/_http.py and transformers/utils/hub.py.
    ("model_gated", re.compile(
        r"GatedRepoError:|Cannot access gated repo|You are trying to access a gated repo|401 Client Error")),
    ("model_not_found", re.compile(
        r"is not a local folder and is not a valid model identifier|Repository Not Found for url|"
        r"Invalid repository ID or local directory specified|We couldn't connect to 'https://huggingface\.co'|"
        r"LocalEntryNotFoundError:|does not appear to have a file named config\.json|"
        r"Cannot find an appropriate cached snapshot folder|HFValidationError: Repo id must be")),
    # vllm/transformers_utils/config.py; transformers/dynamic_module_utils.py (the backticked forms are
    # messages; the engine's config line says trust_remote_code=True without them).
    ("trust_remote_code", re.compile(
        r"`trust_remote_code=True`|requires you to execute the configuration file|"
        r"contains custom code which must be executed")),
    # vllm/distributed/device_communicators/pynccl*.py; torch's ProcessGroupNCCL (DistBackendError).
    ("nccl", re.compile(
        r"NCCL error|nccl(?:System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument|Remote)Error|"
        r"DistBackendError|Failed to load NCCL library|failed to load the NCCL library")),
)

# Lines that say why an engine died while serving (first occurrence of each is kept, in log order).
CAUSE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("engine_exited", re.compile(r"engine core exited unexpectedly|Engine core proc \S+ died unexpectedly",
                                 re.IGNORECASE)),
    ("host_oom_killed", re.compile(r"Out of memory: Killed process|oom-kill|oom_reaper|^\s*Killed\s*$")),
    # Python's faulthandler (PYTHONFAULTHANDLER=1) names the signal a native kernel died of.
    ("native_crash", re.compile(r"Fatal Python error: (?P<signal>Illegal instruction|Segmentation fault|Bus error|"
                                r"Aborted|Floating[- ]point exception)")),
    ("cuda_oom", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError")),
    ("nccl", re.compile(r"NCCL (?:error|WARN|timeout)|ProcessGroupNCCL|Watchdog caught collective operation timeout",
                        re.IGNORECASE)),
    ("rpc_timeout", re.compile(r"RPC call to \S+ timed out|execute_model.*timed out|TimeoutError", re.IGNORECASE)),
    ("engine_exception", re.compile(r"\(EngineCore[^)]*\)\s+(?:ERROR|CRITICAL)\b.*?\b(?:[A-Z]\w*Error|Exception)\b")),
    ("engine_dead", re.compile(r"EngineDeadError")),
)
# A stop someone asked for, in vLLM's own words: the API server's signal handler (SIGINT / SIGTERM;
# vllm/entrypoints/launchers/launcher.py serve_http: "[shutdown] API server: shutdown triggered") and
# the EngineCore process's (vllm/v1/engine/core.py run_engine_core: "[shutdown] EngineCore: trigger
# received signal=%s"). A killed engine logs neither: its API server notices the process gone
# ("[shutdown] MPClient: engine core exited unexpectedly", core_client.py) and raises EngineDeadError.
STOP_REQUESTED = re.compile(r"\[shutdown\] API server: shutdown triggered|"
                            r"\[shutdown\] EngineCore: trigger received signal=(?P<signal>[A-Z]+)")
# vllm/v1/engine/core.py _handle_shutdown: the requests the stop aborted (or drained), when the engine
# lives to say so; with vLLM 0.32's default --shutdown-timeout 0 its process manager force-kills it at
# once (vllm/v1/utils.py), and each stream in flight ends in the API server's EngineDeadError
# traceback (vllm/entrypoints/openai/completion/serving.py's "Error in completion stream generator").
_IN_FLIGHT = re.compile(r"\[shutdown\] EngineCore: (?P<how>aborting|draining) in-flight requests count=(?P<count>\d+)")
_STREAM_CUT = re.compile(r"\[serving\.py:\d+\].*\bEngineDeadError\b")
_SERVING = re.compile(r"Application startup complete|Starting vLLM (?:API )?server|Uvicorn running on")
_STARTED = re.compile(r"Application startup complete")
# Where a server's start begins (its banner's version line, the non-default args it echoes): a log of a
# restarted container (``docker logs``) holds several, and only the last start's errors say whether it
# can start now.
_ATTEMPT = re.compile(r"non-default args: \{|vLLM (?:API )?server version \d|\sversion \d+\.\d+\.\d+\S*\s*$")

# The kinds of a failed start outside the memory family: they only count in a log whose server never
# came up (vLLM raises each at startup; none is logged by a server that then serves).
FAILED_START_KINDS = frozenset({
    "max_model_len_too_long", "batched_below_max_model_len", "batched_below_max_num_seqs", "tp_attention_heads",
    "tp_kv_heads", "attention_unsupported", "dtype_unsupported", "invalid_argument", "port_in_use", "model_gated",
    "model_not_found", "trust_remote_code", "nccl", "cuda_graph_oom", "startup_failed",
})

# How a line's message body is found: vLLM's record prefix ("(EngineCore pid=3) ERROR 11-29 22:24:10
# [core.py:1510] "; older versions without the process tag), or none for what Python printed itself.
_PREFIX = re.compile(r"^(?:\(\w+(?: pid=\d+)?\)\s+)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
                     r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[^\]\s]*\]\s?)?")
_LEVEL_ERROR = re.compile(r"^(?:\(\w+(?: pid=\d+)?\)\s+)?(?:ERROR|CRITICAL)\s+\d\d-\d\d ")
# The last line of a traceback: the exception's (dotted) name, then its message.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<name>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<text>.*))?$")
_USAGE_ERROR = re.compile(r"^[\w.\- ]+: error: ")
_EXITED = re.compile(r"\bexited\b|\bdied\b|failed to start", re.IGNORECASE)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
# Exceptions that only carry another's failure: the root cause is the exception they point back to.
_WRAPPERS = re.compile(r"EngineDeadError|Engine core initialization failed|EngineCore failed to start|"
                       r"KeyboardInterrupt|SystemExit|See root cause above")
_PYDANTIC = re.compile(r"(?P<count>\d+) validation errors? for \w+")
_FIELD = re.compile(r"^(?P<field>[a-z_][a-z0-9_]*)$")
# Pydantic ends a message with its error type and the whole input ("[type=value_error, input_value=
# ArgsKwargs((), {...every field...})"): the message is what comes before it.
_PYDANTIC_TAIL = re.compile(r"\s*\[type=\w+.*$")
# The exceptions vLLM's config validation raises: ValueError from its checks (a __post_init__, a
# model_validator, the model loader's and tokenizer registry's lookups), pydantic's ValidationError
# around a dataclass's.
_VALIDATION = frozenset({"ValueError", "ValidationError"})
# A config field a message names: snake_case (``long_prefill_token_threshold (4096)``,
# ``tokenizer_mode='bogus'``) or the flag itself (``--runner generate``).
_NAMED_FIELD = re.compile(r"(?<![\w-])(?:--)?(?P<name>[a-z][a-z0-9]*(?:[_-][a-z0-9]+)+)(?![\w-])")
# What vLLM accepts, as a rejected value's message states it: argparse's choices ("(choose from 'fcfs',
# 'priority')") and vLLM's lists ("Must be one of [...]", ModelConfig._verify_quantization); an argparse
# type ("invalid int value"); or a bound, pydantic's Field(gt=, ge=, lt=, le=) ("Input should be less than
# or equal to 1") and vLLM's own ("cannot be greater than the max_model_len (2048)", "must be a positive
# integer", vllm/config/scheduler.py, model.py).
_CHOICES = re.compile(r"\(choose from (?P<choices>.+)\)|[Mm]ust be one of (?P<one_of>\[.*?\])")
_TYPE = re.compile(r"invalid (?P<type>\w+) value")
_BOUND = re.compile(
    r"(?:should|must) be (?P<op>greater|less) than(?P<equal> or equal to)? (?:the )?(?:[a-z_]+ )?"
    r"\(?(?P<limit>-?\d+(?:\.\d+)?)\)?|"
    r"cannot be (?P<not_op>greater|larger|less|smaller) than (?:the )?(?:[a-z_]+ )?\(?(?P<not_limit>-?\d+(?:\.\d+)?)\)?|"
    r"must be a positive (?:integer|number)")
# CUDA-graph capture in progress (vllm/v1/worker/gpu_model_runner.py: the progress bar and the frames),
# and its end ("Graph capturing finished in %.0f secs, took %.2f GiB").
_CAPTURING = re.compile(r"Capturing CUDA graphs|in capture_model|in _capture_cudagraphs|in profile_cudagraph_memory|"
                        r"in _warmup_and_capture")
_CAPTURED = re.compile(r"Graph capturing finished")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LOG_TIME = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")

_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_VERSION = re.compile(r"(?:vLLM (?:API )?server version|version) (\d+\.\d+\.\d+[\w.+-]*)")
_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


@dataclass(frozen=True, slots=True)
class LogError:
    kind: str
    line_no: int
    text: str  # the line as the log has it, control characters written out (it is the server's text)
    numbers: dict[str, float] = field(default_factory=dict)
    words: dict[str, str] = field(default_factory=dict)  # the message's non-numeric parts (a flag, a reason)


@dataclass(frozen=True, slots=True)
class LogFacts:
    """What a log says: errors (first occurrence of each kind), stated facts, and — when the engine
    died after the server had started serving — the lines that say why."""

    errors: tuple[LogError, ...]
    version: str | None
    non_default_args: dict[str, Any]
    available_kv_gib: float | None
    kv_cache_tokens: int | None
    max_concurrency: float | None
    serving_line: int | None = None  # where the server said it was up (None: it never got there)
    causes: tuple[LogError, ...] = ()  # the lines that matter about a death, in log order
    num_lines: int = 0  # lines with something on them
    started_line: int | None = None  # "Application startup complete" (None: the log never says it)
    stop_lines: tuple[LogError, ...] = ()  # a stop asked for (a signal), and the requests it cut, in log order

    def first(self, kind: str) -> LogError | None:
        return next((e for e in self.errors if e.kind == kind), None)

    def stopped_on_request(self) -> LogError | None:
        """The line where a server that had come up was asked to stop (a signal), when that came
        before any sign of a death: a clean shutdown, whatever the shutdown itself then logs (its
        engine process exiting, the requests in flight aborted with EngineDeadError)."""
        up = self.started_line  # "Application startup complete": a stop before it stopped a start
        if up is None or self.serving_line is None:
            return None
        stop = next((c for c in self.stop_lines if c.kind == "stop_requested" and c.line_no >= up), None)
        if stop is None:
            return None
        first_death = next((c for c in self.causes if c.line_no >= self.serving_line), None)
        return stop if first_death is None or stop.line_no < first_death.line_no else None

    def died_serving(self) -> LogError | None:
        """The engine-death line, when it comes after the server started serving and was not asked to
        stop first (:meth:`stopped_on_request`)."""
        dead = next((c for c in self.causes if c.kind == "engine_dead"), None)
        if dead is None or self.serving_line is None or dead.line_no < self.serving_line:
            return None
        return None if self.stopped_on_request() is not None else dead

    def death_lines(self) -> tuple[LogError, ...]:
        """The lines that matter about a death while serving (after the server came up)."""
        if self.died_serving() is None or self.serving_line is None:
            return ()
        return tuple(c for c in self.causes if c.line_no >= self.serving_line)


def log_time(line: str) -> str | None:
    """The ``MM-DD hh:mm:ss`` stamp of a vLLM log line, as written (local time, no year)."""
    m = _LOG_TIME.search(line)
    return m.group(1) if m else None


def _args(text: str) -> dict[str, Any]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


def inert(line: str) -> str:
    """A log line with its control characters (terminal escapes, carriage returns) written out as
    ``\\xNN``: the line is the server's text, shown as it is but never interpreted."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)


def quote(line: str, limit: int = 600) -> str:
    """A line as a finding quotes it: inert, and its head kept (the message starts there; a pydantic
    error ends with the whole input dump)."""
    text = inert(line.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _body(line: str) -> str:
    return _PREFIX.sub("", line, count=1).strip()


def _numbers_and_words(groups: dict[str, str | None]) -> tuple[dict[str, float], dict[str, str]]:
    numbers, words = {}, {}
    for key, value in groups.items():
        if value is None:
            continue
        try:
            numbers[key] = float(value)
        except ValueError:
            words[key] = inert(value)
    return numbers, words


def accepts(problem: str) -> tuple[dict[str, float], dict[str, str]]:
    """What vLLM accepts, as a rejected value's message states it: ``accepted`` its own words (the
    choices, the type, the bound), ``constraint`` which of the three; for a bound, ``change`` the way
    past it (increase / decrease) and ``limit`` the bound when a value at it is accepted (``greater than
    or equal to 1``, ``cannot be greater than ... (2048)``; a strict bound gives none: the next value
    depends on the flag's type). Nothing when the message states none."""
    message = _PYDANTIC_TAIL.sub("", problem)
    if m := _CHOICES.search(message):
        return {}, {"accepted": inert(m.group("choices") or m.group("one_of")), "constraint": "choices"}
    if m := _TYPE.search(message):
        return {}, {"accepted": inert(m.group("type")), "constraint": "type"}
    if (m := _BOUND.search(message)) is None:
        return {}, {}
    words = {"accepted": inert(m.group(0).rstrip(".")), "constraint": "bound"}
    if m.group("op"):
        words["change"] = "increase" if m.group("op") == "greater" else "decrease"
        return ({"limit": float(m.group("limit"))} if m.group("equal") else {}), words
    if m.group("not_op"):
        words["change"] = "decrease" if m.group("not_op") in ("greater", "larger") else "increase"
        return {"limit": float(m.group("not_limit"))}, words
    return {}, {**words, "change": "increase"}  # positive


def _pydantic_field(lines: list[str], args: dict[str, Any]) -> LogError | None:
    """A pydantic ValidationError on config fields (``block_size`` / ``Input should be greater than
    0``): the field is the flag, the next line the problem (and what it accepts). Of several, the one
    the server was given: ``--max-num-seqs 0`` is also reported on the max_num_batched_tokens vLLM
    derived from it, listed first."""
    for i, line in enumerate(lines):
        if not (m := _PYDANTIC.search(line)):
            continue
        count = int(m.group("count"))
        rest = [(j, _body(lines[j])) for j in range(i + 1, min(i + 1 + 3 * count, len(lines))) if _body(lines[j])]
        pairs = [(f.group("field"), rest[k + 1]) for k in range(len(rest) - 1) if (f := _FIELD.match(rest[k][1]))]
        if not pairs:
            continue
        name, (line_no, problem) = next((p for p in pairs if p[0] in args), pairs[0])
        numbers, words = accepts(problem)
        return LogError("invalid_argument", line_no + 1, quote(f"{name}: {problem}"), numbers,
                        {"flag": "--" + name.replace("_", "-"), "problem": inert(problem), **words})
    return None


def _named_arg(message: str, args: dict[str, Any]) -> tuple[str, str] | None:
    """The echoed non-default arg a validation message names, and how: by its field (the first the
    message names), else — the only one — by its value, a word of its own in the message (``Load
    format `bogus` is not supported``; a string with a letter in it: a number or a switch would match
    any count or flag in the text). None: the message names none of them, and no flag is guessed."""
    for m in _NAMED_FIELD.finditer(message):
        if (key := m.group("name").replace("-", "_")) in args:
            return key, "field"
    by_value = [key for key, value in args.items()
                if isinstance(value, str) and re.search(r"[A-Za-z]", value)
                and re.search(rf"(?<![\w./-]){re.escape(value)}(?![\w/-]|\.\w)", message)]
    return (by_value[0], "value") if len(by_value) == 1 else None


def _rejected_value(failure: LogError, lines: list[str], args: dict[str, Any]) -> LogError | None:
    """A failed start whose exception is a validation error naming one of the server's own args (by
    field or by value): that arg's flag, with what the message says it accepts. The quoted line is
    the failure's."""
    if failure.words.get("exception") not in _VALIDATION:
        return None
    body = _body(lines[failure.line_no - 1])
    m = _EXCEPTION.match(body)
    message = (m.group("text") or "") if m else body
    if _PYDANTIC.search(message):
        # Pydantic says the message on the next line (a model_validator's "Value error, ...").
        message = next((b for x in lines[failure.line_no:failure.line_no + 2] if (b := _body(x))), "")
    message = _PYDANTIC_TAIL.sub("", message)
    named = _named_arg(message, args)
    if named is None:
        return None
    key, how = named
    numbers, words = accepts(message)
    return replace(failure, kind="invalid_argument", numbers=numbers,
                   words={"flag": "--" + key.replace("_", "-"), "problem": inert(message), "named_by": how,
                          "value": inert(str(args[key])), "exception": failure.words["exception"], **words})


def failure_line(lines: list[str]) -> LogError | None:
    """The line that says why a start failed, whatever the error: the last exception raised that is
    not a wrapper pointing back at another (with the first, the root cause, when they differ), else
    argparse's usage error, an ERROR record, a process that exited, or a bare traceback header (a log
    cut inside it). None: no sign of failure."""
    found: dict[str, tuple[int, str]] = {}
    for line_no, line in enumerate(lines, start=1):
        rest = _PREFIX.sub("", line, count=1)
        body = rest.strip()
        if not body or _WRAPPERS.search(body):
            continue
        m = _EXCEPTION.match(body)
        if m:
            # The last exception raised is the one said to the user (a chained traceback ends with it);
            # the first is kept as the root cause.
            found.setdefault("root", (line_no, m.group("name")))
            found["exception"] = (line_no, m.group("name"))
        elif _USAGE_ERROR.match(body):
            found.setdefault("usage", (line_no, ""))
        elif _TRACEBACK.match(body):
            found.setdefault("traceback", (line_no, ""))
        elif _LEVEL_ERROR.match(line) and not rest.startswith((" ", "\t")):  # not a traceback's frame
            found.setdefault("error", (line_no, ""))
        elif _EXITED.search(body):
            found.setdefault("exited", (line_no, ""))
    for signal in ("exception", "usage", "error", "exited", "traceback"):
        if signal in found:
            line_no, name = found[signal]
            text = lines[line_no - 1].strip()
            if signal == "exception" and _PYDANTIC.search(text):
                # The message is on the next lines: quote the field and its problem with it.
                more = [_body(x) for x in lines[line_no:line_no + 2] if _body(x)]
                text = " / ".join([text, *more])
            words = {"signal": signal, **({"exception": name} if signal == "exception" else {})}
            root_no, _ = found.get("root", (line_no, ""))
            if signal == "exception" and root_no != line_no:
                words["root_cause"] = quote(lines[root_no - 1])
                words["root_cause_line"] = str(root_no)
            return LogError("startup_failed", line_no, quote(text), {}, words)
    return None


def _kv_heads(error: LogError, args: dict[str, Any]) -> LogError | None:
    """``N is not divisible by M`` is the KV-head split only when one side is --tensor-parallel-size
    (QKVParallelLinear divides tp by the KV heads, or the KV heads by tp)."""
    tp = args.get("tensor_parallel_size")
    a, b = int(error.numbers["numerator"]), int(error.numbers["denominator"])
    if not isinstance(tp, int) or tp < 2 or tp not in (a, b):
        return None
    kv = b if a == tp else a
    return replace(error, numbers={"tensor_parallel_size": float(tp), "num_key_value_heads": float(kv)})


def _failed_start(errors: dict[str, LogError], lines: list[str], args: dict[str, Any],
                  started: int | None) -> dict[str, LogError]:
    """The errors of a failed start outside the memory family, resolved: dropped in a log whose
    server came up; a KV-head split only with the server's TP size; an OOM during CUDA-graph capture
    named so; a gated repo is not also "not found"; a rejected flag with what vLLM accepts (argparse's,
    a pydantic field's, a validation error naming an echoed arg); and, when no known error explains
    the failure, the line that does (``startup_failed``)."""
    if started is not None:
        # The (last) start came up: no startup error stands, the memory family's included (an OOM logged
        # after "Application startup complete" is a runtime one, a death the died-serving finding reads).
        return {k: e for k, e in errors.items() if k == "engine_dead"}
    if "tp_kv_heads" in errors:
        resolved = _kv_heads(errors.pop("tp_kv_heads"), args)
        if resolved is not None:
            errors["tp_kv_heads"] = resolved
    oom = errors.get("cuda_oom")
    if oom is not None:
        capture = next((i for i in range(oom.line_no - 1, 0, -1) if _CAPTURING.search(lines[i - 1])
                        or _CAPTURED.search(lines[i - 1])), None)
        if capture is not None and _CAPTURING.search(lines[capture - 1]):
            errors["cuda_graph_oom"] = replace(errors.pop("cuda_oom"), kind="cuda_graph_oom")
    if "model_gated" in errors:
        errors.pop("model_not_found", None)
    if (usage := errors.get("invalid_argument")) is not None and "problem" in usage.words:
        numbers, words = accepts(usage.words["problem"])
        errors["invalid_argument"] = replace(usage, numbers={**usage.numbers, **numbers},
                                             words={**usage.words, **words})
    known = set(errors) - {"engine_dead"}
    if not known and (field_error := _pydantic_field(lines, args)) is not None:
        errors["invalid_argument"] = field_error
    elif not known and (failure := failure_line(lines)) is not None:
        if "engine_dead" not in errors or "exception" in failure.words:
            errors.pop("engine_dead", None)
            rejected = _rejected_value(failure, lines, args)
            errors[rejected.kind if rejected else failure.kind] = rejected or failure
    return errors


def parse_log(text: str) -> LogFacts:
    errors: dict[str, LogError] = {}
    version = None
    args: dict[str, Any] = {}
    available = tokens = concurrency = None
    causes: dict[str, LogError] = {}
    stops: list[LogError] = []
    serving: int | None = None
    started: int | None = None
    lines = text.splitlines()
    for line_no, line in enumerate(lines, start=1):
        if _ATTEMPT.search(line) and (started is not None or errors):
            # A new start after an earlier one came up or failed: only this one's errors and args count.
            errors, args, started = {}, {}, None
        if serving is None and _SERVING.search(line):
            serving = line_no
        if started is None and _STARTED.search(line):
            started = line_no
        for kind, pattern in CAUSE_PATTERNS:
            if kind not in causes and (m := pattern.search(line)) is not None:
                numbers, words = _numbers_and_words(m.groupdict())
                causes[kind] = LogError(kind, line_no, inert(line.strip())[-400:], numbers, words)
        for kind, pattern in (("stop_requested", STOP_REQUESTED), ("in_flight", _IN_FLIGHT), ("stream_cut", _STREAM_CUT)):
            if (m := pattern.search(line)) is not None:
                numbers, words = _numbers_and_words(m.groupdict())
                stops.append(LogError(kind, line_no, inert(line.strip())[-400:], numbers, words))
        for kind, pattern in ERROR_PATTERNS:
            if kind in errors:
                continue
            m = pattern.search(line)
            if m:
                numbers, words = _numbers_and_words(m.groupdict())
                errors[kind] = LogError(kind, line_no, quote(line), numbers, words)
        if version is None and (m := _VERSION.search(line)):
            version = m.group(1)
        if not args and (m := _NON_DEFAULT.search(line)):
            args = _args(m.group(1))
        if m := _AVAILABLE.search(line):
            available = float(m.group(1))
        if m := _KV_TOKENS.search(line):
            tokens = int(m.group(1).replace(",", ""))
        if m := _CONCURRENCY.search(line):
            concurrency = float(m.group(2))
    errors = _failed_start(errors, lines, args, started)
    # A generic OOM or engine death is only worth its own line when nothing more specific matched.
    specific = [e for k, e in errors.items() if k not in ("cuda_oom", "engine_dead")]
    ordered = specific or list(errors.values())
    if specific and "cuda_oom" in errors and not any(e.kind.startswith("oom_") for e in specific):
        ordered.append(errors["cuda_oom"])
    facts = LogFacts(tuple(sorted(ordered, key=lambda e: e.line_no)), version, args, available, tokens, concurrency,
                     serving, tuple(sorted(causes.values(), key=lambda e: e.line_no)),
                     sum(1 for line in lines if line.strip()), started, tuple(stops))
    if facts.died_serving() is not None or facts.stopped_on_request() is not None:
        # A death after startup is the runtime-death finding's, not a startup error; the EngineDeadError
        # of the requests a requested stop cut is neither.
        facts = replace(facts, errors=tuple(e for e in facts.errors if e.kind not in ("engine_dead", "cuda_oom")))
    return facts
