"""Fleet: several vLLM servers side by side — the configured targets scraped directly (one
collector each, no Prometheus), or every server behind a Prometheus — who is in trouble, what
replicas share, and one click to an instance's Live and Diagnose views."""

import time
from collections.abc import Mapping

import streamlit as st

from diagnostics.core.figures.fleet import fleet_figure
from diagnostics.core.fleet import promql
from diagnostics.core.fleet.gpus import GpuJoin
from diagnostics.core.fleet.table import FleetFinding, FleetRow, Outlier
from diagnostics.core.metrics.gpu import clock_event_names
from diagnostics.core.targets import normalize_url
from diagnostics.core.text import fmt_when, md_escape
from diagnostics.errors import TargetError
from diagnostics.ui import fleet_view, resources, shell, state

shell.page("Fleet", target_note=False)  # the fleet is not the sidebar's target
config = resources.targets_config()
source = fleet_view.pick_source(config)


def table(rows: list[FleetRow], found: list[FleetFinding], marked: list[Outlier], link_to: fleet_view.LinkTo,
          quiet: str, names: Mapping[str, str] | None = None) -> None:
    """The shared findings, the table with its tinted cells and links, and why each cell is tinted."""
    for finding in found:
        (st.error if finding.severity == "critical" else st.warning)(md_escape(finding.text))
    if not found:
        st.success(quiet)
    df = fleet_view.frame(rows, link_to, names)
    st.dataframe(fleet_view.styled(df, marked), column_config=fleet_view.column_config(),
                 hide_index=True, use_container_width=True, placeholder="—")  # a down row: no number, not "None"
    if marked:
        with st.expander(f"Why cells are highlighted ({len({o.instance for o in marked})} servers)"):
            for o in marked:
                st.markdown(f"- `{md_escape(o.instance)}` · {md_escape(o.key)}: {md_escape(o.why)}")


def charts(drawn: Mapping[str, Mapping[str, list[tuple[float, float]]]], marked: list[Outlier]) -> None:
    highlight = {o.instance for o in marked}
    cols = st.columns(2)
    for i, (key, (title, unit, _q)) in enumerate(promql.CHART_CONCEPTS.items()):
        fig = fleet_figure(title, unit, drawn.get(key, {}), highlight)
        with cols[i % 2]:
            if fig is None:
                st.caption(f"{title}: no data in this range.")
            else:
                st.plotly_chart(fig, use_container_width=True, key=f"fleet-{key}")


def budget_inputs(c_itl: st.delta_generator.DeltaGenerator, c_ttft: st.delta_generator.DeltaGenerator
                  ) -> tuple[float, float]:
    itl = c_itl.number_input("ITL budget (ms)", min_value=0.0, value=0.0, step=5.0, key="fleet_itl")
    ttft = c_ttft.number_input("TTFT budget (ms)", min_value=0.0, value=0.0, step=50.0, key="fleet_ttft")
    return float(itl), float(ttft)


def direct_page() -> None:
    """The configured targets, each read from its own collector (the one Live and Diagnose read)."""
    c1, c2, c3 = st.columns([4, 1, 1])
    c1.select_slider("Time range", options=list(state.DIRECT_RANGE_CHOICES), key=state.widget_key(state.DIRECT_RANGE),
                     on_change=state.save, args=(state.DIRECT_RANGE,),
                     help="Rates, percentiles, peaks and each server's diagnosis cover this range, ending now "
                     "(each collector keeps the last hour).")
    itl, ttft = budget_inputs(c2, c3)
    range_s = state.direct_range_seconds()
    every = fleet_view.direct_refresh_seconds(range_s, state.refresh_seconds())
    picked = fleet_view.direct_targets(config)

    @st.fragment(run_every=every)
    def direct() -> None:
        report = fleet_view.direct_report(picked, range_s, itl, ttft, fleet_view.tick(every))
        table(report.rows, report.findings, report.outliers, lambda page, row: fleet_view.direct_link(
            page, report.names.get(row.instance, row.instance)), f"No server needs action over the last "
              f"{state.get(state.DIRECT_RANGE)}.", report.names)
        st.caption(f"{len(report.rows)} servers scraped directly, one collector each, every "
                   f"{report.interval_s:g} s · no Prometheus · table every {every} s · as of "
                   f"{fmt_when(report.end)}")
        if len(report.rows) > fleet_view.DIRECT_LIMIT:
            st.warning(f"{len(report.rows)} servers: past {fleet_view.DIRECT_LIMIT}, collecting them and rebuilding "
                       "this table costs more than a core on a small host. Scrape them with Prometheus and point this "
                       "page at it (README: *Where the line is*).")
        charts(report.charts, report.outliers)

    direct()


def prometheus_page() -> None:
    """Every instance behind a Prometheus, over hours to days."""
    c1, c2 = st.columns([3, 2])
    if config.prometheus_url and not config.allow_custom:
        url_text = config.prometheus_url
        c1.markdown(f"**Prometheus** `{md_escape(url_text).replace('`', '')}` (configured)")
    else:
        if not state.get(state.PROM_URL) and config.prometheus_url:
            st.session_state[state.PROM_URL] = config.prometheus_url
        url_text = c1.text_input("Prometheus URL", key=state.widget_key(state.PROM_URL), on_change=state.save,
                                 args=(state.PROM_URL,), placeholder="http://prometheus:9090",
                                 help="Prometheus, Thanos, Mimir or VictoriaMetrics: anything with the Prometheus "
                                 "query API that scrapes your vLLM servers.")
    if not state.get(state.PROM_SELECTOR) and config.prometheus_selector:
        st.session_state[state.PROM_SELECTOR] = config.prometheus_selector
    selector_text = c2.text_input("Series selector", key=state.widget_key(state.PROM_SELECTOR), on_change=state.save,
                                  args=(state.PROM_SELECTOR,), placeholder='{job="vllm"}',
                                  help="Which series are your vLLM servers; empty = every vllm: series.")
    c3, c4, c5, c6 = st.columns([3, 2, 1, 1])
    c3.select_slider("Time range", options=list(state.PROM_RANGE_CHOICES), key=state.widget_key(state.PROM_RANGE),
                     on_change=state.save, args=(state.PROM_RANGE,),
                     help="Rates, percentiles, peaks and each replica's diagnosis cover this range, ending now.")
    c4.radio("Chart step", list(state.PROM_STEP_CHOICES), horizontal=True, key=state.widget_key(state.PROM_STEP),
             on_change=state.save, args=(state.PROM_STEP,))
    itl, ttft = budget_inputs(c5, c6)

    if not str(url_text or "").strip():
        st.info("Point this page at the Prometheus that scrapes your vLLM servers (or set `prometheus_url` in "
                "`.streamlit/secrets.toml`; a few servers need no Prometheus: list them under `[targets]`). "
                "A scrape config for vLLM pods:")
        st.code('scrape_configs:\n  - job_name: vllm\n    scrape_interval: 15s\n    static_configs:\n'
                '      - targets: ["vllm-0:8000", "vllm-1:8000"]', language="yaml")
        return
    try:
        url = normalize_url(str(url_text), "Prometheus URL")
        selector = promql.parse_selector(str(selector_text or ""))
    except ValueError as exc:
        st.error(md_escape(exc))
        return
    fleet(url, selector, itl, ttft)


def gpu_section(joined: Mapping[str, GpuJoin]) -> None:
    """The GPUs behind each instance: dcgm-exporter's series in the same Prometheus, joined by pod or host."""
    st.subheader("GPUs (dcgm-exporter, through Prometheus)")
    if not joined:
        st.info("No GPU series joined to these instances: this Prometheus has no `DCGM_FI_DEV_*` series, or none "
                "shares a pod (`pod`/`namespace`, or `exported_pod`) or a host (the `instance` host or `Hostname`) "
                "with a vLLM instance. Scrape NVIDIA's dcgm-exporter (port 9400) in the same Prometheus.")
        return
    for instance, join in sorted(joined.items()):
        last = join.last
        for device in last.devices if last is not None else ():
            if device.throttles:
                st.warning(f"{md_escape(instance)} · {md_escape(device.label)} throttled: "
                           f"{md_escape(', '.join(clock_event_names(device.throttles)))} (no vLLM flag fixes this).")
    st.dataframe(fleet_view.gpu_frame(joined), hide_index=True, width="stretch", key="fleet-gpus", placeholder="—")
    st.caption("Joined by pod when dcgm-exporter maps GPUs to pods and the vLLM target carries `pod` labels, else "
               "by host: every GPU of the node an instance runs on.")


@st.fragment(run_every=max(10, state.refresh_seconds()))
def fleet(url: str, selector: str, itl: float, ttft: float) -> None:
    range_s, step_s = state.prom_range_seconds(), state.prom_step_seconds()
    every = max(10, state.refresh_seconds())
    last = st.session_state.get(state.FLEET_LAST)
    try:
        report = fleet_view.report(url, selector, range_s, itl, ttft, fleet_view.tick(every))
        st.session_state[state.FLEET_LAST] = (url, selector, time.time(), report)
    except TargetError as exc:
        st.error(md_escape(exc))
        if not last or last[:2] != (url, selector):
            return
        st.warning(f"Showing what Prometheus answered at {fmt_when(last[2])}; retrying every {every} s.")
        report = last[3]
    if not report.rows:
        st.info(f"Prometheus answers, but has no vLLM series for `{{{md_escape(selector)}}}` in the last "
                f"{state.get(state.PROM_RANGE)}.")
        return
    table(report.rows, report.findings, report.outliers, lambda page, row: fleet_view.link(page, url, selector, row),
          f"No replica needs action over the last {state.get(state.PROM_RANGE)}.")
    st.caption(f"{len(report.rows)} instances · {report.num_queries} queries to Prometheus for this view · "
               f"scrape interval {report.window.scrape_interval:g} s · as of {fmt_when(report.window.end)}")
    gpu_section(report.gpus)
    drawn = report.charts
    if step_s:  # a step of the user's choice: the charts again at that resolution
        drawn = fleet_view.charts(url, selector, range_s, step_s, fleet_view.tick(every))
    charts(drawn, report.outliers)


if source == fleet_view.DIRECT:
    direct_page()
else:
    prometheus_page()
