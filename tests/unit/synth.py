"""Synthetic vLLM 0.32-style /metrics text for table-driven rule tests (the real-server proof is in
tests/integration/test_diagnose.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.gpu import GpuDevice, GpuReading

L = 'engine="0",model_name="m"'
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
N_BOUNDS = (1, 2, 5, 10, 20)
STEP_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # iteration_tokens, vLLM 0.32
PROMPT_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)  # request_prompt_tokens, max-model-len 2048


def _hist(name: str, bounds: Sequence[float], counts: Sequence[float], total_sum: float) -> list[str]:
    lines = []
    running = 0.0
    for bound, count in zip(bounds, counts):
        running += count
        lines.append(f'{name}_bucket{{{L},le="{float(bound)}"}} {running}')
    running += counts[len(bounds)] if len(counts) > len(bounds) else 0.0
    lines.append(f'{name}_bucket{{{L},le="+Inf"}} {running}')
    lines.append(f"{name}_count{{{L}}} {running}")
    lines.append(f"{name}_sum{{{L}}} {total_sum}")
    return lines


def text(
    *,
    running: float = 0,
    waiting: float = 0,
    usage: float = 0.0,
    gen: float = 0,
    prompt: float = 0,
    preempt: float = 0,
    hits: float = 0,
    queries: float = 0,
    itl_counts: Sequence[float] | None = None,
    itl_sum: float = 0.0,
    n_counts: Sequence[float] | None = None,
    prefix_caching: bool = True,
    num_gpu_blocks: int = 1000,
    step_counts: Sequence[float] | None = None,
    step_sum: float = 0.0,
    prompt_len_counts: Sequence[float] | None = None,
    pin: str = "",
    ttft_counts: Sequence[float] | None = None,
    queue_seconds: tuple[float, float] | None = None,
    prefill_seconds: tuple[float, float] | None = None,
    decode_seconds: tuple[float, float] | None = None,
    started_at: float = 1000,
    http: Sequence[float] | None = None,
    finished: Sequence[float] | None = None,
    lengths: Sequence[float] | None = None,
    request_bytes: float | None = None,
) -> str:
    """``http``: the API server's answers on /v1/completions, (2xx, 4xx, 5xx); ``finished``: the
    engine's finished sequences by reason, (stop, length, abort, error), and with no ``n_counts`` as
    many n = 1 requests as it finished outside ``abort``; ``lengths``: (prompt tokens, generated
    tokens, sequences) of the finished sequences, as request_prompt_tokens and
    request_generation_tokens; ``request_bytes``: the bytes /v1/completions received (every request,
    as the instrumentator's http_request_size_bytes_sum)."""
    lines = [
        f"vllm:num_requests_running{{{L}}} {running}",
        f"vllm:num_requests_waiting{{{L}}} {waiting}",
        f'vllm:num_requests_waiting_by_reason{{{L},reason="capacity"}} {waiting}',
        f"vllm:kv_cache_usage_perc{{{L}}} {usage}",
        f"vllm:generation_tokens_total{{{L}}} {gen}",
        f"vllm:prompt_tokens_total{{{L}}} {prompt}",
        f"vllm:num_preemptions_total{{{L}}} {preempt}",
        f"vllm:prefix_cache_hits_total{{{L}}} {hits}",
        f"vllm:prefix_cache_queries_total{{{L}}} {queries}",
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="{prefix_caching}",'
        f'engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="{num_gpu_blocks}"{pin}}} 1.0',
        f"process_start_time_seconds {started_at}",
    ]
    if finished is not None:
        for reason, count in zip(("stop", "length", "abort", "error", "repetition"), [*finished, 0, 0, 0, 0, 0]):
            lines.append(f'vllm:request_success_total{{{L},finished_reason="{reason}"}} {count}')
        if n_counts is None:
            n_counts = [finished[0] + finished[1] + (finished[3] if len(finished) > 3 else 0)] + [0] * 5
    if http is not None:
        lines.append('http_requests_total{handler="/v1/models",method="GET",status="2xx"} 1.0')
        for status, count in zip(("2xx", "4xx", "5xx"), http):
            lines.append(f'http_requests_total{{handler="/v1/completions",method="POST",status="{status}"}} {count}')
    if request_bytes is not None:
        lines.append(f'http_request_size_bytes_sum{{handler="/v1/completions"}} {request_bytes}')
    if lengths is not None and prompt_len_counts is None:
        prompt_sum, gen_sum, sequences = lengths
        lines += _hist("vllm:request_prompt_tokens", (1000.0,), [sequences, 0], prompt_sum)
        lines += _hist("vllm:request_generation_tokens", (1000.0,), [sequences, 0], gen_sum)
    lines += _hist("vllm:inter_token_latency_seconds", ITL_BOUNDS, itl_counts or [0] * 14, itl_sum)
    lines += _hist("vllm:request_params_n", N_BOUNDS, n_counts or [0] * 6, 0.0)
    lines += _hist("vllm:time_to_first_token_seconds", (0.1, 1.0), ttft_counts or [0, 0, 0], 0.0)
    for name, sum_count in (("vllm:request_queue_time_seconds", queue_seconds),
                            ("vllm:request_prefill_time_seconds", prefill_seconds),
                            ("vllm:request_decode_time_seconds", decode_seconds)):
        if sum_count is not None:  # (sum, count): the rules read the mean
            lines += _hist(name, (0.3, 1.0), [sum_count[1], 0, 0], sum_count[0])
    if step_counts is not None:
        lines += _hist("vllm:iteration_tokens_total", STEP_BOUNDS, step_counts, step_sum)
    if prompt_len_counts is not None:
        lines += _hist("vllm:request_prompt_tokens", PROMPT_BOUNDS, prompt_len_counts, 0.0)
    return "\n".join(lines) + "\n"


def scrape(ts: float, **kw: object) -> Scrape:
    return Scrape(ts, parse_snapshot(text(**kw)))  # type: ignore[arg-type]


# What the HTTP adapter says for each kind of failure (rules read the kind, never these words).
MESSAGES = {
    ErrorKind.UNREACHABLE: "cannot reach http://h:1: [Errno 111] Connection refused",
    ErrorKind.TIMEOUT: "/metrics did not answer within 2 s",
    ErrorKind.ENGINE_UNAVAILABLE: "/metrics answered HTTP 503 Service Unavailable",
}


def down(ts: float, kind: ErrorKind = ErrorKind.UNREACHABLE, message: str | None = None) -> Scrape:
    return Scrape(ts, None, MESSAGES.get(kind, str(kind)) if message is None else message, kind)


GAUGES = ("running", "waiting", "usage")


def cumulative(per_second: Sequence[Mapping[str, float | Sequence[float]]], **fixed: object) -> list[Scrape]:
    """One scrape a second from what each second *added*: counters (``gen``, ``prompt``, ``preempt``)
    and bucket counts (``itl_counts``, ``step_counts``, ``prompt_len_counts``) are summed into the
    totals a server exposes; gauges (:data:`GAUGES`) are read as they are; ``fixed`` goes to every
    scrape."""
    counters: dict[str, float] = {}
    buckets: dict[str, list[float]] = {}
    gauges: dict[str, float] = {}
    history = []
    for t, added in enumerate(per_second):
        for key, value in added.items():
            if isinstance(value, (int, float)):
                if key in GAUGES:
                    gauges[key] = value
                else:
                    counters[key] = counters.get(key, 0.0) + value
            else:
                buckets[key] = [a + b for a, b in zip(buckets.get(key, [0.0] * len(value)), value)]
        history.append(scrape(float(t), **fixed, **counters, **buckets, **gauges))
    return history


def gpu_readings(seconds: int, **fields: object) -> list[tuple[float, GpuReading]]:
    """One GPU reading a second (times 0, 1, …, matching :func:`scrape`'s), of one H100 whose fields
    are those given (the rest unknown)."""
    device = GpuDevice(0, "NVIDIA H100 80GB HBM3", 70 * 2**30, 80 * 2**30, uuid="GPU-test", **fields)  # type: ignore[arg-type]
    return [(float(t), GpuReading((device,), source="test")) for t in range(seconds)]
