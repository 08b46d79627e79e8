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
)

# Lines that say why an engine died while serving (first occurrence of each is kept, in log order).
CAUSE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("engine_exited", re.compile(r"engine core exited unexpectedly|Engine core proc \S+ died unexpectedly",
                                 re.IGNORECASE)),
    ("host_oom_killed", re.compile(r"Out of memory: Killed process|oom-kill|oom_reaper|^\s*Killed\s*$")),
    ("cuda_oom", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError")),
    ("nccl", re.compile(r"NCCL (?:error|WARN|timeout)|ProcessGroupNCCL|Watchdog caught collective operation timeout",
                        re.IGNORECASE)),
    ("rpc_timeout", re.compile(r"RPC call to \S+ timed out|execute_model.*timed out|TimeoutError", re.IGNORECASE)),
    ("engine_exception", re.compile(r"\(EngineCore[^)]*\)\s+(?:ERROR|CRITICAL)\b.*?\b(?:[A-Z]\w*Error|Exception)\b")),
    ("engine_dead", re.compile(r"EngineDeadError")),
)
_SERVING = re.compile(r"Application startup complete|Starting vLLM (?:API )?server|Uvicorn running on")
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
    text: str
    numbers: dict[str, float] = field(default_factory=dict)


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

    def first(self, kind: str) -> LogError | None:
        return next((e for e in self.errors if e.kind == kind), None)

    def died_serving(self) -> LogError | None:
        """The engine-death line, when it comes after the server started serving."""
        dead = next((c for c in self.causes if c.kind == "engine_dead"), None)
        if dead is None or self.serving_line is None or dead.line_no < self.serving_line:
            return None
        return dead

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


def parse_log(text: str) -> LogFacts:
    errors: dict[str, LogError] = {}
    version = None
    args: dict[str, Any] = {}
    available = tokens = concurrency = None
    causes: dict[str, LogError] = {}
    serving: int | None = None
    for line_no, line in enumerate(text.splitlines(), start=1):
        if serving is None and _SERVING.search(line):
            serving = line_no
        for kind, pattern in CAUSE_PATTERNS:
            if kind not in causes and pattern.search(line):
                causes[kind] = LogError(kind, line_no, line.strip()[-400:])
        for kind, pattern in ERROR_PATTERNS:
            if kind in errors:
                continue
            m = pattern.search(line)
            if m:
                numbers = {k: float(v) for k, v in m.groupdict().items() if v is not None}
                errors[kind] = LogError(kind, line_no, line.strip()[-600:], numbers)
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
    # A generic OOM or engine death is only worth its own line when nothing more specific matched.
    specific = [e for k, e in errors.items() if k not in ("cuda_oom", "engine_dead")]
    ordered = specific or list(errors.values())
    if specific and "cuda_oom" in errors and not any(e.kind.startswith("oom_") for e in specific):
        ordered.append(errors["cuda_oom"])
    facts = LogFacts(tuple(sorted(ordered, key=lambda e: e.line_no)), version, args, available, tokens, concurrency,
                     serving, tuple(sorted(causes.values(), key=lambda e: e.line_no)))
    if facts.died_serving() is not None:
        # A death after startup is the runtime-death finding's, not a startup error.
        facts = replace(facts, errors=tuple(e for e in facts.errors if e.kind not in ("engine_dead", "cuda_oom")))
    return facts
