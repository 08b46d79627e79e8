"""AppTest: the Diagnose page's "find a change that meets the budget" button on a real recording
(queue_cap_closed_loop: 20 closed-loop clients on --max-num-seqs 6, TTFT p95 tens of seconds)."""

from __future__ import annotations

from pathlib import Path

from tests.app.test_pages import app

ROOT = Path(__file__).resolve().parents[2]
QUEUE = ROOT / "tests" / "fixtures" / "incidents" / "queue_cap_closed_loop.jsonl.gz"


def test_the_budget_button_finds_a_higher_cap_for_a_queue_at_the_cap() -> None:
    at = app("pages/3_Diagnose.py").run()
    at.radio(key="diagnose_source").set_value("a recording").run()
    at.file_uploader[0].upload("queue.jsonl.gz", QUEUE.read_bytes(), "application/gzip")
    at.number_input(key="diag_ttft").set_value(2000.0)
    at.run()
    assert not at.exception
    at.button(key="diag_goal").click().run()
    assert not at.exception
    assert any("Smallest change that meets the budget" in s.value and "--max-num-seqs" in s.value for s in at.success), \
        [s.value for s in at.success]
    table = next(d.value for d in at.dataframe if "meets every goal" in d.value.columns)
    assert table.iloc[0]["meets every goal"] == "yes" and "--max-num-seqs" in table.iloc[0]["change"]
    assert "TTFT p95" in table.columns and "(" in table.iloc[0]["TTFT p95"]  # "~238 ms (167–329)"


def test_the_budget_button_without_a_budget_asks_for_one() -> None:
    at = app("pages/3_Diagnose.py").run()
    at.radio(key="diagnose_source").set_value("a recording").run()
    at.file_uploader[0].upload("queue.jsonl.gz", QUEUE.read_bytes(), "application/gzip")
    at.run()
    at.button(key="diag_goal").click().run()
    assert not at.exception
    assert any("Set an ITL or a TTFT budget" in i.value for i in at.info)


def test_a_card_whose_window_the_replay_does_not_reproduce_shows_no_after_value() -> None:
    """hol_long_prefills: the head-of-line card says the simulator does not reproduce the window,
    with the recorded ITL p99 (computed here from the recording), and draws no prediction chart."""
    from diagnostics.core.metrics.derive import histogram_delta, histogram_quantile
    from diagnostics.recording import read_recording

    path = ROOT / "tests" / "fixtures" / "incidents" / "hol_long_prefills.jsonl.gz"
    ok = [s for s in read_recording(path).scrapes() if s.snapshot is not None]
    p99 = histogram_quantile(0.99, histogram_delta(ok, "inter_token_latency_seconds"))
    assert p99 is not None
    at = app("pages/3_Diagnose.py").run()
    at.radio(key="diagnose_source").set_value("a recording").run()
    at.file_uploader[0].upload("hol.jsonl.gz", path.read_bytes(), "application/gzip")
    at.run()
    assert not at.exception
    said = [w.value for w in at.warning if "does not reproduce this window" in w.value]
    assert said and f"{p99 * 1000:,.0f} ms recorded" in said[0], [w.value for w in at.warning]
    assert not any("Predicted:" in c.value and "ITL p99" in c.value for c in at.caption)
