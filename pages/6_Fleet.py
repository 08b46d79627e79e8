"""Fleet: every vLLM server behind a Prometheus — who is in trouble, what replicas share, and one
click to an instance's Live and Diagnose views (read through Prometheus, hours back)."""

import time
from collections.abc import Mapping

import streamlit as st

from diagnostics.core.figures.fleet import fleet_figure
from diagnostics.core.fleet import promql
from diagnostics.core.fleet.gpus import GpuJoin
from diagnostics.core.metrics.gpu import clock_event_names
from diagnostics.core.targets import normalize_url
from diagnostics.core.text import fmt_when, md_escape
from diagnostics.errors import TargetError
from diagnostics.ui import fleet_view, resources, shell, state

shell.page("Fleet", target_note=False)  # the fleet is not the sidebar's target
config = resources.targets_config()

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
itl = c5.number_input("ITL budget (ms)", min_value=0.0, value=0.0, step=5.0, key="fleet_itl")
ttft = c6.number_input("TTFT budget (ms)", min_value=0.0, value=0.0, step=50.0, key="fleet_ttft")

if not str(url_text or "").strip():
    st.info("Point this page at the Prometheus that scrapes your vLLM servers (or set `prometheus_url` in "
            "`.streamlit/secrets.toml`). A scrape config for vLLM pods:")
    st.code('scrape_configs:\n  - job_name: vllm\n    scrape_interval: 15s\n    static_configs:\n'
            '      - targets: ["vllm-0:8000", "vllm-1:8000"]', language="yaml")
    st.stop()
try:
    url = normalize_url(str(url_text), "Prometheus URL")
    selector = promql.parse_selector(str(selector_text or ""))
except ValueError as exc:
    st.error(md_escape(exc))
    st.stop()


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
    st.dataframe(fleet_view.gpu_frame(joined), hide_index=True, width="stretch", key="fleet-gpus")
    st.caption("Joined by pod when dcgm-exporter maps GPUs to pods and the vLLM target carries `pod` labels, else "
               "by host: every GPU of the node an instance runs on.")


@st.fragment(run_every=max(10, state.refresh_seconds()))
def fleet() -> None:
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
    for finding in report.findings:
        (st.error if finding.severity == "critical" else st.warning)(md_escape(finding.text))
    if not report.findings:
        st.success(f"No replica needs action over the last {state.get(state.PROM_RANGE)}.")
    df = fleet_view.frame(report.rows, lambda page, row: fleet_view.link(page, url, selector, row))
    st.dataframe(fleet_view.styled(df, report.outliers), column_config=fleet_view.column_config(),
                 hide_index=True, use_container_width=True)
    if report.outliers:
        with st.expander(f"Why cells are highlighted ({len({o.instance for o in report.outliers})} replicas)"):
            for o in report.outliers:
                st.markdown(f"- `{md_escape(o.instance)}` · {md_escape(o.key)}: {md_escape(o.why)}")
    st.caption(f"{len(report.rows)} instances · {report.num_queries} queries to Prometheus for this view · "
               f"scrape interval {report.window.scrape_interval:g} s · as of {fmt_when(report.window.end)}")
    gpu_section(report.gpus)
    highlight = {o.instance for o in report.outliers}
    charts = report.charts
    if step_s:  # a step of the user's choice: the charts again at that resolution
        charts = fleet_view.charts(url, selector, range_s, step_s, fleet_view.tick(every))
    cols = st.columns(2)
    for i, (key, (title, unit, _q)) in enumerate(promql.CHART_CONCEPTS.items()):
        fig = fleet_figure(title, unit, charts.get(key, {}), highlight)
        with cols[i % 2]:
            if fig is None:
                st.caption(f"{title}: no data in this range.")
            else:
                st.plotly_chart(fig, use_container_width=True, key=f"fleet-{key}")


fleet()
