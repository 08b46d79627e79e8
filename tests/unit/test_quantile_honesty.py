"""A quantile whose rank falls in a histogram's first bucket is a bound, not a number: on a real
healthy recording every request waited less than vLLM's first queue-time bucket (0.3 s), so the
queue-time p95 reads "< 300 ms" in the headline, the CLI text and JSON, and the chart draws no
invented line (interpolation said 285 ms before)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from diagnostics.core.figures.live import latency_figure
from diagnostics.core.metrics.derive import derive_state
from diagnostics.core.text import fmt_latency
from diagnostics.recording import read_recording

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = ROOT / "tests" / "fixtures" / "incidents" / "healthy_closed_loop.jsonl.gz"


def test_the_headline_value_is_a_bound() -> None:
    scrapes = read_recording(HEALTHY).scrapes()
    q = derive_state(scrapes, window_seconds=600).quantile("request_queue_time_seconds", 0.95)
    assert q is not None and q.bound == "below" and q.upper == 0.3
    assert fmt_latency(q) == "< 300 ms"


def test_the_cli_says_so_in_text_and_json() -> None:
    args = [sys.executable, "-m", "diagnostics", "status", "--replay", str(HEALTHY), "--window", "600"]
    text = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "Queue time    p50 < 300 ms   p95 < 300 ms" in text.stdout
    obj = json.loads(subprocess.run([*args, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout)
    assert obj["queue_p95_bound"] == "<" and obj["queue_p95_seconds"] == 0.3


def test_the_chart_draws_no_invented_line_in_the_first_bucket() -> None:
    fig = latency_figure(read_recording(HEALTHY).scrapes(), "request_queue_time_seconds", 60)
    assert fig is not None
    lines = [t for t in fig.data if t.mode == "lines"]
    assert lines and all(y is None for t in lines for y in t.y)
    marks = [t for t in fig.data if t.mode == "markers"]
    assert marks and all(y == 300.0 for t in marks for y in t.y)
    assert all(text.startswith("< 300 ms") for t in marks for text in t.customdata)
