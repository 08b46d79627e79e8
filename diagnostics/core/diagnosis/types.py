"""The diagnosis's value types: what a rule reports (:class:`Finding`, :class:`Suggestion`), what it
is judged against (:class:`Budgets`, :class:`Thresholds`) and what is known of the server's flags
(:class:`KnownFlags`). Pure data, so the page, the CLI and the tests share one vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from diagnostics.core.diagnosis.logs import LogFacts
from diagnostics.core.metrics.catalog import CacheConfig
from diagnostics.core.metrics.info import ServerInfo

if TYPE_CHECKING:  # the what-if attaches it; importing it here would make every diagnosis load the simulator
    from diagnostics.core.whatif.predict import Prediction

Severity = Literal["critical", "warning", "info"]
Direction = Literal["increase", "decrease", "set"]
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True, slots=True)
class Suggestion:
    """One `vllm serve` flag change; ``value`` None when the right value cannot be derived."""

    flag: str
    direction: Direction
    value: float | int | str | None
    why: str
    # What the simulated engine replaying the window predicts the change does, attached by
    # diagnostics.core.whatif.with_predictions; the note says it in words, or why there is no prediction.
    prediction: Prediction | None = None
    prediction_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"flag": self.flag, "direction": self.direction, "value": self.value, "why": self.why}
        if self.prediction is not None or self.prediction_note is not None:
            out["prediction"] = self.prediction.to_json() if self.prediction is not None else None
            out["prediction_note"] = self.prediction_note
            if self.prediction is not None:
                out["prediction_baseline"] = self.prediction.baseline_json()
        return out


@dataclass(frozen=True, slots=True)
class Finding:
    """A symptom with its evidence, the changes that address it and what to check first."""

    id: str
    severity: Severity
    title: str
    evidence: dict[str, Any]
    suggestions: tuple[Suggestion, ...] = ()
    checks: tuple[str, ...] = ()
    time_range: tuple[float, float] | None = None
    knobs: tuple[str, ...] = ()
    chart: str | None = None  # the concept the page draws beside the evidence

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "suggestions": [s.to_json() for s in self.suggestions],
            "checks": list(self.checks),
            "time_range": list(self.time_range) if self.time_range else None,
            "knobs": list(self.knobs),
        }


@dataclass(frozen=True, slots=True)
class Budgets:
    """The latency targets (p95, ms) the operator holds the server to; None = not judged."""

    ttft_ms: float | None = None
    itl_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every number a rule compares against or sizes a suggestion by, in one place so table-driven
    tests can vary them (and the alert rules read the same values)."""

    kv_full_perc: float = 0.95  # KV usage counted as "near full"
    kv_low_perc: float = 0.80  # below this the KV cache is not what limits admission
    queue_min_seconds: float = 3.0  # waiting at the cap for at least this long
    # After a burst was turned away, the queue the limit protected drains for up to this long: a batch
    # at its cap in that time is what held the queue (the gauges can miss a short burst itself).
    admission_drain_seconds: float = 10.0
    # ... and longer, until the server is idle again, for at most this long: the requests admitted with
    # the burst finish over the whole drain, and a busy host's scrapes can fail through most of it.
    admission_settle_seconds: float = 120.0
    # Requests around a rejected burst that queued at least this share of their decode time waited
    # for a running request to finish (a full batch), not for the next step.
    admission_queued_share: float = 0.2
    stall_min_seconds: float = 5.0  # running > 0 and no new token for at least this long
    stall_min_scrapes: int = 3
    long_step_max_seconds: float = 10.0  # no token for longer than this is a stall even if a large step ends it ...
    long_step_repeats: int = 3  # ... unless this many silences in the window ended in large steps ...
    long_step_rate_factor: float = 2.0  # ... and this one took at most this times their median seconds per token
    hol_spike_factor: float = 3.0  # an ITL observation this many times the window's median interval p50 ...
    hol_spike_floor_seconds: float = 0.100  # ... and above this (or the ITL budget) is a spike a user notices
    hol_tail_share: float = 0.01  # an interval whose share of spikes reaches this is a spike interval (its p99)
    hol_big_step_tokens: float = 512.0  # an engine step with more tokens than this carries a large prefill
    hol_long_prompt_tokens: float = 500.0  # a prompt longer than this is "long" (request_prompt_tokens)
    hol_min_spikes: int = 2
    hol_coincide_fraction: float = 0.5  # of the spike intervals, this share must sit next to a large prefill
    hol_min_intervals: int = 3
    batch_p50_rise_factor: float = 2.0  # ITL p50 at the highest running third over the lowest: batch-bound
    tokens_stopped_min_seconds: float = 2.0  # running > 0 and no token this long: no queue or capacity advice
    sharing_hit_rate_low: float = 0.05
    episode_merge_seconds: float = 10.0
    hung_rank_min_seconds: float = 5.0  # one engine silent this long while its peers serve
    # One sequence yields one token per step (no speculative decoding): peers above this shared steps
    # between two or more sequences, which the balancer allows only while the silent rank held requests.
    hung_rank_peer_batch: float = 1.05
    slow_rank_window_seconds: float = 10.0  # one engine's share of tokens judged over this trailing window
    slow_rank_max_ratio: float = 0.4  # an engine generating this share of its peers' tokens (or less) is slow
    skew_min_seconds: float = 10.0  # one engine queued (or full) while a peer had room, this long
    skew_kv_gap: float = 0.4  # a KV skew: the peer's usage at least this far below a near-full engine's
    slow_scrape_max_seconds: float = 5.0  # timed-out scrapes, answered again within this: slow, not down
    slow_scrape_warning_count: int = 3  # this many late scrapes in the window is a warning (fewer: info)
    spec_min_draft_tokens: float = 200.0  # judge speculation only on this many drafted tokens
    spec_low_acceptance: float = 0.3  # accepted / drafted tokens below this: speculation mostly wasted
    spec_keep_position: float = 0.5  # keep draft positions accepted at least this often
    spec_min_gain: float = 1.5  # mean accepted length (tokens per verify step) below this: costs more than it gains
    max_gpu_memory_utilization: float = 0.95
    # What the server did just before it went down or restarted: the good scrapes this long before.
    before_seconds: float = 60.0
    # Preemptions this often (per second over the window), with the cache near full and requests
    # waiting, make KV pressure critical: the server spends much of its time recomputing.
    kv_critical_preemptions_per_second: float = 1.0
    # ... or preemptions for this share of the requests finished in the window (of at least this many).
    kv_critical_preempted_share: float = 0.5
    kv_critical_min_finished: float = 10.0
    # Queue (and deferral) episodes closer than this are one episode: a gauge that reads 0 for one
    # scrape between two waits did not drain the queue.
    queue_merge_seconds: float = 2.0
    # When the running gauge misses the work (Context.gauges_blind: it read 0 at the end of at least
    # ``blind_share`` of the intervals with tokens, over at least ``blind_min_intervals``), the queue
    # is judged from the queue-time histogram: requests that certainly queued at least
    # ``hist_queue_min_seconds`` (a bound of vLLM's buckets) in intervals spanning ``queue_min_seconds``,
    # at least ``hist_queue_min_requests`` of them and ``hist_queue_share`` of the window's finished
    # requests (the p95 then certainly waited that long).
    blind_share: float = 0.5
    blind_min_intervals: int = 3
    hist_queue_min_seconds: float = 1.0
    hist_queue_min_requests: int = 5
    hist_queue_share: float = 0.05
    # ...and the running gauge's window maximum is read as the cap (for the suggested value) when at
    # least this many scrapes caught requests waiting for capacity at it.
    hist_cap_min_scrapes: int = 2
    # unexplained_change: TTFT or ITL p95 up, or tokens/s per running request down, by this factor
    # from the window's early part to its late part, while no load measure (prompt tokens/s, requests
    # started/s, prompt tokens per request, mean running) rose by ``change_load_factor``. The late part
    # is the last third (at most ``change_recent_max_seconds``), the early part the first third or the
    # hour before the late part (``change_baseline_max_seconds``); each at least
    # ``change_min_part_seconds`` long, with at least ``change_min_itl_observations`` token gaps or
    # ``change_min_requests`` first tokens.
    change_factor: float = 2.0
    change_load_factor: float = 1.5
    change_recent_max_seconds: float = 900.0
    change_baseline_max_seconds: float = 3600.0
    change_min_part_seconds: float = 8.0
    change_min_itl_observations: int = 100
    change_min_requests: int = 10
    # ITL p99 is judged too (when p95 did not move) on at least this many gaps in each part: a p99
    # then rests on five or more of them.
    change_min_itl_tail_observations: int = 500
    # Rejections are counted between scrapes; the state that caused them is read from this long before
    # the first interval with a rejection (up to ``admission_drain_seconds`` after the last).
    admission_lead_seconds: float = 5.0
    # n > 1 samples share a prompt's full blocks only: a prompt shorter than this many blocks has
    # (almost) nothing to share, so a low hit rate there says nothing.
    sharing_min_prompt_blocks: float = 2.0
    # How far a suggested value moves (the KV cache pinned by --num-gpu-blocks-override or
    # --kv-cache-memory-bytes is raised by this factor; --gpu-memory-utilization by this step).
    kv_pin_raise_factor: float = 1.5
    gpu_memory_utilization_step: float = 0.05
    # --max-model-len as a trade-off: the window's p99 prompt + output tokens times this headroom,
    # rounded up to a multiple of ``max_model_len_step_tokens``.
    max_model_len_headroom: float = 1.25
    max_model_len_step_tokens: int = 256
    # Under KV pressure, --max-num-seqs down to this share of the running count when preemption began.
    kv_fewer_seqs_share: float = 0.75
    # The head-of-line chunk budget never goes below this many tokens (vLLM's small defaults sit
    # below it; the budget also never goes below --max-num-seqs, which vLLM requires).
    min_chunk_tokens: int = 512
    # A startup that asked for more device memory than was free: the free share less this margin,
    # and never below ``min_gpu_memory_utilization``.
    free_memory_margin_perc: float = 0.02
    min_gpu_memory_utilization: float = 0.05
    # The sampler warm-up ran out of memory with N dummy requests: --max-num-seqs to this share of N.
    sampler_oom_seqs_share: float = 0.5
    # Outcomes (rules/outcomes.py): a count below this many requests says nothing, whatever its share.
    outcome_min_requests: int = 3
    failed_min_share: float = 0.01  # of the window's requests, failed on the server (error, 5xx)
    failed_critical_share: float = 0.5  # this share failing: the server mostly does not serve
    rejected_min_share: float = 0.01  # refused with HTTP 4xx before the engine saw them
    gave_up_min_share: float = 0.05  # of the 2xx answers, never finished by the engine
    gave_up_wait_seconds: float = 1.0  # queue time or TTFT p95 above this: the clients were made to wait
    cut_min_share: float = 0.05  # of the finished sequences, cut at --max-model-len
    # GPU health (NVML or dcgm-exporter readings): judged on at least this many readings of a device;
    # throttled when its thermal or power clocks-event reasons are set in this share of them;
    # saturated when its median utilisation is at least this, it draws this share of its power limit
    # (compute-bound, not idling in a kernel) and requests waited in this share of scrapes.
    gpu_min_readings: int = 3
    gpu_throttled_share: float = 0.5
    gpu_saturated_utilization_perc: float = 0.95
    gpu_saturated_power_perc: float = 0.9
    gpu_saturated_waiting_share: float = 0.5


@dataclass(frozen=True, slots=True)
class KnownFlags:
    """The server's current flags, as far as they are known (None = unknown)."""

    model: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    block_size: int | None = None
    tensor_parallel_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None

    @classmethod
    def known(
        cls, config: CacheConfig | None, info: ServerInfo | None, log: LogFacts | None = None, **overrides: Any
    ) -> KnownFlags:
        """What the server says about itself (cache config, /v1/models), then its startup log's
        non-default args; ``overrides`` (flags the operator typed in) win where not None."""
        args = log.non_default_args if log is not None else {}
        flags = cls(
            model=(info.model if info else None) or _first_str(args.get("served_model_name")) or args.get("model"),
            max_model_len=(info.max_model_len if info else None) or _int(args.get("max_model_len")),
            max_num_seqs=_int(args.get("max_num_seqs")),
            max_num_batched_tokens=_int(args.get("max_num_batched_tokens")),
            gpu_memory_utilization=(config.gpu_memory_utilization if config else None)
            or _float(args.get("gpu_memory_utilization")),
            cache_dtype=(config.cache_dtype if config else None) or args.get("kv_cache_dtype"),
            enable_prefix_caching=config.enable_prefix_caching if config else _bool(args.get("enable_prefix_caching")),
            block_size=(config.block_size if config else None) or _int(args.get("block_size")),
            tensor_parallel_size=_int(args.get("tensor_parallel_size")),
            kv_cache_memory_bytes=(config.kv_cache_memory_bytes if config else None)
            or _int(args.get("kv_cache_memory_bytes")),
            num_gpu_blocks_override=(config.num_gpu_blocks_override if config else None)
            or _int(args.get("num_gpu_blocks_override")),
        )
        return replace(flags, **{k: v for k, v in overrides.items() if v is not None})

    def ineffective(self, s: Suggestion) -> str | None:
        """Why ``s`` would not take effect with these flags (None: it would, or it cannot be told).

        vLLM sizes the KV cache from --gpu-memory-utilization only when neither
        --kv-cache-memory-bytes nor --num-gpu-blocks-override pins it (vLLM's engine-args docs), and
        a block-count pin also ignores bytes per token (so fp8 KV adds no blocks)."""
        pin = ("--num-gpu-blocks-override" if self.num_gpu_blocks_override
               else "--kv-cache-memory-bytes" if self.kv_cache_memory_bytes else None)
        if s.flag == "--gpu-memory-utilization" and s.direction == "increase" and pin:
            return f"the KV cache size ignores it while {pin} is set"
        if s.flag == "--kv-cache-dtype" and self.num_gpu_blocks_override:
            return "the number of KV blocks is pinned by --num-gpu-blocks-override"
        if s.flag == "--enable-prefix-caching" and self.enable_prefix_caching:
            return "prefix caching is already on"
        if s.flag == "--kv-cache-dtype" and s.value is not None and s.value == self.cache_dtype:
            return f"the KV cache is already {self.cache_dtype}"
        current = {"--max-num-seqs": self.max_num_seqs, "--max-num-batched-tokens": self.max_num_batched_tokens,
                   "--max-model-len": self.max_model_len}.get(s.flag)
        if current is not None and isinstance(s.value, (int, float)) and (
            (s.direction == "increase" and s.value <= current) or (s.direction == "decrease" and s.value >= current)
        ):
            return f"it is already {current}"
        return None


def _first_str(value: Any) -> str | None:
    if isinstance(value, list) and value:
        return str(value[0])
    return str(value) if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None
