"""The live roofline: vLLM's per-GPU work estimates as rates, against a device's datasheet peaks
(matched from the NVML name), in words an on-call engineer reads."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from diagnostics.core.figures.live import roofline_figure
from diagnostics.core.hardware import peak_for
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape, roofline
from diagnostics.core.text import roofline_text
from tests.conftest import fixture_text


def work(rows: Sequence[tuple[float, float, float]]) -> list[Scrape]:
    lab = 'engine="0",model_name="m"'
    return [Scrape(float(t), parse_snapshot(f"vllm:estimated_flops_per_gpu_total{{{lab}}} {f}\n"
                                            f"vllm:estimated_read_bytes_per_gpu_total{{{lab}}} {r}\n"
                                            f"vllm:estimated_write_bytes_per_gpu_total{{{lab}}} {w}\n"))
            for t, (f, r, w) in enumerate(rows)]


def test_rates_and_intensity_from_the_counters() -> None:
    # 10 TFLOP and 2 TB read + 0.5 TB written each second.
    roof = roofline(work([(10e12 * t, 2e12 * t, 0.5e12 * t) for t in range(5)]))
    assert roof is not None
    assert (roof.flops_per_second, roof.bytes_per_second, roof.flops_per_byte) == (10e12, 2.5e12, 4.0)


def test_memory_bound_decode_in_words_against_an_h100() -> None:
    roof = roofline(work([(10e12 * t, 2e12 * t, 0.5e12 * t) for t in range(5)]))
    peak = peak_for("NVIDIA H100 80GB HBM3")
    assert peak is not None and peak.name == "H100 SXM"
    text = roofline_text(roof, peak)
    # 4 FLOP/byte is far below the H100's ridge (989e12 / 3.35e12 ≈ 295): memory-bound,
    # 2.5 / 3.35 = 75 % of bandwidth, 10 / 989 = 1.0 % MFU.
    assert text is not None and "memory-bound at 75 % of the H100 SXM's HBM bandwidth (MFU 1.0 %)" in text


def test_compute_bound_prefill_in_words() -> None:
    # 400 FLOP/byte, above the A100's ridge (312e12 / 2.039e12 ≈ 153): compute-bound at
    # 200 / 312 = 64.1 % MFU, 0.5 / 2.039 = 25 % of bandwidth.
    roof = roofline(work([(200e12 * t, 0.5e12 * t, 0.0) for t in range(5)]))
    text = roofline_text(roof, peak_for("NVIDIA A100-SXM4-80GB"))
    assert text is not None and "compute-bound at MFU 64.1 % of the A100 80GB SXM's peak (25 % of bandwidth)" in text


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200 SXM"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"), ("Tesla T4", None), ("", None),
])
def test_device_names_map_to_their_datasheet(name: str, expected: str | None) -> None:
    peak = peak_for(name)
    assert (peak.name if peak else None) == expected


def test_a_real_032_server_without_mfu_metrics_has_no_roofline() -> None:
    """vLLM 0.32 exports the counters by default but leaves them at 0 without --enable-mfu-metrics."""
    snap = parse_snapshot(fixture_text("metrics-0.32.0-burst.txt"))
    assert snap.value("estimated_flops_per_gpu") == 0.0
    scrapes = [Scrape(0.0, snap), Scrape(1.0, snap)]
    assert roofline(scrapes) is None and roofline_figure(scrapes) is None and roofline_text(None, None) is None


def test_the_figure_shows_percent_of_peak_when_the_device_is_known() -> None:
    scrapes = work([(10e12 * t, 2e12 * t, 0.5e12 * t) for t in range(10)])
    fig = roofline_figure(scrapes, peak_for("NVIDIA H100 80GB HBM3"))
    assert fig is not None and [t.name for t in fig.data] == ["compute (MFU)", "memory bandwidth"]
    assert fig.data[1].y[-1] == pytest.approx(2.5e12 / 3.35e12 * 100)
    plain = roofline_figure(scrapes)
    assert plain is not None and plain.data[0].y[-1] == pytest.approx(10.0) and plain.data[0].name == "TFLOP/s"
    assert plain.data[1].name == "memory TB/s" and plain.data[1].y[-1] == pytest.approx(2.5)
    small = roofline_figure(work([(2e9 * t, 1e8 * t, 0.0) for t in range(10)]))  # a CPU's few GFLOP/s
    assert small is not None and small.data[0].name == "GFLOP/s" and small.data[1].name == "memory MB/s"
    assert small.data[0].y[-1] == pytest.approx(2.0) and small.data[1].y[-1] == pytest.approx(100.0)
