"""The `vllm serve` command line before and after a finding's suggested changes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diagnostics.core.diagnosis.types import KnownFlags, Suggestion


@dataclass(frozen=True, slots=True)
class CommandDiff:
    before: str
    after: str


def command_diff(flags: KnownFlags, suggestions: Sequence[Suggestion]) -> CommandDiff:
    """The `vllm serve` line before and after the suggested changes (unknown values shown as <…>)."""
    current: dict[str, str | None] = {}
    if flags.max_model_len:
        current["--max-model-len"] = str(flags.max_model_len)
    if flags.max_num_seqs:
        current["--max-num-seqs"] = str(flags.max_num_seqs)
    if flags.max_num_batched_tokens:
        current["--max-num-batched-tokens"] = str(flags.max_num_batched_tokens)
    if flags.gpu_memory_utilization is not None:
        current["--gpu-memory-utilization"] = f"{flags.gpu_memory_utilization:g}"
    if flags.cache_dtype and flags.cache_dtype != "auto":
        current["--kv-cache-dtype"] = flags.cache_dtype
    if flags.num_gpu_blocks_override:
        current["--num-gpu-blocks-override"] = str(flags.num_gpu_blocks_override)
    if flags.kv_cache_memory_bytes:
        current["--kv-cache-memory-bytes"] = str(flags.kv_cache_memory_bytes)
    if flags.tensor_parallel_size:
        current["--tensor-parallel-size"] = str(flags.tensor_parallel_size)
    if flags.enable_prefix_caching is False:
        current["--no-enable-prefix-caching"] = None
    after = dict(current)
    for s in suggestions:
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

    def line(args: dict[str, str | None]) -> str:
        parts = [f"vllm serve {flags.model or '<model>'}"]
        parts += [k if v is None else f"{k} {v}" for k, v in args.items()]
        return " ".join(parts)

    return CommandDiff(line(current), line(after))
