"""Text helpers: evidence in units a person reads (the JSON keeps SI units)."""

from __future__ import annotations

from diagnostics.core.text import evidence_rows


def test_evidence_reads_in_units_a_person_reads() -> None:
    rows = dict(evidence_rows({
        "itl_p95_seconds": 0.0421, "ttft_p95_seconds": 12.5, "max_kv_cache_usage_perc": 0.987,
        "kv_cache_memory_bytes": 64 * 2**20, "itl_budget_ms": 50.0, "preemptions": 1234.0, "ongoing": True,
        "num_requests_running_at_onset": 10, "window": {"start": 0.0, "end": 0.0, "seconds": 59.6},
    }))
    assert rows["itl p95"] == "42 ms" and rows["ttft p95"] == "12.5 s"
    assert rows["max kv cache usage"] == "98.7 %" and rows["kv cache memory"] == "64.0 MiB"
    assert rows["itl budget"] == "50 ms" and rows["preemptions"] == "1,234" and rows["ongoing"] == "yes"
    assert rows["requests running at onset"] == "10" and rows["window"].startswith("60 s ending ")


def test_a_bounded_quantile_reads_as_its_bound_in_one_row() -> None:
    rows = evidence_rows({"itl_p95_seconds": 0.01, "itl_p95_bound": "<", "ttft_p95_seconds": 0.5,
                          "ttft_p95_bound": None})
    assert rows == [("itl p95", "< 10 ms"), ("ttft p95", "500 ms")]
