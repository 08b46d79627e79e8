"""A server that did not start: the errors its startup log states, each with the flag changes
vLLM's message points to."""

from __future__ import annotations

from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.rules.memory import more_kv_capacity
from diagnostics.core.diagnosis.types import Finding, Suggestion

STARTUP_ERRORS: dict[str, tuple[str, str]] = {
    "kv_too_small": ("KV cache too small for --max-model-len: the server cannot start", "kv-too-small-for-context"),
    "no_kv_memory": ("No memory left for the KV cache: the server cannot start", "wont-start"),
    "autofit_impossible": ("Not enough memory to auto-fit any context length", "wont-start"),
    "free_memory_low": ("Less free device memory than --gpu-memory-utilization asks for", "wont-start"),
    "profiling_changed": ("GPU memory changed during profiling (another process on the GPU)", "wont-start"),
    "oom_model_load": ("Out of memory while loading the weights", "wont-start"),
    "oom_sampler": ("Out of memory warming up the sampler", "wont-start"),
    "cuda_oom": ("CUDA out of memory", "wont-start"),
    "engine_dead": ("Engine core died at startup", "down"),
}
"""Per error kind the log parser knows: the finding's title and the knob-table row it rests on
(the rule table stamps it on the finding)."""


def startup_log(ctx: Context) -> list[Finding]:
    """The errors a startup log states, each with the flag changes vLLM's message points to."""
    if ctx.log is None:
        return []
    t, log = ctx.thresholds, ctx.log
    findings = []
    for error in log.errors:
        title, _ = STARTUP_ERRORS[error.kind]
        n = error.numbers
        more = more_kv_capacity(ctx.flags, t)
        up = [more] if more is not None else []
        suggestions: list[Suggestion]
        if error.kind == "kv_too_small":
            estimated = int(n["estimated_max_model_len"]) if "estimated_max_model_len" in n else None
            suggestions = [
                Suggestion("--max-model-len", "decrease", estimated,
                           f"vLLM estimates {estimated:,} tokens fit in the KV memory it has." if estimated
                           else "A shorter context needs fewer KV blocks per request."),
                *up,
                Suggestion("--kv-cache-dtype", "set", "fp8", "Twice the tokens in the same KV memory."),
            ]
        elif error.kind in ("no_kv_memory", "autofit_impossible"):
            suggestions = [*up, Suggestion("--quantization", "set", None, "Smaller weights leave room for KV."),
                           Suggestion("--tensor-parallel-size", "increase", None, "Spread the weights over GPUs.")]
        elif error.kind == "free_memory_low":
            free, total = n.get("free_gib"), n.get("total_gib")
            value = round(max(t.min_gpu_memory_utilization, free / total - t.free_memory_margin_perc), 2) \
                if free and total else None
            suggestions = [Suggestion("--gpu-memory-utilization", "decrease", value,
                                      f"Only {free} of {total} GiB is free on the device (another process holds "
                                      "the rest)." if free else "Ask for no more than is free.")]
        elif error.kind == "oom_model_load":
            suggestions = [
                Suggestion("--gpu-memory-utilization", "decrease", None, "vLLM: free memory for the weights."),
                Suggestion("--tensor-parallel-size", "increase", None, "Each GPU holds a slice of the weights."),
                Suggestion("--quantization", "set", None, "Smaller weights."),
            ]
        elif error.kind == "oom_sampler":
            reqs = int(n.get("num_reqs", 0)) or None
            fewer = int(reqs * t.sampler_oom_seqs_share) if reqs else None
            suggestions = [Suggestion("--max-num-seqs", "decrease", fewer,
                                      "The sampler warm-up runs max-num-seqs dummy requests."),
                           Suggestion("--gpu-memory-utilization", "decrease", None, "Leave activation headroom.")]
        elif error.kind == "cuda_oom":
            suggestions = [*up, Suggestion("--quantization", "set", None,
                                           f"If it still does not fit at ~{t.max_gpu_memory_utilization:g}."),
                           Suggestion("--tensor-parallel-size", "increase", None, "Or spread the model.")]
        else:
            suggestions = []
        findings.append(Finding(
            id=f"startup_{error.kind}", severity="critical", title=title,
            evidence={"log_line": error.line_no, "message": error.text, **{k: v for k, v in n.items()},
                      **({"vllm_version": log.version} if log.version else {})},
            suggestions=tuple(suggestions),
            checks=("Apply one change at a time and re-read the startup log's 'KV cache size' line.",),
        ))
    return findings
