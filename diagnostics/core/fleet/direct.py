"""A fleet of directly scraped servers (pure): each configured target's own collector history — the
history its Live and Diagnose pages read — turned into the fleet table's row, so the table, the
outliers, each replica's worst finding and goodput are the ones the Prometheus path shows
(:mod:`diagnostics.core.fleet.table`), with no Prometheus in between.

Each column means what its PromQL (:data:`~diagnostics.core.fleet.promql.FLEET_COLUMNS`) means:
a gauge now (the newest scrape, and only when it answered — a server down now has no "now"), a
peak as the highest value any engine reached in the range, a counter's rate and a histogram's p95
over the range (:mod:`diagnostics.core.metrics.derive`: resets handled as Prometheus does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from diagnostics.core.diagnosis import Budgets, Finding, diagnose, prepare
from diagnostics.core.fleet.promql import CHART_CONCEPTS
from diagnostics.core.fleet.table import FleetFinding, FleetRow, Outlier, fleet_findings, outliers
from diagnostics.core.metrics import derive, series
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import TargetStatus
from diagnostics.core.metrics.slo import SloAttainment, slo_attainment

CHART_POINTS = 240  # per line, as the Prometheus path's auto step keeps them


def instance_label(url: str) -> str:
    """What Prometheus would call the server at ``url``: ``host:port`` (and any path), no scheme."""
    parts = urlsplit(url)
    return (parts.netloc + parts.path.rstrip("/")) or url


@dataclass(frozen=True, slots=True)
class DirectTarget:
    """One configured target's collector, read once: its status, its history and GPU readings."""

    name: str  # the configured name: what the table's links select (never a URL)
    status: TargetStatus
    history: tuple[Scrape, ...]
    gpus: tuple[tuple[float, GpuReading], ...] = ()

    @property
    def instance(self) -> str:
        return instance_label(self.status.target or self.name)


def _gauge_now(scrapes: Sequence[Scrape], concept: str) -> float | None:
    last = scrapes[-1] if scrapes else None
    return last.snapshot.value(concept) if last is not None and last.snapshot is not None else None


def _peak(scrapes: Sequence[Scrape], concept: str) -> float | None:
    """The highest value any one engine reported (``max by (instance) (max_over_time(…))``)."""
    seen = [v for s in scrapes if s.snapshot is not None for e in s.snapshot.engines
            if (v := s.snapshot.value(concept, e)) is not None]
    return max(seen) if seen else None


def _p95(concept: str) -> Callable[[Sequence[Scrape]], float | None]:
    return lambda scrapes: derive.histogram_quantile(0.95, derive.histogram_delta(scrapes, concept))


COLUMN_VALUES: dict[str, Callable[[Sequence[Scrape]], float | None]] = {
    # key (a FLEET_COLUMNS key): the scrapes of the range -> the cell
    "kv_cache_usage_perc": lambda s: _gauge_now(s, "kv_cache_usage_perc"),
    "kv_cache_usage_peak": lambda s: _peak(s, "kv_cache_usage_perc"),
    "num_requests_running": lambda s: _gauge_now(s, "num_requests_running"),
    "num_requests_waiting": lambda s: _gauge_now(s, "num_requests_waiting"),
    "waiting_peak": lambda s: _peak(s, "num_requests_waiting"),
    "preemptions_per_s": lambda s: derive.counter_rate(s, "num_preemptions"),
    "generation_tokens_per_s": lambda s: derive.counter_rate(s, "generation_tokens"),
    "prefix_cache_hit_rate": derive.prefix_cache_hit_rate,
    "ttft_p95_s": _p95("time_to_first_token_seconds"),
    "itl_p95_s": _p95("inter_token_latency_seconds"),
}


def columns(scrapes: Sequence[Scrape]) -> dict[str, float | None]:
    """Every fleet-table cell of one target over its scrapes of the range."""
    out: dict[str, float | None] = {}
    for key, value_of in COLUMN_VALUES.items():
        value = value_of(scrapes)
        out[key] = None if value is None or not math.isfinite(value) else value
    return out


def up_of(status: TargetStatus) -> bool | None:
    """Up, down (or answering something that is not vLLM), or not known yet / stale."""
    return {"up": True, "down": False, "not_vllm": False}.get(status.state)


@dataclass(frozen=True, slots=True)
class DirectReport:
    """The fleet as its collectors see it now: the same table, outliers and shared findings as
    through Prometheus, and each target's charts."""

    end: float
    range_s: float
    interval_s: float
    rows: list[FleetRow]
    findings: list[FleetFinding]
    outliers: list[Outlier]
    names: Mapping[str, str] = field(default_factory=dict)  # instance -> configured name (the links)
    charts: Mapping[str, Mapping[str, list[tuple[float, float]]]] = field(default_factory=dict)


def row(target: DirectTarget, range_s: float, budgets: Budgets | None = None, end: float | None = None) -> FleetRow:
    """One target's row: its cells, its diagnosis and, with budgets, its goodput over the range
    ending at ``end`` (default: its newest scrape). A diagnosis that fails keeps the row, with the
    reason."""
    scrapes = derive.window(target.history, range_s, end)
    info = target.status.info
    found: tuple[Finding, ...] = ()
    error = None
    try:
        found = tuple(diagnose(prepare(scrapes, info=info, budgets=budgets or Budgets(), gpus=target.gpus)))
    except Exception as exc:  # noqa: BLE001 - one target's odd data must not blank the fleet
        error = f"diagnosis failed: {type(exc).__name__}"
    slo: SloAttainment | None = None
    if budgets is not None:
        slo = slo_attainment(scrapes, budgets.ttft_ms, budgets.itl_ms)
    return FleetRow(target.instance, info.model if info is not None else None, up_of(target.status),
                    columns(scrapes), found, error, slo, state=target.status.state,
                    detail=target.status.error)


def charts(targets: Sequence[DirectTarget], range_s: float, end: float | None = None, rate_window_s: float = 5.0
           ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The Fleet page's charts (:data:`CHART_CONCEPTS`) from each target's history: a line per
    instance, a failed scrape a gap (NaN)."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {key: {} for key in CHART_CONCEPTS}
    for target in targets:
        scrapes = derive.window(target.history, range_s, end)
        if not scrapes:
            continue
        drawn: dict[str, series.Series] = {
            "kv_cache_usage_perc": series.gauge_series(scrapes, lambda s: s.value("kv_cache_usage_perc"), CHART_POINTS),
            "num_requests_running": series.gauge_series(scrapes, lambda s: s.value("num_requests_running"),
                                                        CHART_POINTS),
            "num_requests_waiting": series.gauge_series(scrapes, lambda s: s.value("num_requests_waiting"),
                                                        CHART_POINTS),
            "preemptions_per_s": series.rate_series(scrapes, lambda s: s.value("num_preemptions"), rate_window_s,
                                                    CHART_POINTS),
        }
        itl = series.rolling_quantiles(scrapes, "inter_token_latency_seconds", (0.95,), 60.0, CHART_POINTS)
        if itl is not None:
            drawn["itl_p95_s"] = itl[0.95]
        for key, line in drawn.items():
            if line.ts and any(v is not None for v in line.values):
                out[key][target.instance] = [(t, math.nan if v is None else v) for t, v in zip(line.ts, line.values)]
    return out


def report(targets: Sequence[DirectTarget], *, range_s: float, interval_s: float, end: float | None = None,
           budgets: Budgets | None = None, draw: bool = False) -> DirectReport:
    """The fleet table over the ``range_s`` ending at ``end`` (default: each target's newest
    scrape) for every target (in the order given), its outliers and the findings replicas share;
    the charts when ``draw``."""
    table = [row(t, range_s, budgets, end) for t in targets]
    last = max((t.history[-1].ts for t in targets if t.history), default=0.0)
    return DirectReport(end if end is not None else last, range_s, interval_s, table, fleet_findings(table),
                        outliers(table), {t.instance: t.name for t in targets},
                        charts(targets, range_s, end) if draw else {})
