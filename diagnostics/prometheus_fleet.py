"""A fleet through Prometheus: discovery, the fleet table and charts, and any instance's history as
the live collector would have kept it — so every page, the CLI and the diagnosis read a
Prometheus-backed target unchanged.

The number of queries per refresh does not grow with the fleet: two for discovery, one per table
column, one per chart, one for every instance's raw series, two for the GPUs (the targets' labels
and every dcgm-exporter series, joined to the vLLM instances by :mod:`diagnostics.core.fleet.gpus`)
(:func:`fleet_report` counts them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from diagnostics.core.diagnosis import Budgets, Finding, diagnose, prepare
from diagnostics.core.diagnosis.outcomes import Outcomes, outcomes
from diagnostics.core.fleet import gpus as fleet_gpus
from diagnostics.core.fleet import promql
from diagnostics.core.fleet.gpus import GpuJoin
from diagnostics.core.fleet.promql import Discovered, Scope
from diagnostics.core.fleet.table import FleetFinding, FleetRow, Outlier, fleet_findings, outliers, rows
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.info import ServerInfo, TargetStatus
from diagnostics.core.metrics.slo import SloAttainment, slo_attainment
from diagnostics.errors import TargetError
from diagnostics.recording import Record
from diagnostics.sources.prometheus import PrometheusClient

RAW_MAX_SCRAPES = 1440
"""Up to this many scrapes per series, read every real scrape (a range-vector query keeps their own
timestamps); beyond, a range query at a step of at least two scrape intervals (never the same scrape
twice, which would read as no progress)."""
RESAMPLED_MAX_POINTS = 720


def discover(client: PrometheusClient, scope: Scope, at: float | None = None) -> list[Discovered]:
    """The instances that export vLLM metrics (two queries, whatever the fleet's size)."""
    up = client.query(promql.up_query(scope), at)
    models = client.query(promql.discovery_query(scope), at)
    return promql.discovered(up, models)


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    scrape_interval: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def raw_matrix(client: PrometheusClient, scope: Scope, window: Window) -> list[dict[str, Any]]:
    """Every raw series of the scope over the window (one query)."""
    query = promql.raw_series_query(scope)
    if window.seconds / window.scrape_interval <= RAW_MAX_SCRAPES:
        return client.query(f"{query}[{promql.duration(window.seconds)}]", window.end)
    step = max(2 * window.scrape_interval, math.ceil(window.seconds / RESAMPLED_MAX_POINTS))
    return client.query_range(query, window.start, window.end, step)


def histories(client: PrometheusClient, scope: Scope, window: Window) -> dict[str, list[Scrape]]:
    return promql.histories_from_matrix(raw_matrix(client, scope, window))


def gpu_joins(client: PrometheusClient, scope: Scope, window: Window) -> dict[str, GpuJoin]:
    """The dcgm-exporter series over the window (at most 240 points a series), joined to each vLLM
    instance of the scope (two queries; {} when Prometheus holds no DCGM series)."""
    targets = client.query(promql.up_query(scope), window.end)
    step = promql.auto_step(window.seconds, window.scrape_interval)
    dcgm = client.query_range(fleet_gpus.dcgm_query(), window.start, window.end, step)
    return fleet_gpus.join(targets, dcgm, f"Prometheus {client.url}")


def server_info(model: str | None) -> ServerInfo | None:
    """What Prometheus knows of a server (its model, from the labels); not its version."""
    if not model:
        return None
    return ServerInfo.from_json(None, {"data": [{"id": model}]})


def records(client: PrometheusClient, scope: Scope, window: Window, model: str | None = None) -> list[Record]:
    """One instance's window as recording records (the ordinary format: replay and diagnose it)."""
    if scope.instance is None:
        raise ValueError("records() needs one instance")
    matrix = raw_matrix(client, scope, window)
    out: list[Record] = []
    info = server_info(model)
    for ts, samples in promql.samples_by_instance(matrix).get(scope.instance, {}).items():
        payload = {"version": None, "models": info.models_json} if info is not None and not out else None
        if promql.is_down(samples):
            out.append(Record(ts, scope.instance, error=f"Prometheus: {scope.instance} down at this instant",
                              error_kind=ErrorKind.UNKNOWN, info=payload))
        else:
            out.append(Record(ts, scope.instance, metrics=promql.exposition(samples), info=payload))
    return out


@dataclass(frozen=True, slots=True)
class FleetReport:
    window: Window
    rows: list[FleetRow]
    findings: list[FleetFinding]
    outliers: list[Outlier]
    num_queries: int
    charts: Mapping[str, Mapping[str, list[tuple[float, float]]]] = field(default_factory=dict)
    gpus: Mapping[str, GpuJoin] = field(default_factory=dict)  # DCGM through Prometheus, by vLLM instance


def fleet_report(
    client: PrometheusClient,
    scope: Scope,
    *,
    range_s: float,
    end: float | None = None,
    budgets: Budgets | None = None,
    charts: bool = False,
    diagnose_instances: bool = True,
) -> FleetReport:
    """The fleet now (or at ``end``) over the last ``range_s``: table, per-instance diagnosis,
    outliers, fleet findings and optionally the charts. Raises ``TargetError`` when Prometheus
    cannot answer; an instance whose diagnosis fails keeps its row with the reason."""
    before = client.num_requests
    end = time.time() if end is None else end
    interval = client.scrape_interval()
    window = Window(end - range_s, end, interval)
    instances = discover(client, scope, end)
    # A rate needs at least two samples in its window: never shorter than four scrapes.
    rate_s = max(range_s, 4 * interval)
    columns = {
        col.key: promql.vector_by_instance(client.query(col.promql(scope, rate_s), end))
        for col in promql.FLEET_COLUMNS
    }
    found: dict[str, list[Finding]] = {}
    errors: dict[str, str] = {}
    attained: dict[str, SloAttainment | None] = {}
    seen: dict[str, Outcomes] = {}
    joined = gpu_joins(client, scope, window) if instances else {}
    if diagnose_instances and instances:
        per = histories(client, scope, window)
        model_of = {d.instance: d.model for d in instances}
        for instance, history in per.items():
            if budgets is not None:
                attained[instance] = slo_attainment(history, budgets.ttft_ms, budgets.itl_ms)
            gpu = joined.get(instance)
            try:
                ctx = prepare(history, info=server_info(model_of.get(instance)), budgets=budgets or Budgets(),
                              gpus=gpu.readings if gpu is not None else ())
                found[instance] = diagnose(ctx)
                seen[instance] = outcomes(ctx)  # what the outcome rules read, shown beside goodput
            except Exception as exc:  # noqa: BLE001 - one instance's odd data must not blank the fleet
                errors[instance] = f"diagnosis failed: {type(exc).__name__}"
    drawn = fleet_charts(client, scope, range_s=range_s, end=end) if charts and instances else {}
    table = rows(instances, columns, found, errors, attained, seen)
    return FleetReport(window, table, fleet_findings(table), outliers(table), client.num_requests - before, drawn,
                       joined)


def fleet_charts(
    client: PrometheusClient, scope: Scope, *, range_s: float, end: float | None = None, step_s: float = 0
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Each chart concept by instance over the range (one range query per chart); ``step_s`` 0 = a
    step that keeps each line to about 240 points."""
    end = time.time() if end is None else end
    interval = client.scrape_interval()
    step = max(step_s, interval) if step_s else promql.auto_step(range_s, interval)
    rate_w = promql.rate_window(step, interval)
    return {
        key: promql.matrix_by_instance(client.query_range(query(scope, rate_w), end - range_s, end, step))
        for key, (_title, _unit, query) in promql.CHART_CONCEPTS.items()
    }


class PrometheusTarget:
    """One instance read through Prometheus, with the reader side of a collector (``history``,
    ``status``, ``gpu_history``, ``recent_records``): the pages take it where they take a collector.
    A failed query keeps the last history it got and says why in the status."""

    def __init__(
        self,
        client: PrometheusClient,
        scope: Scope,
        *,
        range_s: float,
        model: str | None = None,
        end: float | None = None,
    ) -> None:
        if scope.instance is None:
            raise ValueError("a Prometheus target is one instance")
        self.client = client
        self.scope = scope
        self.range_s = range_s
        self.model = model
        self.end = end  # None: the window ends now; else a fixed window in the past
        self.target = f"{scope.instance} (via Prometheus {client.url})"
        self._history: list[Scrape] = []
        self._gpus: list[tuple[float, GpuReading]] = []
        self._error: str | None = None
        self._attempt: float | None = None
        self._interval: float | None = None

    def window(self, end: float | None = None) -> Window:
        if self._interval is None:
            self._interval = self.client.scrape_interval(self.scope.instance)
        end = end if end is not None else self.end if self.end is not None else time.time()
        return Window(end - self.range_s, end, self._interval)

    def refresh(self, end: float | None = None) -> list[Scrape]:
        self._attempt = time.time()
        try:
            got = histories(self.client, self.scope, self.window(end))
        except TargetError as exc:
            self._error = str(exc)
            return self._history
        self._error = None
        self._history = got.get(self.scope.instance or "", [])
        try:
            joined = gpu_joins(self.client, self.scope, self.window(end)).get(self.scope.instance or "")
            self._gpus = list(joined.readings) if joined is not None else []
        except TargetError:
            pass  # the GPUs are a side panel: their failed query keeps the last readings
        return self._history

    def refresh_if_older(self, seconds: float) -> list[Scrape]:
        """:meth:`refresh` unless the last attempt is younger than ``seconds`` (one query per page
        refresh, however many fragments read it)."""
        if self._attempt is None or time.time() - self._attempt >= seconds:
            return self.refresh()
        return self._history

    def history(self) -> list[Scrape]:
        return list(self._history)

    def gpu_history(self) -> list[tuple[float, GpuReading]]:
        """The instance's GPUs from dcgm-exporter's series in the same Prometheus (NVML lives on the
        GPU host, not here); [] when none are joined to it."""
        return list(self._gpus)

    def recent_records(self, seconds: float | None = None) -> list[Record]:
        window = self.window()
        if seconds is not None:
            window = replace(window, start=max(window.start, window.end - seconds))
        return records(self.client, self.scope, window, self.model)

    def status(self) -> TargetStatus:
        history = self._history
        last_ok = next((s.ts for s in reversed(history) if s.snapshot is not None), None)
        if self._error is not None:
            # Prometheus did not answer: with history, what the instance does now is unknown (stale);
            # with none there is nothing to show, and the error names Prometheus, not the server.
            state, error = ("stale" if history else "down", self._error)
        elif not history:
            state, error = ("down", f"Prometheus has no samples of {self.scope.instance} in this window")
        elif history[-1].snapshot is None:
            state, error = ("down", history[-1].error or "down")
        else:
            state, error = ("up", None)
        since = None
        for s in reversed(history):
            if (s.snapshot is not None) != (state == "up"):
                break
            since = s.ts
        return TargetStatus(
            target=self.target,
            state=state,  # type: ignore[arg-type]
            since=since,
            error=error,
            last_ok_ts=last_ok,
            last_attempt_ts=self._attempt,
            info=server_info(self.model),
            num_scrapes=len(history),
            num_failures=sum(1 for s in history if s.snapshot is None),
        )
