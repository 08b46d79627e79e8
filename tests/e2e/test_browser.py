"""A real browser (Debian's Chromium driven by Playwright) on `streamlit run app.py` attached to a
real vllm serve: every page loads, the live panel's numbers move under a burst, a target that
dies turns the banner red while the charts keep their history. Screenshots go to
``test-artifacts/`` (``$ARTIFACTS_DIR``)."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.conftest import wait_for
from tests.e2e.shots import diagnose_with_cap
from tests.integration import load
from tests.integration.vllm_server import VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR", ROOT / "test-artifacts"))
RECORDING = ROOT / "tests" / "fixtures" / "recording-tiny-burst-0.32.0.jsonl.gz"


def shoot(page: Page, name: str) -> None:
    """The screenshot a person looks at — never of a page showing a Streamlit exception box."""
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def metric_value(page: Page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has=page.get_by_text(label, exact=True)).first
    return box.locator('[data-testid="stMetricValue"]').inner_text()


def test_overview_shows_the_real_server(page: Page, streamlit_url: str) -> None:
    page.goto(streamlit_url)
    expect(page.get_by_text("Up ·", exact=False).first).to_be_visible()
    expect(page.get_by_text("0.32.0").first).to_be_visible()
    assert metric_value(page, "Block size") == "128 tokens"
    assert metric_value(page, "num_gpu_blocks") == "1,024"
    shoot(page, "overview.png")


def test_live_numbers_move_during_a_burst(page: Page, streamlit_url: str, vllm_main: VllmServer) -> None:
    page.goto(streamlit_url + "/Live")
    expect(page.get_by_text("KV-cache block usage").first).to_be_visible()
    # 40 clients in a closed loop until the panel has moved and the charts are drawn (at most 300 s,
    # longer than both waits): load for as long as the page needs,
    # however fast the server drains a fixed burst.
    clients, stop = load.Clients(), threading.Event()
    thread = load.closed_loop(vllm_main.url, clients, 40, 300.0, lambda: {"prompt": "decode " * 8, "max_tokens": 200},
                              stop=stop)
    seen: set[str] = set()

    def moved() -> bool:
        seen.add(metric_value(page, "Generation tok/s"))
        return len(seen) >= 3 and any(re.match(r"[1-9]", v) for v in seen)

    # KV, queue, prefix, throughput, TTFT, ITL at least (e2e and queue time need finished requests);
    # a latency chart is drawn once an interval has observations, which a busy host can take a while to give.
    def drawn() -> int:
        return int(page.locator(".js-plotly-plot").count())

    try:
        wait_for(moved, timeout=120, step=0.5)
        wait_for(lambda: drawn() >= 6, timeout=120, step=0.5)
        shoot(page, "live-burst.png")
    finally:
        stop.set()
        thread.join(300)
    assert set(clients.statuses) == {200}, clients.summary()
    assert any(re.match(r"[1-9]", v) for v in seen), seen
    assert len(seen) >= 3, seen
    assert drawn() >= 6, page.locator("[data-testid='stAlert']").all_inner_texts()


def test_replay_page_opens_a_recording(page: Page, streamlit_url: str) -> None:
    page.goto(streamlit_url + "/Replay")
    expect(page.get_by_text("Upload a recording").first).to_be_visible()
    page.locator('input[type="file"]').set_input_files(str(RECORDING))
    expect(page.get_by_text("31 scrapes").first).to_be_visible()
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    page.wait_for_timeout(1500)
    shoot(page, "replay.png")


def test_a_target_that_dies_turns_the_banner_and_keeps_the_charts(
    page: Page, streamlit_url: str, vllm_tiny: VllmServer
) -> None:
    page.goto(streamlit_url + "/Live")
    page.get_by_label("Server").click()
    page.get_by_role("option", name="custom URL…").click()
    url_box = page.get_by_label("vLLM URL")
    url_box.fill(vllm_tiny.url)
    url_box.press("Enter")
    expect(page.get_by_text(f"Up · {vllm_tiny.url}").first).to_be_visible()
    load.completions(vllm_tiny.url, 10, max_tokens=32)
    page.wait_for_timeout(3000)
    vllm_tiny.kill9()  # the next module that needs the server starts it again (tests/conftest.py)
    expect(page.get_by_text("Down ·").first).to_be_visible()
    expect(page.get_by_text("cannot reach").first).to_be_visible()
    assert page.locator(".js-plotly-plot").count() >= 4
    shoot(page, "live-target-down.png")


def _diagnose_recording(page: Page, url: str, recording: Path) -> None:
    page.goto(url + "/Diagnose")
    expect(page.get_by_text("Knob table").first).to_be_visible()
    page.get_by_text("a recording", exact=True).first.click()
    page.locator('input[type="file"]').set_input_files(str(recording))


def test_diagnose_page_names_the_knob_for_a_recording(page: Page, streamlit_url: str) -> None:
    _diagnose_recording(page, streamlit_url, RECORDING)
    expect(page.get_by_text("KV-cache pressure").first).to_be_visible()
    # The recorded server pinned its KV cache (--num-gpu-blocks-override 12): the diff raises the pin.
    expect(page.get_by_text("--num-gpu-blocks-override 18").first).to_be_visible()
    expect(page.get_by_text("--gpu-memory-utilization 0.35")).to_have_count(0)
    page.wait_for_timeout(1000)
    shoot(page, "diagnose.png")


def test_diagnose_page_names_head_of_line_blocking_on_a_real_incident(page: Page, streamlit_url: str) -> None:
    _diagnose_recording(page, streamlit_url, ROOT / "tests" / "fixtures" / "incidents" / "hol_p99_only.jsonl.gz")
    expect(page.get_by_text("Head-of-line blocking").first).to_be_visible()
    expect(page.get_by_text("--max-num-batched-tokens").first).to_be_visible()
    page.wait_for_timeout(1000)
    shoot(page, "diagnose-head-of-line.png")


def test_a_cap_raise_past_what_the_window_ran_says_the_ttft_range_grows_the_api_servers_share(
        page: Page, streamlit_url: str) -> None:
    """The validation's real queue_cap_burst recording (40 requests at once against a cap of 4): the
    queue card's --max-num-seqs 40 runs more streams than the window did, and its caption names the
    share the replay adds to every TTFT — the recording's mean end-to-end latency less its mean queue
    and inference time, computed here from its histograms — and that the range grows it."""
    from diagnostics.core.metrics.derive import histogram_delta
    from diagnostics.recording import read_recording

    recording = ROOT / "bench" / "whatif_runs" / "2026-12-06" / "queue_cap_burst-before.jsonl.gz"
    ok = [s for s in read_recording(recording).scrapes() if s.snapshot is not None]
    means = []
    for concept in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds"):
        h = histogram_delta(ok, concept)
        assert h is not None and h.count
        means.append(h.sum / h.count)
    share_ms = round((means[0] - means[1] - means[2]) * 1000)
    _diagnose_recording(page, streamlit_url, recording)
    expect(page.get_by_text("--max-num-seqs 40").first).to_be_visible()
    caption = page.get_by_text(f"TTFT: {share_ms} ms of each TTFT outside the engine (the API server)").first
    expect(caption).to_be_visible()
    expect(caption).to_contain_text("so the TTFT range also grows that share with the streams in flight")


def test_a_queue_held_by_the_token_budget_is_named_with_the_seat_cap_ruled_out(page: Page, streamlit_url: str) -> None:
    """Issue 41 on a real held-out recording: requests waited with seats free under --max-num-seqs 8 and
    --max-num-batched-tokens 32. With the cap typed into the sidebar the card names the token budget,
    lists the seat cap as ruled out by the running count's peak (read here from the recording), and
    suggests no --max-num-seqs change."""
    from diagnostics.recording import read_recording

    recording = ROOT / "tests" / "fixtures" / "incidents" / "heldout" / "alt_queue_token_budget_h8.jsonl.gz"
    peak = max((s.snapshot.value("num_requests_running") or 0) for s in read_recording(recording).scrapes()
               if s.snapshot is not None)
    cap = diagnose_with_cap(page, streamlit_url, recording, 8)
    expect(page.get_by_text("Queueing at the token budget").first).to_be_visible()
    expect(page.get_by_text("Ruled out", exact=True).first).to_be_visible()
    expect(page.get_by_text(f"running peaked at {peak:.0f} of --max-num-seqs 8").first).to_be_visible()
    expect(page.get_by_text("--max-num-batched-tokens 512").first).to_be_visible()
    # The diff repeats the server's own --max-num-seqs 8; no other value of it is suggested anywhere.
    expect(page.get_by_text(re.compile(r"--max-num-seqs (?!8\b)\d+"))).to_have_count(0)
    page.wait_for_timeout(1000)
    shoot(page, "diagnose-token-budget.png")
    cap.fill("0")
    cap.press("Enter")


def test_paged_attention_and_capacity_pages(page: Page, streamlit_url: str) -> None:
    page.goto(streamlit_url + "/PagedAttention")
    expect(page.get_by_text("1 · Block size is a trade-off").first).to_be_visible()
    expect(page.get_by_text("130", exact=True).first).to_be_visible()
    page.wait_for_timeout(1000)
    shoot(page, "paged-attention.png")
    page.goto(streamlit_url + "/Capacity")
    expect(page.get_by_text("72.0 GB").first).to_be_visible()
    expect(page.get_by_text("= the server's kv_cache_size_tokens").first).to_be_visible()
    shoot(page, "capacity.png")


def test_a_real_hung_rank_shows_engines_side_by_side_and_is_named(page: Page, streamlit_url: str) -> None:
    """The real --data-parallel-size 2 recording whose rank 1 was SIGSTOPped (see labels.json)."""
    recording = ROOT / "tests" / "fixtures" / "incidents" / "hung_rank_dp2.jsonl.gz"
    page.goto(streamlit_url + "/Replay")
    expect(page.get_by_text("Upload a recording").first).to_be_visible()
    page.locator('input[type="file"]').set_input_files(str(recording))
    expect(page.get_by_text("Engines side by side").first).to_be_visible()
    for title in ("KV-cache usage by engine", "Generated tokens by engine", "Running by engine", "Waiting by engine"):
        expect(page.locator(".js-plotly-plot", has_text=title)).to_have_count(1)
    # Both engines are drawn as lines in the tokens chart (legend entries).
    tokens = page.locator(".js-plotly-plot", has_text="Generated tokens by engine")
    expect(tokens.get_by_text("engine 0", exact=True)).to_have_count(1)
    expect(tokens.get_by_text("engine 1", exact=True)).to_have_count(1)
    page.wait_for_timeout(1500)
    shoot(page, "replay-engines-side-by-side.png")
    _diagnose_recording(page, streamlit_url, recording)
    expect(page.get_by_text("Hung rank: engine 1").first).to_be_visible()
    expect(page.get_by_text("EngineCore_DP1").first).to_be_visible()
    page.wait_for_timeout(1000)
    shoot(page, "diagnose-hung-rank.png")


def test_rejections_are_marked_on_the_queue_and_deferred_waiting_names_max_loras(page: Page, streamlit_url: str) -> None:
    incidents = ROOT / "tests" / "fixtures" / "incidents"
    page.goto(streamlit_url + "/Replay")
    expect(page.get_by_text("Upload a recording").first).to_be_visible()
    page.locator('input[type="file"]').set_input_files(str(incidents / "admission_queued_reqs.jsonl.gz"))
    queue = page.locator(".js-plotly-plot", has_text="Queue depth")
    expect(queue.get_by_text("rejected (HTTP 503)")).to_have_count(1)
    page.wait_for_timeout(1500)
    shoot(page, "replay-admission-rejections.png")
    _diagnose_recording(page, streamlit_url, incidents / "deferred_lora.jsonl.gz")
    expect(page.get_by_text("Requests wait for a LoRA slot").first).to_be_visible()
    expect(page.get_by_text(re.compile(r"--max-loras 2\b")).first).to_be_visible()
    page.wait_for_timeout(1000)
    shoot(page, "diagnose-deferred-lora.png")


def test_speculation_and_the_roofline_are_drawn_from_a_real_recording(page: Page, streamlit_url: str) -> None:
    """The real n-gram speculation recording (drafts rejected), with --enable-mfu-metrics."""
    page.goto(streamlit_url + "/Replay")
    expect(page.get_by_text("Upload a recording").first).to_be_visible()
    page.locator('input[type="file"]').set_input_files(
        str(ROOT / "tests" / "fixtures" / "incidents" / "spec_ngram_rejected.jsonl.gz"))
    spec = page.locator(".js-plotly-plot", has_text="Speculative decoding: draft acceptance")
    expect(spec).to_have_count(1)
    for name in ("all draft tokens", "position 0", "position 1", "position 2"):
        expect(spec.get_by_text(name, exact=True)).to_have_count(1)
    expect(page.locator(".js-plotly-plot", has_text="Work per GPU (vLLM's estimate)")).to_have_count(1)
    expect(page.get_by_text(re.compile(r"vLLM estimates [\d.,]+ [kMGT]?FLOP/s")).first).to_be_visible()
    page.wait_for_timeout(1500)
    shoot(page, "replay-speculation-roofline.png")
