"""The knob table: symptom → what to check → which `vllm serve` flag, in which direction.

Rows come from the product's seed documents ("Symptom to knob", the flag tables) and from vLLM's
own tuning docs (``docs/configuration/optimization.md``, ``conserving_memory.md``). Findings name
the rows they rest on, and the Diagnose page links each row to the findings that use it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KnobRow:
    id: str
    symptom: str
    check: str
    flags: tuple[str, ...]
    direction: str
    source: str


KNOB_TABLE: tuple[KnobRow, ...] = (
    KnobRow(
        "wont-start",
        "Won't start, or reports too little memory for cache",
        "--gpu-memory-utilization first; if it still doesn't fit at 100%, that's the memory-constrained case: "
        "quantize, add --tensor-parallel-size, or both",
        ("--gpu-memory-utilization", "--quantization", "--tensor-parallel-size"),
        "utilization ↑, then quantize / TP ↑",
        "seed: Symptom to knob",
    ),
    KnobRow(
        "kv-too-small-for-context",
        "KV cache too small for --max-model-len at startup",
        "The error names the largest context that fits: lower --max-model-len to it, or give the KV cache more "
        "memory (--gpu-memory-utilization, fp8 --kv-cache-dtype, --tensor-parallel-size)",
        ("--max-model-len", "--gpu-memory-utilization", "--kv-cache-dtype"),
        "max-model-len ↓ or KV memory ↑",
        "vLLM error text; conserving_memory.md",
    ),
    KnobRow(
        "startup-rejected-flag",
        "Won't start: vLLM's validation rejected a flag (context length, token budget, parallel size, block size, "
        "dtype)",
        "The message names the flag and the limit: set it within the limit (the model's maximum context, the "
        "batch's token budget, a tensor-parallel size that divides the heads, a block size or dtype a kernel takes)",
        ("--max-model-len", "--max-num-batched-tokens", "--max-num-seqs", "--tensor-parallel-size", "--block-size",
         "--dtype", "--kv-cache-dtype"),
        "as the message says",
        "vllm/config/model.py, scheduler.py, cache.py; vllm/engine/arg_utils.py; vllm/platforms/cuda.py",
    ),
    KnobRow(
        "startup-model",
        "Won't start: the model is not found, is gated, or needs its own code",
        "--model spelled as a local directory or a Hub repo id this host can reach (HF_HUB_OFFLINE); a gated repo "
        "needs a token with access; a custom architecture needs --trust-remote-code (only for a repo you trust)",
        ("--model", "--hf-token", "--trust-remote-code"),
        "set",
        "transformers/utils/hub.py; huggingface_hub errors; vllm/transformers_utils/config.py",
    ),
    KnobRow(
        "startup-port",
        "Won't start: the port is already in use",
        "Another process (often an earlier vllm serve) listens on --port: stop it, or serve on a free port",
        ("--port",),
        "another port",
        "vllm/entrypoints/launchers/launcher.py (create_server_socket binds before the engine starts)",
    ),
    KnobRow(
        "startup-cudagraph",
        "Won't start: out of memory while capturing CUDA graphs",
        "Leave room for the graphs (--gpu-memory-utilization ↓), capture fewer sizes (--max-cudagraph-capture-size "
        "↓), or none (--enforce-eager, slower decode)",
        ("--gpu-memory-utilization", "--max-cudagraph-capture-size", "--enforce-eager"),
        "utilization ↓ or fewer graphs",
        "vllm/v1/worker/gpu_model_runner.py (capture_model); vllm/v1/worker/gpu_worker.py",
    ),
    KnobRow(
        "startup-nccl",
        "Won't start: NCCL failed to initialise between the GPUs",
        "Not a tuning flag: NCCL_DEBUG=INFO for the first NCCL WARN; shared memory in containers (--ipc=host); "
        "the GPUs each rank sees; NCCL_P2P_DISABLE=1 when peer-to-peer is broken",
        (),
        "fix the environment",
        "vllm/distributed/device_communicators/pynccl.py, pynccl_wrapper.py",
    ),
    KnobRow(
        "startup-failed",
        "Won't start, with an error no rule knows (or a log that never says it started)",
        "Read the quoted line and the traceback above it; give the whole log, from the start to 'Application "
        "startup complete' or the error that ended it",
        (),
        "read the error",
        "the log",
    ),
    KnobRow(
        "decode-slow",
        "Decode slower than the latency budget",
        "--max-num-seqs against the defended batch size, then whether quantizing weights or --kv-cache-dtype is "
        "justified by measured numbers",
        ("--max-num-seqs", "--quantization", "--kv-cache-dtype"),
        "max-num-seqs ↓ to the defended size",
        "seed: Symptom to knob",
    ),
    KnobRow(
        "head-of-line",
        "One request stalls every other sequence's tokens",
        "Head-of-line blocking: check the chunked-prefill chunk size, not the batch size",
        ("--max-num-batched-tokens",),
        "chunk size ↓",
        "seed: Symptom to knob; optimization.md (“Smaller values (e.g., 2048) achieve better ITL”)",
    ),
    KnobRow(
        "sharing-wasted",
        "Memory looks wasted across parallel samples of the same prompt",
        "Block sharing: verify it's actually happening before touching batch size or memory utilization",
        ("--enable-prefix-caching",),
        "keep prefix caching on",
        "seed: Symptom to knob; automatic_prefix_caching.md",
    ),
    KnobRow(
        "preemption",
        "Frequent preemption (KV cache full, requests recomputed)",
        "More KV capacity (--gpu-memory-utilization when there is headroom, fp8 --kv-cache-dtype, "
        "--tensor-parallel-size, a shorter --max-model-len) or fewer concurrent sequences; never raise "
        "--max-num-seqs for this",
        ("--gpu-memory-utilization", "--kv-cache-dtype", "--tensor-parallel-size", "--max-num-seqs"),
        "KV capacity ↑ or max-num-seqs ↓",
        "optimization.md (Preemption)",
    ),
    KnobRow(
        "queue-at-cap",
        "Requests queue while the KV cache has room",
        "--max-num-seqs: too low → queuing; too high → memory pressure. Raise it when running sits at the cap "
        "and KV usage is low",
        ("--max-num-seqs",),
        "max-num-seqs ↑",
        "seed: the few flags that matter",
    ),
    KnobRow(
        "queue-token-budget",
        "Requests queue while running stays below --max-num-seqs and the KV cache has room",
        "The scheduler admits a waiting request only while the step's token budget lasts: when the engine's steps "
        "reach --max-num-batched-tokens (iteration_tokens) with seats free, raise the budget, not the seats",
        ("--max-num-batched-tokens",),
        "max-num-batched-tokens ↑",
        "vllm/v1/core/sched/scheduler.py (Scheduler.schedule: `while token_budget > 0`); optimization.md",
    ),
    KnobRow(
        "deferred",
        "Requests wait 'deferred' (LoRA slots, KV transfer) while the batch and KV cache have room",
        "--max-loras when the waiting adapters exceed it (each slot costs adapter memory); with disaggregated "
        "serving, the KV connector and the prefill side; never --max-num-seqs",
        ("--max-loras",),
        "max-loras ↑",
        "observable surface (num_requests_waiting_by_reason, lora_requests_info)",
    ),
    KnobRow(
        "admission",
        "Requests rejected with HTTP 503 by a queue limit",
        "Which limit (--max-num-queued-reqs / --max-num-queued-tokens) and why the queue filled: the batch cap "
        "(--max-num-seqs ↑), a full KV cache (more KV capacity), or the limit itself (↑ only if clients would "
        "rather wait)",
        ("--max-num-queued-reqs", "--max-num-queued-tokens", "--max-num-seqs"),
        "capacity ↑, or the limit ↑",
        "vllm/config/scheduler.py; observable surface (admission_rejections_total)",
    ),
    KnobRow(
        "spec-decode",
        "Speculative decoding accepts few draft tokens",
        "Fewer num_speculative_tokens (keep the positions accepted often), or speculation off when even the "
        "first draft token is mostly rejected: verify work then exceeds what it saves",
        ("--speculative-config",),
        "num_speculative_tokens ↓, or off",
        "docs: speculative decoding; observable surface (spec_decode_* counters)",
    ),
    KnobRow(
        "ttft-queue",
        "TTFT over budget, mostly queue time",
        "A capacity problem: more concurrent sequences if KV has room (--max-num-seqs ↑), else more KV capacity",
        ("--max-num-seqs", "--gpu-memory-utilization"),
        "capacity ↑",
        "observable surface §6 (derived)",
    ),
    KnobRow(
        "ttft-prefill",
        "TTFT over budget, mostly prefill time",
        "Larger prefill chunks (--max-num-batched-tokens ↑) and a better prefix-cache hit rate",
        ("--max-num-batched-tokens", "--enable-prefix-caching"),
        "batched tokens ↑",
        "optimization.md (“Higher values achieve better TTFT”)",
    ),
    KnobRow(
        "stall",
        "Requests running but no tokens produced; /health still answers",
        "The engine is stuck (hung kernel, stopped process, deadlock): capture stacks, then restart; not a "
        "tuning problem",
        (),
        "restart",
        "observable surface §2 (derived)",
    ),
    KnobRow(
        "hung-rank",
        "One data-parallel engine produces nothing while its peers serve",
        "A hung rank, not a tuning problem: dump that EngineCore_DP<N> process's stacks, look for a stopped "
        "process, a hung device or an RPC/collective timeout in its log, then restart; the requests it holds "
        "get no answer until then",
        (),
        "restart the rank",
        "observable surface §1 (engine label) and vllm/v1/engine/core_client.py (DP load balancing)",
    ),
    KnobRow(
        "slow-rank",
        "One data-parallel engine serves far fewer tokens than its peers",
        "A slow rank (throttled or faulty device, a busy host): check that device and host; the balancer evens "
        "out requests, not speed, so its users see the slow tail",
        (),
        "fix or drain the rank",
        "vllm/v1/engine/core_client.py (DP load balancing by requests in flight)",
    ),
    KnobRow(
        "dp-balance",
        "One data-parallel engine queues (or fills its KV cache) while a peer of the same server has room",
        "Requests routed around vLLM's balancer, which would send each to the engine with the fewest in "
        "flight: an X-data-parallel-rank header set by a router, session affinity or prefix-aware routing in "
        "an external load balancer (--data-parallel-external-lb / --data-parallel-hybrid-lb); spread them, "
        "or size --data-parallel-size for the load each rank really gets",
        (),
        "fix the routing",
        "vllm/v1/engine/core_client.py (DPLBAsyncMPClient.get_core_engine_for_request) and "
        "vllm/entrypoints (X-data-parallel-rank header)",
    ),
    KnobRow(
        "asleep",
        "Engine asleep (engine_sleep_state awake = 0): nothing served, /health still answers",
        "Someone called /sleep (sleep mode): wake it with /wake_up, or find the owner that put it to sleep; "
        "not a stall and not a tuning problem",
        (),
        "wake up",
        "observable surface (engine_sleep_state, /sleep, /wake_up)",
    ),
    KnobRow(
        "down",
        "Server unreachable or engine dead (/health 503)",
        "Check the process, its last log lines (OOM, engine dead) and the host; restart",
        (),
        "restart",
        "observable surface §2",
    ),
    KnobRow(
        "failed",
        "Requests fail on the server (finished 'error', HTTP 5xx on the generation handlers)",
        "The server log names the exception behind each failure; no flag fixes an error the log has not named",
        (),
        "read the log",
        "vllm:request_success_total{finished_reason}; http_requests_total (prometheus-fastapi-instrumentator)",
    ),
    KnobRow(
        "rejected",
        "Requests refused with HTTP 400: prompts beyond --max-model-len",
        "Raise --max-model-len when the model's max_position_embeddings and the KV cache allow it; otherwise "
        "trim the prompts on the client",
        ("--max-model-len",),
        "max-model-len ↑, or trim on the client",
        "vllm/renderers/params.py (\"This model's maximum context length is …\"); http_requests_total",
    ),
    KnobRow(
        "rejected-model-name",
        "Requests refused with HTTP 404: a model name the server does not serve",
        "Serve the name the clients send as an alias (--served-model-name takes several names; /v1/models lists "
        "them), or fix the clients' model field",
        ("--served-model-name",),
        "set (add the clients' name)",
        "vllm/entrypoints/serve/engine/serving.py (VLLMNotFoundError → 404); the uvicorn access log",
    ),
    KnobRow(
        "gave-up",
        "Clients give up (disconnect) while their requests wait: 2xx answers the engine never finished",
        "Capacity for the queue (--max-num-seqs, or KV memory when it is full), or shed early with "
        "--max-num-queued-reqs so they get a fast 503 instead of a wait they abandon",
        ("--max-num-seqs", "--max-num-queued-reqs"),
        "max-num-seqs ↑, or set max-num-queued-reqs",
        "http_requests_total vs vllm:request_success_total; vllm/config/scheduler.py (max_num_queued_reqs)",
    ),
    KnobRow(
        "context-cut",
        "Answers cut at the context limit: finished 'length' with prompt + output at --max-model-len",
        "vLLM clamps max_tokens to max_model_len - prompt: raise --max-model-len where the model and the KV "
        "cache allow it, or send shorter prompts or a smaller max_tokens",
        ("--max-model-len",),
        "max-model-len ↑, or trim on the client",
        "vllm/entrypoints/serve/utils/api_utils.py (get_max_tokens); vllm:request_prompt_tokens, "
        "vllm:request_generation_tokens",
    ),
    KnobRow(
        "gpu-throttled",
        "GPU clocks held down (NVML clocks-event reasons: thermal slowdown, power cap, power brake): every "
        "step slower, though no flag changed",
        "Not a vLLM setting: the device protects itself. Thermal: the cooling (inlet air, fans, airflow). "
        "Power: the enforced power limit (nvidia-smi -q -d POWER, an administrator's -pl) and the supply",
        (),
        "fix cooling or the power cap",
        "NVML nvmlDeviceGetCurrentClocksEventReasons; dcgm-exporter DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    ),
    KnobRow(
        "gpu-saturated",
        "GPU busy all the time (utilisation pegged) while requests wait",
        "If the batch can still grow (KV room, running below --max-num-seqs) it is not the limit; otherwise add "
        "capacity: another replica, --data-parallel-size, --tensor-parallel-size, or shed early",
        ("--data-parallel-size", "--tensor-parallel-size", "--max-num-queued-reqs"),
        "capacity ↑",
        "NVML utilisation / DCGM_FI_DEV_GPU_UTIL; vLLM num_requests_waiting",
    ),
)

KNOBS_BY_ID = {row.id: row for row in KNOB_TABLE}
