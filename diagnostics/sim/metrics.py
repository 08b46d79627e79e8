"""The simulated engine's /metrics, produced with prometheus_client exactly as vLLM 0.32 names,
types, labels and buckets them (``vllm/v1/metrics/loggers.py``, ``buckets.py``)."""

from __future__ import annotations

from collections import Counter as CountOf
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from diagnostics.core.simulator.config import EngineConfig
from diagnostics.core.simulator.request import StepStats

REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
        160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N = (1, 2, 5, 10, 20)


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """``build_1_2_5_buckets(max_model_len)``."""
    out: list[float] = []
    mantissa, exponent = (1, 2, 5), 0
    while True:
        for m in mantissa:
            value = m * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        exponent += 1


def _observe_many(child: Any, value: float, count: int) -> None:
    """``count`` identical observations at once (the fast-forwarded decode steps): the same bucket
    and sum updates as ``count`` calls of ``observe``, through prometheus_client's histogram child."""
    buckets, bounds, total = (getattr(child, name, None) for name in ("_buckets", "_upper_bounds", "_sum"))
    if buckets is None or bounds is None or total is None:
        for _ in range(count):
            child.observe(value)
        return
    total.inc(value * count)
    for i, bound in enumerate(bounds):
        if value <= bound:
            buckets[i].inc(count)
            break


GENERATION_HANDLER = "/v1/completions"


class SimMetrics:
    def __init__(self, config: EngineConfig, num_gpu_blocks: int, num_engines: int = 1) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        r = self.registry

        def gauge(name: str, doc: str, extra: list[str] | None = None) -> Gauge:
            return Gauge(name, doc, labels + (extra or []), registry=r)

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, doc, labels + (extra or []), registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = gauge("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason.",
                                       ["reason"])
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter("vllm:request_success", "Count of successfully processed requests.", ["finished_reason"])
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_LATENCY)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                          REQUEST_LATENCY)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                            REQUEST_LATENCY)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                           REQUEST_LATENCY)
        tokens_buckets = request_tokens_buckets(config.max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens_buckets)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens_buckets)
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N)
        self.iteration = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                              ITERATION)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [
            "block_size", "cache_dtype", "enable_prefix_caching", "engine", "gpu_memory_utilization",
            "num_gpu_blocks", "num_gpu_blocks_override", "kv_cache_size_tokens", "kv_cache_memory_bytes"],
            registry=r)
        self.rejections = Counter("vllm:admission_rejections", "Number of admission attempts rejected by a queue "
                                  "limit, by reason.", ["model_name", "reason"], registry=r)
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            self.rejections.labels(model_name=config.served_model_name, reason=reason)
        self._model = config.served_model_name
        # The API server's answers, as prometheus-fastapi-instrumentator counts them in vLLM (status
        # grouped by class): every request of the simulated clients is a POST /v1/completions whose
        # answer is counted when its last byte goes out (its last sequence finished), and a request
        # the admission limits turn away a 503. The simulated clients never give up on a request.
        self.http = Counter("http_requests", "Total number of requests by method, status and handler.",
                            ["handler", "method", "status"], registry=r)
        for status in ("2xx", "4xx", "5xx"):
            self.http.labels(handler=GENERATION_HANDLER, method="POST", status=status)
        # vLLM sets the current adapters as labels and the wall time as the value; older label
        # combinations stay exported, so the newest value says which is current.
        self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                               ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=r) \
            if config.max_loras else None
        self._max_lora = config.max_loras
        self.sleep_state = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; "
                                 "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
                                 "discard_all = 1 means sleep level 2.", labels + ["sleep_state"], registry=r)
        self.work = {
            "flops": counter("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU "
                             "(for Model Flops Utilization calculations)."),
            "read": counter("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU "
                            "(for Model Flops Utilization calculations)."),
            "write": counter("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per "
                             "GPU (for Model Flops Utilization calculations)."),
        }
        self.spec: dict[str, Counter] | None = None
        if config.num_speculative_tokens:
            self.spec = {
                "drafts": counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                "draft_tokens": counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                "accepted": counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
                "per_pos": counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                   "Accepted tokens per draft position.", ["position"]),
            }
        self._k = config.num_speculative_tokens
        # One set of series per data-parallel engine, labelled engine="0", "1", … as vLLM does.
        self._labels = [{"model_name": config.served_model_name, "engine": str(i)} for i in range(num_engines)]
        self._children: list[dict[str, Any]] = []
        for lab in self._labels:
            info.labels(block_size=str(config.block_size),
                        cache_dtype="auto" if config.kv_dtype_bytes == 2 else "fp8",
                        enable_prefix_caching=str(config.enable_prefix_caching), engine=lab["engine"],
                        gpu_memory_utilization=str(config.gpu_memory_utilization), num_gpu_blocks=str(num_gpu_blocks),
                        num_gpu_blocks_override=str(config.num_gpu_blocks) if config.num_gpu_blocks else "None",
                        kv_cache_size_tokens=str(num_gpu_blocks * config.block_size),
                        kv_cache_memory_bytes="None").set(1)
            for reason in ("stop", "length", "abort", "error", "repetition"):
                self.success.labels(**lab, finished_reason=reason)
            for reason in ("capacity", "deferred"):
                self.waiting_by_reason.labels(**lab, reason=reason)
            if self.spec is not None:
                for pos in range(self._k):
                    self.spec["per_pos"].labels(**lab, position=str(pos))
            self.sleep_state.labels(**lab, sleep_state="awake").set(1)
            for state in ("weights_offloaded", "discard_all"):
                self.sleep_state.labels(**lab, sleep_state=state).set(0)
            self._children.append({
                "running": self.running.labels(**lab), "waiting": self.waiting.labels(**lab),
                "waiting_capacity": self.waiting_by_reason.labels(**lab, reason="capacity"),
                "waiting_deferred": self.waiting_by_reason.labels(**lab, reason="deferred"),
                "kv": self.kv_usage.labels(**lab), "queries": self.queries.labels(**lab),
                "hits": self.hits.labels(**lab), "preemptions": self.preemptions.labels(**lab),
                "prompt": self.prompt_tokens.labels(**lab), "generation": self.generation_tokens.labels(**lab),
                "iteration": self.iteration.labels(**lab), "ttft": self.ttft.labels(**lab),
                "itl": self.itl.labels(**lab),
                "e2e": self.e2e.labels(**lab), "queue": self.queue.labels(**lab),
                "prefill_time": self.prefill.labels(**lab), "decode_time": self.decode.labels(**lab),
                "req_prompt": self.req_prompt.labels(**lab), "req_gen": self.req_gen.labels(**lab),
                "params_n": self.params_n.labels(**lab),
                "success": {reason: self.success.labels(**lab, finished_reason=reason)
                            for reason in ("stop", "length", "abort", "error", "repetition")},
                "sleep": [self.sleep_state.labels(**lab, sleep_state=state)
                          for state in ("awake", "weights_offloaded", "discard_all")],
                "work": {name: metric.labels(**lab) for name, metric in self.work.items()},
            })
        self._sleep_level: list[int | None] = [None] * num_engines  # the level last exported, per engine

    def update(self, stats: StepStats, engine: int = 0) -> None:
        lab = self._labels[engine]
        c = self._children[engine]
        if stats.sleep_level != self._sleep_level[engine]:
            for level, child in enumerate(c["sleep"]):
                child.set(1 if stats.sleep_level == level else 0)
            self._sleep_level[engine] = stats.sleep_level
        if stats.estimated_flops:
            work = c["work"]
            work["flops"].inc(stats.estimated_flops)
            work["read"].inc(stats.estimated_read_bytes)
            work["write"].inc(stats.estimated_write_bytes)
        if self.spec is not None and stats.spec_drafts:
            self.spec["drafts"].labels(**lab).inc(stats.spec_drafts)
            self.spec["draft_tokens"].labels(**lab).inc(stats.spec_draft_tokens)
            self.spec["accepted"].labels(**lab).inc(stats.spec_accepted)
            for pos, n in enumerate(stats.spec_accepted_per_pos):
                if n:
                    self.spec["per_pos"].labels(**lab, position=str(pos)).inc(n)
        c["running"].set(stats.num_running)
        c["waiting"].set(stats.num_waiting)
        c["waiting_capacity"].set(stats.num_waiting - stats.num_waiting_deferred)
        c["waiting_deferred"].set(stats.num_waiting_deferred)
        if self.lora_info is not None:
            self.lora_info.labels(max_lora=str(self._max_lora), waiting_lora_adapters=",".join(stats.waiting_loras),
                                  running_lora_adapters=",".join(stats.running_loras)).set(stats.now)
        c["kv"].set(stats.kv_cache_usage_perc)
        if stats.prefix_queries:
            c["queries"].inc(stats.prefix_queries)
            c["hits"].inc(stats.prefix_hits)
        if stats.num_preemptions:
            c["preemptions"].inc(stats.num_preemptions)
        if stats.prompt_tokens:
            c["prompt"].inc(stats.prompt_tokens)
        if stats.generation_tokens:
            c["generation"].inc(stats.generation_tokens)
        if stats.iteration_tokens:
            c["iteration"].observe(stats.iteration_tokens)
        for tokens, steps in stats.iteration_weighted:
            _observe_many(c["iteration"], tokens, steps)
        for value in stats.ttft:
            c["ttft"].observe(value)
        if stats.itl:
            for value, count in CountOf(stats.itl).items():
                _observe_many(c["itl"], value, count)
        for value, count in stats.itl_weighted:
            _observe_many(c["itl"], value, count)
        for sim in stats.finished:
            reason = sim.finished_reason or "length"
            success = c["success"].get(reason)
            (success or self.success.labels(**lab, finished_reason=reason)).inc()
            end = sim.last_token_at or stats.now
            c["e2e"].observe(end - sim.arrival)
            if sim.scheduled_at is not None:
                c["queue"].observe(sim.scheduled_at - sim.arrival)
                if sim.first_token_at is not None:
                    c["prefill_time"].observe(sim.first_token_at - sim.scheduled_at)
                    c["decode_time"].observe(end - sim.first_token_at)
            c["req_prompt"].observe(sim.request.num_prompt_tokens)
            c["req_gen"].observe(sim.num_output)
            if sim.parent is None or sim.request.request_id in (sim.parent, f"{sim.parent}-0"):
                c["params_n"].observe(sim.n)
                self.answered(200)

    def reject(self, reason: str) -> None:
        """A request the frontend turned away (no engine label, as in vLLM), answered 503."""
        self.rejections.labels(model_name=self._model, reason=reason).inc()
        self.answered(503)

    def answered(self, status: int, handler: str = GENERATION_HANDLER) -> None:
        """One HTTP answer on a generation handler, counted by its status class."""
        self.http.labels(handler=handler, method="POST", status=f"{status // 100}xx").inc()

    def text(self) -> str:
        return generate_latest(self.registry).decode("utf-8")
