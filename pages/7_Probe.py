"""Probe: verify under load. A bounded burst of streaming requests timed by the client, watched on
the engine's own charts while it runs, the server's histograms beside the client's numbers, and
two runs side by side (before and after a flag change)."""

import hashlib
import json
import time

import streamlit as st

from diagnostics.core.probe import MAX_CONCURRENCY, MAX_REQUESTS, MAX_SECONDS, ProbeSpec, comparison, disagreements
from diagnostics.core.text import fmt_when, md_escape
from diagnostics.recording import encode_recording
from diagnostics.sources.probe_http import ProbeRefused
from diagnostics.ui import probe_view, resources, shell

target = shell.page("Probe")
if target is None:
    st.info("Pick a target in the sidebar first.")
    st.stop()
if target.prometheus is not None:
    st.info("A probe sends requests to a server's own URL; an instance read through Prometheus has none here. "
            "Pick the server by URL in the sidebar.")
    st.stop()

def _digest(spec: ProbeSpec, where: str) -> str:
    return hashlib.sha256(json.dumps([spec.to_json(), where], sort_keys=True).encode()).hexdigest()[:12]


running = probe_view.running()
with st.container(border=True):
    c1, c2, c3, c4 = st.columns(4)
    concurrency = c1.number_input("Concurrent clients", 1, MAX_CONCURRENCY, 8, key="probe_concurrency")
    mode = c1.radio("Send", ["a number of requests", "for a duration"], key="probe_mode", horizontal=True)
    if mode == "a number of requests":
        amount = c2.number_input("Requests", 1, MAX_REQUESTS, 32, key="probe_requests")
    else:
        amount = c2.number_input("Seconds", 1.0, MAX_SECONDS, 30.0, key="probe_seconds")
    n = c2.number_input("n (samples per request)", 1, 16, 1, key="probe_n")
    prompt_tokens = c3.number_input("Prompt tokens", 1, 32768, 128, key="probe_prompt")
    max_tokens = c3.number_input("Max output tokens", 1, 4096, 64, key="probe_max_tokens")
    shared = c4.number_input("Shared prefix tokens", 0, 32768, 0, key="probe_shared",
                             help="Every prompt starts with the same tokens (exercises prefix caching).")
    ignore_eos = c4.checkbox("ignore EOS", value=True, key="probe_ignore_eos",
                             help="Exactly max tokens per request, as `vllm bench serve --ignore-eos`.")
    spec = ProbeSpec(
        concurrency=int(concurrency),
        requests=int(amount) if mode == "a number of requests" else None,
        seconds=float(amount) if mode == "for a duration" else None,
        prompt_tokens=int(prompt_tokens), max_tokens=int(max_tokens), shared_prefix_tokens=int(shared), n=int(n),
        ignore_eos=ignore_eos,
    )
    where = target.url if target.label == target.url else f"{target.label} ({target.url})"
    load = spec.describe(where)
    # The tick belongs to this very load and this one run: change a number, or run once, and it
    # has to be given again.
    run_no = len(probe_view.results()) + (running is not None)
    confirm = st.checkbox(f"I mean to add this load: {md_escape(load)}",
                          key=f"probe_confirm_{_digest(spec, where)}_{run_no}")
    go = st.button("Start probe", type="primary", disabled=running is not None)

if go:
    if not confirm:
        st.warning("Tick the box that names the load first: the probe loads a server that may be in trouble.")
    elif spec.problems():
        st.error("Refused: " + md_escape("; ".join(spec.problems())))
    else:
        try:
            probe_view.start(target.url, spec, target.api_key, resources.source(target))
            st.rerun()
        except ProbeRefused as exc:
            st.error(f"Refused: {md_escape(exc)}")


@st.fragment(run_every=1.0)
def progress() -> None:
    probe = probe_view.running()
    if probe is None:
        return
    sent, finished, failed = probe.progress()
    total = probe.spec.requests
    if total is not None:
        fraction = finished / total
        text = f"{finished} of {total} finished · {failed} failed · {sent - finished} in flight"
    else:
        elapsed = time.time() - (probe.started or time.time())
        fraction = min(1.0, elapsed / (probe.spec.seconds or 1))
        text = f"{elapsed:.0f} of {probe.spec.seconds:g} s · {finished} finished · {failed} failed"
    st.progress(min(fraction, 1.0), text=text)
    if st.button("Cancel probe", key="probe_cancel"):
        probe.cancel()
    probe_view.charts_over(resources.source(target), probe.started or time.time(), None, key="running")
    if probe.done:
        probe_view.finish(resources.source(target))
        st.rerun()


progress()

results = probe_view.results()
if not results:
    st.caption("No probe yet in this session. The results of every probe you run here stay until the tab closes.")
    st.stop()

latest = results[-1].summary
st.subheader(f"Last probe · {fmt_when(latest.started)}" + (" · cancelled" if latest.cancelled else ""))
if latest.failure:
    st.error(md_escape(latest.failure))
m = st.columns(5)
m[0].metric("Completed", f"{len(latest.ok)} / {len(latest.results)}")
m[1].metric("Errors", latest.num_errors)
m[2].metric("Output tok/s", f"{latest.output_tokens_per_second:.1f}")
m[3].metric("Requests/s", f"{latest.requests_per_second:.2f}")
m[4].metric("Duration", f"{latest.duration:.1f} s")
errors_by_kind = latest.errors_by_kind()
if errors_by_kind:
    st.warning("Errors by kind: " + ", ".join(f"{md_escape(k)} {v}" for k, v in errors_by_kind.items()))
    for kind, detail in latest.error_details().items():
        st.caption(f"first {md_escape(kind)}: {md_escape(detail)}")
st.dataframe(probe_view.latency_table(latest), hide_index=True, use_container_width=True)
st.caption("Server columns: the server's own histograms over the probe's window (a bucket, since a histogram "
           "knows no more); they include any other traffic the server had meanwhile.")
found = disagreements(latest)
if found:
    st.info("Where the clients and the server's histograms disagree (network, queueing in the API server, or "
            "the client's own load — on a small machine the probe shares the CPU with the server):\n"
            + "\n".join(f"- {md_escape(d.text.split(' (network')[0])}" for d in found))
probe_view.distributions(latest)
probe_view.charts_over(resources.source(target), latest.started, latest.ended, key="done")

d1, d2 = st.columns(2)
d1.download_button("Download the result (.json)", json.dumps(results[-1].to_json(), indent=1), file_name="probe.json",
                   mime="application/json", on_click="ignore")
collector = resources.source(target)
records = [r for r in collector.recent_records() if latest.started - 10 <= r.ts <= latest.ended + 10]
d2.download_button("Download the recording of its window (.jsonl.gz)", encode_recording(records),
                   file_name="probe-window.jsonl.gz", mime="application/gzip", on_click="ignore",
                   disabled=not records)

if len(results) >= 2:
    st.subheader("Before / after")
    labels = [probe_view.label(r) for r in results]
    b1, b2 = st.columns(2)
    before = b1.selectbox("Before", labels, index=len(labels) - 2, key="probe_before")
    after = b2.selectbox("After", labels, index=len(labels) - 1, key="probe_after")
    rows = comparison(results[labels.index(before)].summary, results[labels.index(after)].summary)
    st.dataframe(probe_view.comparison_frame(rows), hide_index=True, use_container_width=True)
