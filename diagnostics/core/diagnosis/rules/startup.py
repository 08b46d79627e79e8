"""A server that did not start: the errors its startup log states, each with the flag changes
vLLM's message points to."""

from __future__ import annotations

from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.logs import LogError, LogFacts, inert
from diagnostics.core.diagnosis.rules.memory import more_kv_capacity
from diagnostics.core.diagnosis.types import Direction, Finding, Suggestion

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
        if error.kind not in STARTUP_ERRORS:
            continue  # a failed start outside memory: failed_start's
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
            fits = free / total - t.free_memory_margin_perc if free and total else None
            if fits is not None and total and fits < t.min_gpu_memory_utilization:
                # Even the lowest utilization worth serving with asks for more than is free: a value would
                # fail again, so none is given and the memory has to be freed first.
                suggestions = [Suggestion("--gpu-memory-utilization", "decrease", None,
                                          f"Only {free} of {total} GiB is free on the device: even "
                                          f"{t.min_gpu_memory_utilization:g} would ask for "
                                          f"{t.min_gpu_memory_utilization * total:.2f} GiB. Free the device first "
                                          "(another process holds the rest: nvidia-smi), or start on another one.")]
            else:
                value = round(fits, 2) if fits is not None else None
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


FAILED_START: dict[str, tuple[str, str]] = {
    "max_model_len_too_long": ("--max-model-len is longer than the model supports: the server cannot start",
                               "startup-rejected-flag"),
    "batched_below_max_model_len": ("--max-num-batched-tokens is below --max-model-len with chunked prefill off: "
                                    "the server cannot start", "startup-rejected-flag"),
    "batched_below_max_num_seqs": ("--max-num-batched-tokens is below --max-num-seqs: the server cannot start",
                                   "startup-rejected-flag"),
    "tp_attention_heads": ("--tensor-parallel-size does not divide the model's attention heads: the server cannot "
                           "start", "startup-rejected-flag"),
    "tp_kv_heads": ("--tensor-parallel-size does not divide the model's KV heads: the server cannot start",
                    "startup-rejected-flag"),
    "attention_unsupported": ("No attention kernel supports this configuration: the server cannot start",
                              "startup-rejected-flag"),
    "dtype_unsupported": ("The device does not support the model's dtype: the server cannot start",
                          "startup-rejected-flag"),
    "invalid_argument": ("vLLM rejected a flag's value: the server cannot start", "startup-rejected-flag"),
    "port_in_use": ("The port is already in use: the server cannot start", "startup-port"),
    "model_gated": ("The model repo is gated or private: the server cannot start", "startup-model"),
    "model_not_found": ("The model was not found: the server cannot start", "startup-model"),
    "trust_remote_code": ("The model needs its own code (--trust-remote-code): the server cannot start",
                          "startup-model"),
    "nccl": ("NCCL failed to initialise: the server cannot start", "startup-nccl"),
    "cuda_graph_oom": ("Out of memory while capturing CUDA graphs: the server cannot start", "startup-cudagraph"),
    "startup_failed": ("The server exited before it came up", "startup-failed"),
}
"""The failed starts outside the memory family: per error kind, the finding's title and its knob-table row."""

LOG_ONLY: dict[str, tuple[str, str]] = {
    "startup_log_empty": ("The startup log is empty: nothing says whether the server started", "startup-failed"),
    "startup_not_confirmed": ("The startup log ends before the server said it was up, and shows no error",
                              "startup-failed"),
}
"""What a log says when it shows no failure and no start: an empty log, or one cut before
"Application startup complete" (only without a good scrape: a server that answers is up)."""


def finding_id(kind: str) -> str:
    """``startup_<kind>``; the generic kind is already named so (``startup_failed``)."""
    return kind if kind.startswith("startup_") else f"startup_{kind}"


def _largest_divisor(n: int, below: int) -> int:
    return max(d for d in range(1, max(below, 2)) if n % d == 0)


def _attention(error: LogError) -> list[Suggestion]:
    """The flag a reason names (vllm/v1/attention/backend.py validate_configuration's reasons)."""
    w = error.words
    reasons = w.get("reasons", "") + w.get("reason", "")
    if "kv_block_size" in error.numbers:
        return [Suggestion("--block-size", "set", None, f"The attention kernels take block sizes "
                           f"{w.get('kernel_block_sizes', '')}; leave --block-size unset for the backend's default.")]
    if "block_size" in error.numbers or "block_size not supported" in reasons:
        return [Suggestion("--block-size", "set", None, "No attention kernel takes this block size; leave "
                           "--block-size unset for the backend's default.")]
    if "kv_cache_dtype not supported" in reasons:
        return [Suggestion("--kv-cache-dtype", "set", "auto", "No attention kernel takes this KV-cache dtype.")]
    if "dtype not supported" in reasons:
        return [Suggestion("--dtype", "set", None, "No attention kernel takes this dtype.")]
    return []


def _rejected_flag(error: LogError) -> Suggestion:
    """The flag vLLM rejected, changed to what its message says it accepts: past the bound it states
    (to the bound, when a value at it is accepted), else set to one of its choices or a value of its
    type (no value: which one is the user's to pick)."""
    n, w = error.numbers, error.words
    flag = w.get("flag") or w.get("unknown") or "--help"
    accepted, constraint = w.get("accepted"), w.get("constraint")
    if constraint == "choices":
        why = f"vLLM takes one of {accepted}."
    elif constraint == "type":
        why = f"vLLM takes a value of type {accepted} ({w.get('problem')})."
    elif constraint == "bound":
        why = f"vLLM: {flag} {accepted}."
    else:
        why = f"vLLM: {w.get('problem', 'unrecognized argument')}"
    change = w.get("change")
    direction: Direction = "increase" if change == "increase" else "decrease" if change == "decrease" else "set"
    limit = n.get("limit")
    value = None if limit is None else int(limit) if limit.is_integer() else limit
    return Suggestion(flag, direction, value, why)


def _failed_start_suggestions(error: LogError, log: LogFacts) -> list[Suggestion]:
    n, w, args = error.numbers, error.words, log.non_default_args
    kind = error.kind
    if kind == "max_model_len_too_long":
        derived = int(n["derived_max_model_len"])
        return [Suggestion("--max-model-len", "decrease", derived,
                           f"The model's config.json says {w.get('max_len_key', 'its maximum')}={derived:,}.")]
    if kind == "batched_below_max_model_len":
        batched, length = int(n["max_num_batched_tokens"]), int(n["max_model_len"])
        return [Suggestion("--max-num-batched-tokens", "increase", length,
                           "Without chunked prefill a step must hold a whole prompt of --max-model-len tokens."),
                Suggestion("--enable-chunked-prefill", "set", None, "Prompts longer than a step are split."),
                Suggestion("--max-model-len", "decrease", batched, "A context that fits in one step.")]
    if kind == "batched_below_max_num_seqs":
        batched, seqs = int(n["max_num_batched_tokens"]), int(n["max_num_seqs"])
        return [Suggestion("--max-num-batched-tokens", "increase", seqs,
                           "Every running sequence needs at least one token of a step."),
                Suggestion("--max-num-seqs", "decrease", batched, "No more sequences than tokens in a step.")]
    if kind == "tp_attention_heads":
        heads, tp = int(n["num_attention_heads"]), int(n["tensor_parallel_size"])
        return [Suggestion("--tensor-parallel-size", "decrease", _largest_divisor(heads, tp),
                           f"Each GPU takes an equal share of the {heads} attention heads.")]
    if kind == "tp_kv_heads":
        kv, tp = int(n["num_key_value_heads"]), int(n["tensor_parallel_size"])
        fits = max(d for d in range(1, tp) if kv % d == 0 or d % kv == 0)
        return [Suggestion("--tensor-parallel-size", "decrease", fits,
                           f"The {kv} KV heads are split across GPUs, or each replicated on a whole number of them.")]
    if kind == "attention_unsupported":
        return _attention(error)
    if kind == "dtype_unsupported":
        half = "Bfloat16 is only supported" in error.text
        return [Suggestion("--dtype", "set", "half" if half else None,
                           "vLLM: use float16 on a GPU older than compute capability 8.0." if half
                           else "A dtype the device and the model support.")]
    if kind == "invalid_argument":
        return [_rejected_flag(error)]
    if kind == "port_in_use":
        port = args.get("port")
        return [Suggestion("--port", "set", None,
                           f"Another process listens on {'port ' + inert(str(port)) if port else 'the port'}: stop it, or "
                           "serve on a free port.")]
    if kind == "model_gated":
        return [Suggestion("--hf-token", "set", None, "Accept the model's terms on huggingface.co, then pass a token "
                           "with access (--hf-token, or HF_TOKEN in the environment).")]
    if kind == "model_not_found":
        model = args.get("model")
        return [Suggestion("--model", "set", None,
                           f"{model!r} is neither a local directory nor a model on the Hub this host can reach "
                           "(HF_HUB_OFFLINE, a typo, a private repo without a token)." if model else
                           "A local directory or a Hub repo id that exists.")]
    if kind == "trust_remote_code":
        return [Suggestion("--trust-remote-code", "set", None,
                           "The model's config names code shipped in its repo; allow it only for a repo you trust.")]
    if kind == "cuda_graph_oom":
        return [Suggestion("--gpu-memory-utilization", "decrease", None,
                           "Leave room for the CUDA graphs captured after the KV cache is allocated."),
                Suggestion("--max-cudagraph-capture-size", "decrease", None, "Fewer, smaller graphs."),
                Suggestion("--enforce-eager", "set", None, "No CUDA graphs at all (slower decode).")]
    return []


_FAILED_CHECKS = {
    "max_model_len_too_long": ("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides the check only for a model with RoPE "
                               "scaling for the longer context; otherwise positions past it give NaNs or errors.",),
    "nccl": ("Run once with NCCL_DEBUG=INFO and read the first NCCL WARN line.",
             "In a container: --ipc=host or a larger /dev/shm; every GPU visible (CUDA_VISIBLE_DEVICES) to every rank.",
             "Peer-to-peer broken between these GPUs: NCCL_P2P_DISABLE=1 tells."),
    "startup_failed": ("No rule knows this error: read the quoted line and the traceback above it in the log.",),
}


def failed_start(ctx: Context) -> list[Finding]:
    """A server that did not start for a reason outside memory, each with the flag vLLM's message
    names; any other error that ended the start before "Application startup complete", quoted; and a
    log that shows neither a start nor a failure (only when no scrape answered)."""
    if ctx.log is None:
        return []
    log = ctx.log
    version = {"vllm_version": log.version} if log.version else {}
    findings = []
    for error in log.errors:
        if error.kind not in FAILED_START:
            continue
        title, _ = FAILED_START[error.kind]
        quoted = {k: v for k, v in error.words.items() if k not in ("signal",)}
        findings.append(Finding(
            id=finding_id(error.kind), severity="critical", title=title,
            evidence={"log_line": error.line_no, "message": error.text, **error.numbers, **quoted, **version},
            suggestions=tuple(_failed_start_suggestions(error, log)),
            checks=_FAILED_CHECKS.get(error.kind, ("Change the one flag named, then start again and read the log "
                                                   "to 'Application startup complete'.",)),
        ))
    if log.errors or log.started_line is not None or ctx.ok:
        return findings
    kind = "startup_log_empty" if not log.num_lines else "startup_not_confirmed"
    return [Finding(id=kind, severity="warning", title=LOG_ONLY[kind][0],
                    evidence={"log_lines": log.num_lines, **version},
                    checks=("Give the whole log, from the start to 'Application startup complete' or the error "
                            "that ended it.",))]
