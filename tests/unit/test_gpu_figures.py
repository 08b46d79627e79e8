"""The GPU panel's builders: one line per device in the units people read, the limit dotted beside
it, a ✕ where the clock was throttled, nothing drawn when no device reported the field; and the
per-device rows with the reasons by name."""

from __future__ import annotations

from pathlib import Path

from diagnostics.core.figures.gpu import gpu_figure
from diagnostics.core.metrics.dcgm import parse_dcgm
from diagnostics.core.metrics.gpu import GpuDevice, GpuReading
from diagnostics.core.text import gpu_rows

H100 = (Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "dcgm-exporter-h100x2-custom-counters.txt")
READING = parse_dcgm(H100.read_text())
HISTORY = [(1000.0, READING), (1001.0, READING), (1002.0, READING)]


def test_utilisation_is_drawn_in_percent_per_device_with_memory_busy_dotted() -> None:
    fig = gpu_figure(HISTORY, "utilization")
    assert fig is not None
    names = [t.name for t in fig.data]
    assert names == ["GPU 0 · NVIDIA H100 80GB HBM3 @ gpu-node-7", "GPU 0 · NVIDIA H100 80GB HBM3 @ gpu-node-7 · memory busy",
                     "GPU 1 · NVIDIA H100 80GB HBM3 @ gpu-node-7", "GPU 1 · NVIDIA H100 80GB HBM3 @ gpu-node-7 · memory busy"]
    assert list(fig.data[0].y) == [100.0] * 3 and list(fig.data[1].y) == [63.0] * 3  # 100 % and 63 %
    assert fig.data[1].line.dash == "dot" and fig.layout.yaxis.title.text == "%"


def test_power_is_drawn_against_its_enforced_limit_in_watts() -> None:
    fig = gpu_figure(HISTORY, "power")
    assert fig is not None and fig.layout.yaxis.title.text == "W"
    assert list(fig.data[0].y) == [512.314] * 3 and list(fig.data[1].y) == [700.0] * 3


def test_the_clock_chart_marks_the_throttled_readings_of_the_throttled_device_only() -> None:
    fig = gpu_figure(HISTORY, "clocks")
    assert fig is not None
    marks = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in marks] == ["GPU 0 · NVIDIA H100 80GB HBM3 @ gpu-node-7 · throttled"]
    assert list(marks[0].y) == [1275.0] * 3
    assert list(marks[0].customdata) == ["SW thermal slowdown, HW thermal slowdown"] * 3


def test_a_field_no_device_reported_draws_nothing() -> None:
    bare = [(0.0, GpuReading((GpuDevice(0, "NVIDIA L4", 1, 2),)))]
    assert gpu_figure(bare, "temperature") is None
    assert gpu_figure([], "power") is None


def test_the_rows_name_the_reasons_and_say_when_none_were_reported() -> None:
    hot, cool = gpu_rows(READING)
    assert hot.clock_events == "SW thermal slowdown, HW thermal slowdown" and cool.clock_events == "none"
    assert (hot.utilization, hot.temperature, hot.power, hot.sm_clock) == (
        "100 %", "89 °C (slowdown 87)", "512 W of 700", "1275 MHz of 1980")
    [unknown] = gpu_rows(GpuReading((GpuDevice(0, "NVIDIA L4", 1, 2),)))
    assert (unknown.clock_events, unknown.power) == ("not reported", "—")
