"""The `vllm serve` command line before and after a finding's suggested changes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diagnostics.core.diagnosis.types import KnownFlags, Suggestion


@dataclass(frozen=True, slots=True)
class CommandDiff:
    before: str
    after: str


# The known flags a `vllm serve` line spells with a value, in the order the line shows them.
_VALUED_FLAGS = (
    ("--max-model-len", "max_model_len"),
    ("--max-num-seqs", "max_num_seqs"),
    ("--max-num-batched-tokens", "max_num_batched_tokens"),
    ("--gpu-memory-utilization", "gpu_memory_utilization"),
    ("--kv-cache-dtype", "cache_dtype"),
    ("--num-gpu-blocks-override", "num_gpu_blocks_override"),
    ("--kv-cache-memory-bytes", "kv_cache_memory_bytes"),
    ("--tensor-parallel-size", "tensor_parallel_size"),
)
# Switches: "set" is the flag alone, without a value.
_SWITCHES = ("--trust-remote-code", "--enforce-eager", "--enable-chunked-prefill")


def command_diff(flags: KnownFlags, suggestions: Sequence[Suggestion]) -> CommandDiff:
    """The `vllm serve` line before and after the suggested changes (unknown values shown as <…>)."""
    current: dict[str, str | None] = {}
    for flag, attr in _VALUED_FLAGS:
        value = getattr(flags, attr)
        if value is not None and value != "auto":
            current[flag] = f"{value:g}" if isinstance(value, float) else str(value)
    if flags.enable_prefix_caching is False:
        current["--no-enable-prefix-caching"] = None
    after = dict(current)
    model_after = flags.model or "<model>"
    for s in suggestions:
        if s.flag == "--model":  # the positional model of `vllm serve`
            model_after = str(s.value) if s.value is not None else "<a model that exists>"
            continue
        if s.flag in _SWITCHES:
            after[s.flag] = None
            continue
        if s.flag == "--enable-prefix-caching":
            after.pop("--no-enable-prefix-caching", None)
            after["--enable-prefix-caching"] = None
            continue
        if s.value is not None:
            after[s.flag] = f"{s.value:g}" if isinstance(s.value, float) else str(s.value)
        else:
            old = current.get(s.flag)
            arrow = {"increase": "↑", "decrease": "↓", "set": ""}[s.direction]
            after[s.flag] = f"<{old}{arrow}>" if old else f"<{'value' if s.direction == 'set' else arrow}>"

    def line(model: str, args: dict[str, str | None]) -> str:
        parts = [f"vllm serve {model}"]
        parts += [k if v is None else f"{k} {v}" for k, v in args.items()]
        return " ".join(parts)

    return CommandDiff(line(flags.model or "<model>", current), line(model_after, after))
