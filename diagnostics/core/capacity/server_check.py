"""The capacity arithmetic checked against what a running server reports (cache_config_info,
/v1/models), each difference explained."""

from __future__ import annotations

from dataclasses import dataclass

from diagnostics.core.metrics.catalog import CacheConfig
from diagnostics.core.metrics.info import ServerInfo


@dataclass(frozen=True, slots=True)
class CheckLine:
    level: str  # success | warning | info
    text: str


def check_server(config: CacheConfig, info: ServerInfo | None) -> list[CheckLine]:
    out: list[CheckLine] = []
    blocks, block_size = config.num_gpu_blocks, config.block_size
    if not blocks or not block_size:
        return [CheckLine("info", "This server does not report num_gpu_blocks and block_size.")]
    tokens = blocks * block_size
    reported = config.kv_cache_size_tokens
    if config.num_gpu_blocks_override:
        out.append(CheckLine("info", f"num_gpu_blocks = {blocks:,} was set with --num-gpu-blocks-override, "
                                     "not derived from memory."))
    if reported is None:
        out.append(CheckLine("info", f"num_gpu_blocks × block_size = {blocks:,} × {block_size} = {tokens:,} tokens "
                                     "(this vLLM version does not report kv_cache_size_tokens; 0.24+ does)."))
    elif reported == tokens:
        out.append(CheckLine("success", f"num_gpu_blocks × block_size = {blocks:,} × {block_size} = {tokens:,} tokens "
                                        f"= the server's kv_cache_size_tokens."))
    else:
        out.append(CheckLine("warning", f"num_gpu_blocks × block_size = {tokens:,} tokens, but the server reports "
                                        f"kv_cache_size_tokens = {reported:,}: vLLM computes it as max concurrency × "
                                        "max_model_len, group by group, so hybrid and sliding-window models differ."))
    out.append(CheckLine("info", f"Usable: {(blocks - 1) * block_size:,} tokens; block 0 is the null block, which "
                                 "vLLM excludes from kv_cache_usage_perc too."))
    if config.kv_cache_memory_bytes:
        per_token = config.kv_cache_memory_bytes / tokens
        out.append(CheckLine("info", f"kv_cache_memory_bytes ÷ tokens = {config.kv_cache_memory_bytes:,} ÷ {tokens:,} "
                                     f"= {per_token:,.0f} bytes per token (compare with the calculator above for "
                                     "this model: 2 × layers × KV heads per GPU × head dim × dtype bytes)."))
    max_model_len = info.max_model_len if info else None
    if max_model_len:
        concurrency = tokens / max_model_len
        line = f"{tokens:,} tokens ÷ max_model_len {max_model_len:,} = {concurrency:,.2f} full-length requests at once"
        if config.kv_cache_max_concurrency is not None:
            line += f" (server: kv_cache_max_concurrency = {config.kv_cache_max_concurrency:g})"
        out.append(CheckLine("success" if concurrency >= 1 else "warning", line + "."))
    return out
