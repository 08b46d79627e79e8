"""What ``status`` says about a target (pure): its state, what it is, and the numbers derived over a
window, typed until :meth:`StatusReport.to_json` writes the ``status --json`` object."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from diagnostics.core.diagnosis.outcomes import Outcomes
from diagnostics.core.metrics.derive import DerivedState
from diagnostics.core.metrics.gpu import GpuReading, clock_event_names
from diagnostics.core.metrics.info import ServerInfo, TargetState, TargetStatus
from diagnostics.core.metrics.slo import SloAttainment
from diagnostics.core.text import outcome_shares_text, prompt_sources_text, roofline_text

# The latency histograms a status reports, under the short names of its JSON keys.
LATENCIES = (
    ("time_to_first_token_seconds", "ttft"),
    ("inter_token_latency_seconds", "itl"),
    ("e2e_request_latency_seconds", "e2e"),
    ("request_queue_time_seconds", "queue"),
)
PERCENTILES = ((0.5, "p50"), (0.95, "p95"), (0.99, "p99"))
CACHE_CONFIG_KEYS = (
    "block_size",
    "num_gpu_blocks",
    "gpu_memory_utilization",
    "cache_dtype",
    "enable_prefix_caching",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
)


@dataclass(frozen=True, slots=True)
class StatusReport:
    """A target's status beside its derived state (the last known numbers while it is down)."""

    target: str | None
    state: TargetState
    error: str | None
    info: ServerInfo | None
    derived: DerivedState
    slo: SloAttainment | None = None  # with budgets given: the shares within them over the window
    outcomes: Outcomes | None = None  # the window's failed, rejected and given-up requests (the rules' reading)
    gpus: GpuReading | None = None  # the latest GPU health reading (None: no GPU source configured or read)

    @classmethod
    def of(cls, status: TargetStatus, derived: DerivedState, slo: SloAttainment | None = None,
           outcomes: Outcomes | None = None, gpus: GpuReading | None = None) -> StatusReport:
        return cls(status.target, status.state, status.error, status.info, derived, slo, outcomes, gpus)

    @property
    def up(self) -> bool:
        return self.state == "up"

    def latency(self, concept: str, q: float) -> tuple[float | None, str | None]:
        """A latency percentile as a report may state it: the seconds (None when absent) and "<" or
        ">" when the histogram knows only a bucket edge (a first- or last-bucket quantile)."""
        est = self.derived.quantile(concept, q)
        value, bound = est.reported() if est is not None else (None, None)
        return (value if value is not None and math.isfinite(value) else None), bound

    def to_json(self) -> dict[str, Any]:
        """The ``status --json`` object: absent values are null, never 0."""
        state, info, config = self.derived, self.info, self.derived.cache_config
        obj: dict[str, Any] = {
            "target": self.target,
            "state": self.state,
            "up": self.up,
            "error": self.error,
            "ts": state.ts,
            "window_seconds": state.window_seconds,
            "version": info.version if info else None,
            "model": info.model if info else None,
            "max_model_len": info.max_model_len if info else None,
            "kv_cache_usage_perc": state.kv_cache_usage_perc,
            "kv_cache_used_blocks": state.kv_cache_used_blocks,
            "kv_cache_used_tokens": state.kv_cache_used_tokens,
            "num_requests_running": state.num_requests_running,
            "num_requests_waiting": state.num_requests_waiting,
            "num_requests_waiting_by_reason": state.num_requests_waiting_by_reason,
            "num_requests_swapped": state.num_requests_swapped,
            "prefix_cache_hit_rate": state.prefix_cache_hit_rate,
            "prefix_cache_queries_rate": state.prefix_cache_queries_rate,
            "prefix_cache_hits_rate": state.prefix_cache_hits_rate,
            "num_preemptions_rate": state.num_preemptions_rate,
            "num_preemptions_in_window": state.num_preemptions_in_window,
            "prompt_tokens_rate": state.prompt_tokens_rate,
            "generation_tokens_rate": state.generation_tokens_rate,
            "request_success_rate": state.request_success_rate,
            "asleep": state.asleep,
            "prompt_tokens_by_source": state.prompt_sources.by_source if state.prompt_sources else None,
            "prompt_tokens_cached_by_tier": state.prompt_sources.cached_by_tier if state.prompt_sources else None,
            "prompt_sources_text": prompt_sources_text(state.prompt_sources),
            "roofline_text": roofline_text(state.roofline, None),
            "spec_decode_acceptance_rate": state.spec_decode.acceptance_rate if state.spec_decode else None,
            "spec_decode_mean_accepted_length": state.spec_decode.mean_accepted_length if state.spec_decode else None,
            "engines": [{"engine": e.engine, "model_name": e.model_name, "kv_cache_usage_perc": e.kv_cache_usage_perc,
                         "num_requests_running": e.num_requests_running, "num_requests_waiting": e.num_requests_waiting,
                         "generation_tokens_rate": e.generation_tokens_rate, "prompt_tokens_rate": e.prompt_tokens_rate}
                        for e in state.engines],
        }
        for concept, short in LATENCIES:
            for q, name in PERCENTILES:
                obj[f"{short}_{name}_seconds"], obj[f"{short}_{name}_bound"] = self.latency(concept, q)
        for key in CACHE_CONFIG_KEYS:
            obj[key] = getattr(config, key) if config is not None else None
        obj["slo"] = self.slo.to_json() if self.slo is not None else None
        o = self.outcomes
        obj["outcomes"] = None if o is None else {**o.to_json(), "text": outcome_shares_text(o)}
        obj["gpus"] = None if self.gpus is None else {
            "source": self.gpus.source, "unavailable": self.gpus.unavailable,
            "devices": [{**d.to_json(), "label": d.label, "clock_event_names": list(clock_event_names(d.clock_events)),
                         "throttled_by": list(clock_event_names(d.throttles))} for d in self.gpus.devices]}
        return obj
