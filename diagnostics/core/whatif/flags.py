"""The flags a replay runs under: which ones the simulated engine models, and how a change
(``--max-num-seqs 16``) becomes a block budget or a scheduler limit. Any other flag is "not
modelled", never guessed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from diagnostics.core.diagnosis.types import KnownFlags
from diagnostics.core.whatif.calibrate import Calibration

# --max-num-seqs … as the suggestions and the CLI spell them → the EngineConfig field they set.
MODELLED = {
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--num-gpu-blocks-override": "num_gpu_blocks",
    "--kv-cache-memory-bytes": "num_gpu_blocks",
    "--gpu-memory-utilization": "num_gpu_blocks",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--block-size": "block_size",
    "--kv-cache-dtype": "num_gpu_blocks",
    "--max-model-len": "max_model_len",
}


class NotModelled(ValueError):
    """A flag the simulator does not model, or a value it cannot apply to this server."""


@dataclass(frozen=True, slots=True)
class Flags:
    """The scheduler and cache flags a replay runs under."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_size: int
    enable_prefix_caching: bool
    max_model_len: int


def apply(flags: Flags, calibration: Calibration, changes: Mapping[str, str | float | int | bool]) -> Flags:
    """``flags`` with ``changes`` (``{"--max-num-seqs": 16}``) applied; :class:`NotModelled` for a flag
    the simulator does not model or a value it cannot turn into a block budget here."""
    out = flags
    for flag, raw in changes.items():
        if flag not in MODELLED:
            raise NotModelled(f"{flag} is not modelled by the simulated engine (it models: "
                              f"{', '.join(sorted(MODELLED))})")
        value = str(raw)
        try:
            if flag == "--max-num-seqs":
                out = replace(out, max_num_seqs=int(float(value)))
            elif flag == "--max-num-batched-tokens":
                out = replace(out, max_num_batched_tokens=int(float(value)))
            elif flag == "--max-model-len":
                out = replace(out, max_model_len=int(float(value)))
            elif flag == "--num-gpu-blocks-override":
                out = replace(out, num_gpu_blocks=int(float(value)))
            elif flag == "--block-size":
                size = int(float(value))
                out = replace(out, block_size=size, num_gpu_blocks=max(1, out.num_gpu_blocks * out.block_size // size))
            elif flag == "--kv-cache-memory-bytes":
                if not calibration.kv_cache_memory_bytes:
                    raise NotModelled("--kv-cache-memory-bytes: the server's current KV size in bytes is unknown "
                                      "(cache_config_info has no kv_cache_memory_bytes), so blocks per byte are too")
                per_block = calibration.kv_cache_memory_bytes / calibration.num_gpu_blocks
                out = replace(out, num_gpu_blocks=max(1, int(float(value) / per_block)))
            elif flag == "--gpu-memory-utilization":
                now = calibration.gpu_memory_utilization
                if not now or calibration.kv_cache_memory_bytes:
                    raise NotModelled("--gpu-memory-utilization: the KV cache is pinned by --kv-cache-memory-bytes "
                                      "(vLLM ignores the utilization for its size)" if calibration.kv_cache_memory_bytes
                                      else "--gpu-memory-utilization: the current utilization is unknown")
                # The weights' share of the device is unknown here: scaling the blocks with the whole
                # budget understates the gain (the weights do not grow), so this is a lower bound.
                out = replace(out, num_gpu_blocks=max(1, int(out.num_gpu_blocks * float(value) / now)))
            elif flag == "--kv-cache-dtype":
                if value.startswith("fp8") and (calibration.cache_dtype or "auto") in ("auto", "bfloat16", "float16"):
                    out = replace(out, num_gpu_blocks=out.num_gpu_blocks * 2)
                elif not value.startswith("fp8"):
                    raise NotModelled(f"--kv-cache-dtype {value}: only fp8 (half the bytes per token) is modelled")
            elif flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
                on = value.lower() not in ("false", "0", "no", "off") and flag == "--enable-prefix-caching"
                out = replace(out, enable_prefix_caching=on)
        except ValueError as exc:
            if isinstance(exc, NotModelled):
                raise
            raise NotModelled(f"{flag} {value}: not a number") from exc
    return out


def current_flags(calibration: Calibration, known: KnownFlags) -> Flags:
    """The flags the baseline replay runs under: what the server said about itself, vLLM's defaults
    (0.32, V1) for the rest; the KV cache as the window's ``cache_config_info`` showed it."""
    return Flags(
        max_num_seqs=int(known.max_num_seqs or 256),  # unknown: vLLM's default
        max_num_batched_tokens=int(known.max_num_batched_tokens or 8192),
        num_gpu_blocks=calibration.num_gpu_blocks,
        block_size=calibration.block_size,
        enable_prefix_caching=calibration.enable_prefix_caching,
        max_model_len=int(known.max_model_len or 1 << 20),
    )
