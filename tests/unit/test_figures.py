"""Figure builders: what they draw and their empty states (None, never an empty chart)."""

from __future__ import annotations

from pathlib import Path

from diagnostics.core.figures.live import (
    gpu_memory_figure,
    kv_usage_figure,
    latency_figure,
    outcomes_figure,
    queue_figure,
)
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.gpu import GpuDevice
from diagnostics.recording import read_recording
from tests.conftest import fixture_text
from tests.unit.synth import scrape

INCIDENTS = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"


def test_gpu_memory_figure_shows_total_used_pool_and_the_utilization_line() -> None:
    snap = parse_snapshot(fixture_text("metrics-0.32.0-burst.txt"))
    gpus = [GpuDevice(0, "H200", 120 * 2**30, 141 * 2**30)]
    fig = gpu_memory_figure(gpus, snap.cache_config, snap)
    assert fig is not None
    assert [t.name for t in fig.data] == ["total", "used (all processes)", "KV pool (kv_cache_memory_bytes)",
                                          "KV in use"]
    assert fig.data[2].x[0] == 1.0  # the 1 GiB pool of the captured server
    assert fig.layout.shapes[0].x0 == 0.92 * 141  # gpu_memory_utilization × total


def test_no_gpu_reading_is_no_figure() -> None:
    assert gpu_memory_figure([], None, None) is None


def test_empty_states() -> None:
    idle = [scrape(float(t)) for t in range(5)]
    assert outcomes_figure(idle) is None
    assert latency_figure(idle, "time_to_first_token_seconds", 60) is None
    assert kv_usage_figure([], None) is None


def test_preemptions_are_marked_on_the_kv_chart() -> None:
    history = [scrape(float(t), usage=0.99, preempt=3 * (t >= 2)) for t in range(4)]
    fig = kv_usage_figure(history, None)
    assert fig is not None and fig.data[1].name == "preemptions" and list(fig.data[1].customdata) == [3.0]


def test_queue_chart_marks_admission_rejections_as_many_as_the_clients_got_503s() -> None:
    from tests.fixtures.incidents.corpus import labels

    name = "admission_queued_reqs"
    history = read_recording(INCIDENTS / f"{name}.jsonl.gz").scrapes()
    fig = queue_figure(history, 4)
    assert fig is not None
    marks = [t for t in fig.data if t.name == "rejected (HTTP 503)"]
    assert len(marks) == 1 and sum(marks[0].customdata) == labels()[name]["clients"]["failed"]
