"""The Fleet page's pieces: which fleet it reads (the configured targets directly, or a
Prometheus), the report (cached per refresh), the table as a styled frame with links to each
instance's views, and adopting an instance opened by such a link."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from diagnostics import direct_fleet
from diagnostics.core.diagnosis import Budgets
from diagnostics.core.diagnosis.outcomes import Outcomes, Share
from diagnostics.core.fleet import direct
from diagnostics.core.fleet.gpus import GpuJoin
from diagnostics.core.fleet.promql import FLEET_COLUMNS, Scope, parse_selector
from diagnostics.core.fleet.table import FleetRow, Outlier
from diagnostics.core.targets import PrometheusInstance, TargetsConfig, normalize_url, same_url
from diagnostics.core.text import fmt_share_cell, gpu_rows
from diagnostics.prometheus_fleet import FleetReport, fleet_report
from diagnostics.ui import resources, state

DIRECT = "configured servers, scraped directly"
PROMETHEUS = "Prometheus"
DIRECT_LIMIT = 20
"""Past this many servers, the page says to use Prometheus (README: *Where the line is*, measured by
``bench/fleet_direct.py``)."""

LinkTo = Callable[[str, FleetRow], str]

_SCALE = {"%": (100.0, "%"), "s": (1000.0, "ms"), "/s": (1.0, "/s"), "": (1.0, "")}
# Beside goodput: the outcome rules' shares of each instance's requests over the range (and counts).
OUTCOME_COLUMNS: dict[str, tuple[Callable[[Outcomes], Share], str]] = {
    "failed": (lambda o: o.failed_share, "Requests that finished with an engine error or were answered HTTP 5xx "
               "(not the admission limits' 503s), of every request answered"),
    "rejected 4xx": (lambda o: o.rejected_share, "Requests refused with HTTP 4xx before the engine saw them "
                     "(http_requests_total), of every request answered"),
    "gave up": (lambda o: o.gave_up_share, "2xx answers the engine never finished (clients that disconnected), "
                "of the 2xx answers"),
}


@st.cache_data(ttl=30, max_entries=16, show_spinner="Asking Prometheus…")
def report(url: str, selector: str, range_s: int, itl_ms: float, ttft_ms: float, tick: int) -> FleetReport:
    """The fleet over the last ``range_s`` (one report per ``tick``: every viewer of the same
    Prometheus within a refresh shares it). Raises ``TargetError``."""
    client = resources.prometheus_client(url)
    budgets = Budgets(itl_ms=itl_ms or None, ttft_ms=ttft_ms or None)
    return fleet_report(client, Scope(selector), range_s=range_s, budgets=budgets, charts=True)


def pick_source(config: TargetsConfig) -> str:
    """Where the fleet is read from: the configured targets when there are any, a Prometheus when
    one is configured or may be typed; a choice between the two when both are possible (Prometheus
    first when one is configured: the operator set it up for the fleet)."""
    choices = ([DIRECT] if config.targets else []) + ([PROMETHEUS] if config.prometheus_url or config.allow_custom
                                                      else [])
    if len(choices) < 2:
        return choices[0] if choices else PROMETHEUS
    if state.get(state.FLEET_SOURCE) not in choices:
        st.session_state[state.FLEET_SOURCE] = PROMETHEUS if config.prometheus_url else DIRECT
    return str(st.radio("Read the fleet from", choices, horizontal=True, key=state.widget_key(state.FLEET_SOURCE),
                        on_change=state.save, args=(state.FLEET_SOURCE,),
                        help="A few servers need no Prometheus: each configured target's own collector (the one Live "
                        "reads) scraping it every second. Past about twenty, or for days of history, use Prometheus."))


def direct_refresh_seconds(range_s: int, refresh_s: int) -> int:
    """How often the direct table is rebuilt: every server's whole diagnosis over the range is the
    cost (``bench/fleet_direct.py``: about 0.13 s of CPU per server for 5 min of 1 s scrapes, 2 s
    for an hour), so at least 10 s and a sixtieth of the range."""
    return max(10, refresh_s, range_s // 60)


def direct_targets(config: TargetsConfig) -> tuple[tuple[str, str], ...]:
    """The configured targets as (name, URL): what the direct report is cached by (never a key)."""
    return tuple((t.name, t.url) for t in direct_fleet.configured_targets(config))


@st.cache_data(ttl=30, max_entries=16, show_spinner=False)
def direct_report(targets: tuple[tuple[str, str], ...], range_s: int, itl_ms: float, ttft_ms: float,
                  tick: int) -> direct.DirectReport:
    """The configured targets over the last ``range_s``, each read from its shared collector (started
    here if the flight recorder did not), once per ``tick`` for every viewer."""
    config = resources.targets_config()
    by_url = {t.url: t for t in direct_fleet.configured_targets(config)}
    gpu_urls = {t.name: t.gpu_metrics_url for t in config.targets}
    read = []
    interval = 1.0
    for name, url in targets:
        target = by_url.get(url)
        if target is None:
            continue
        collector = resources.collector(target.url, target.api_key, gpu_urls.get(name))
        interval = collector.interval_seconds
        read.append(direct_fleet.snapshot(name, collector))
    budgets = Budgets(itl_ms=itl_ms or None, ttft_ms=ttft_ms or None)
    return direct.report(read, range_s=range_s, interval_s=interval, end=time.time(), budgets=budgets, draw=True)


def tick(every_seconds: float) -> int:
    return int(time.time() // every_seconds)


def link(page: str, url: str, selector: str, row: FleetRow) -> str:
    query = {"prometheus": url, "instance": row.instance, "range": str(state.get(state.PROM_RANGE))}
    if selector:
        query["selector"] = selector
    if row.model:
        query["model"] = row.model
    return f"/{page}?{urlencode(query)}"


def direct_link(page: str, name: str) -> str:
    """A link that opens a configured target by its name (never its URL: a link must not point the
    dashboard anywhere the configuration does not)."""
    return f"/{page}?{urlencode({'target': name})}"


def frame(rows: list[FleetRow], link_to: Callable[[str, FleetRow], str],
          names: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per instance, numbers in the units a person reads (%, ms, per second);
    ``link_to(page, row)`` is the row's link to that page; ``names`` (the configured targets' names,
    by instance) puts the name the engineer gave each server first."""
    records: list[dict[str, Any]] = []
    for row in rows:
        rec: dict[str, Any] = {
            **({"name": names.get(row.instance, "—")} if names is not None else {}),
            "instance": row.instance,
            "live": link_to("Live", row),
            "diagnose": link_to("Diagnose", row),
            "up": row.state_text,
            "worst finding": row.worst_text,
            "goodput": row.goodput_text,
            **{key: "—" if row.outcomes is None else fmt_share_cell(share(row.outcomes))
               for key, (share, _) in OUTCOME_COLUMNS.items()},
        }
        for col in FLEET_COLUMNS:
            scale, _ = _SCALE[col.unit]
            value = row.values.get(col.key)
            rec[col.key] = None if value is None else value * scale
        rec["model"] = row.model or "—"
        records.append(rec)
    return pd.DataFrame.from_records(records)


def gpu_frame(joined: Mapping[str, GpuJoin]) -> pd.DataFrame:
    """One row per GPU joined to a vLLM instance (its latest DCGM reading through Prometheus)."""
    records: list[dict[str, Any]] = []
    for instance in sorted(joined):
        join = joined[instance]
        last = join.last
        if last is None:
            continue
        for row in gpu_rows(last):
            records.append({"instance": instance, "joined by": join.by, "GPU": row.device,
                            "clock-event reasons": row.clock_events, "utilisation": row.utilization,
                            "temperature": row.temperature, "power (of limit)": row.power,
                            "SM clock (of max)": row.sm_clock})
    return pd.DataFrame.from_records(records)


def column_config() -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": st.column_config.TextColumn("name", help="the target's name in the configuration ([targets])"),
        "instance": st.column_config.TextColumn("instance"),
        "live": st.column_config.LinkColumn("Live", display_text="open ↗", help="this instance's charts, via Prometheus"),
        "diagnose": st.column_config.LinkColumn("Diagnose", display_text="open ↗"),
        "worst finding": st.column_config.TextColumn("worst finding", width="large"),
        "goodput": st.column_config.TextColumn(
            "goodput", help="Share of requests certainly within the TTFT and ITL budgets set above (bucket "
            "bounds at or under each budget)"),
        **{key: st.column_config.TextColumn(key, help=why) for key, (_, why) in OUTCOME_COLUMNS.items()},
    }
    for col in FLEET_COLUMNS:
        _, unit = _SCALE[col.unit]
        fmt = "%.1f" if unit in ("%", "ms") else "%.2f" if unit == "/s" else "%.0f"
        header = f"{col.header} ({unit})" if unit else col.header
        config[col.key] = st.column_config.NumberColumn(header, format=fmt + (" %%" if unit == "%" else ""))
    return config


def styled(df: pd.DataFrame, found: list[Outlier]) -> Any:
    """The frame with every outlier cell (and a down replica's row) tinted."""
    marks = {(o.instance, o.key) for o in found}
    down = {o.instance for o in found if o.key == "up"}

    def tint(row: pd.Series) -> list[str]:
        out = []
        for column in row.index:
            if row["instance"] in down:
                out.append("background-color: rgba(214, 39, 40, 0.25)")
            elif (row["instance"], column) in marks:
                out.append("background-color: rgba(255, 127, 14, 0.30)")
            else:
                out.append("")
        return out

    return df.style.apply(tint, axis=1)


def adopt_link(config: TargetsConfig) -> str | None:
    """An instance opened by a Fleet-table link becomes the target — a configured one by its name
    (``?target=prod-a``), or one read through Prometheus (``?prometheus=…&instance=…``); returns why
    not, when the link cannot be followed here."""
    params = st.query_params
    if "target" in params and "prometheus" not in params:
        name = params.get("target", "")
        if name not in {t.name for t in config.targets}:
            return f"No configured target is named {name!r}: a link opens only the targets this dashboard lists."
        st.session_state[state.TARGET_NAME] = name
        st.query_params.clear()
        return None
    if "prometheus" not in params or "instance" not in params:
        return None
    url, instance = params.get("prometheus", ""), params.get("instance", "")
    try:
        url = normalize_url(url, "Prometheus URL")
        selector = parse_selector(params.get("selector", ""))
    except ValueError as exc:
        return str(exc)
    if not config.allow_custom and not (config.prometheus_url and same_url(config.prometheus_url, url)):
        return "This deployment only reads its configured Prometheus."
    opened = PrometheusInstance(url, selector, instance, params.get("model") or None)
    st.session_state[state.PROM_INSTANCE] = opened
    st.session_state[state.TARGET_NAME] = opened.label
    st.session_state[state.PROM_URL] = url
    if params.get("range") in state.PROM_RANGE_CHOICES:
        st.session_state[state.PROM_RANGE] = params["range"]
    st.query_params.clear()
    return None


@st.cache_data(ttl=30, max_entries=16, show_spinner=False)
def charts(url: str, selector: str, range_s: int, step_s: int, tick: int) -> dict[str, Any]:
    """The fleet charts at a step the user chose (one range query per chart)."""
    from diagnostics.prometheus_fleet import fleet_charts

    client = resources.prometheus_client(url)
    return fleet_charts(client, Scope(selector), range_s=range_s, step_s=step_s)
