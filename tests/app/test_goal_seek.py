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
    """heldout/ho_kv_bytes_wide: the KV-pressure card says the simulator does not reproduce the
    window, with the recorded preemptions a minute (computed here from the recording's counter),
    and predicts nothing."""
    from diagnostics.recording import read_recording

    path = ROOT / "tests" / "fixtures" / "incidents" / "heldout" / "ho_kv_bytes_wide.jsonl.gz"
    ok = [s for s in read_recording(path).scrapes() if s.snapshot is not None]
    assert ok[0].snapshot is not None and ok[-1].snapshot is not None
    rate = ((ok[-1].snapshot.value("num_preemptions") or 0) - (ok[0].snapshot.value("num_preemptions") or 0)) \
        / (ok[-1].ts - ok[0].ts) * 60
    at = app("pages/3_Diagnose.py").run()
    at.radio(key="diagnose_source").set_value("a recording").run()
    at.file_uploader[0].upload("kv.jsonl.gz", path.read_bytes(), "application/gzip")
    at.run()
    assert not at.exception
    said = [w.value.replace("\\", "") for w in at.warning if "does not reproduce this window" in w.value]
    assert said and f"{rate:.1f} recorded" in said[0], [w.value for w in at.warning]  # markdown-escaped
    assert not any("Predicted:" in c.value and "preemptions" in c.value for c in at.caption)
