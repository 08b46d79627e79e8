"""The probe's pure core: caps, percentiles as numpy computes them, the summary's keys and rates,
the server's side of the window, where client and server disagree, before / after. (The real-vLLM
proof is tests/integration/test_probe.py.)"""

from __future__ import annotations

import random

import numpy as np
import pytest

from diagnostics.core.metrics.derive import Quantile
from diagnostics.core.probe import (
    MAX_CONCURRENCY,
    Percentiles,
    ProbeSpec,
    ProbeSummary,
    RequestResult,
    ServerSide,
    comparison,
    disagreements,
    percentile,
    prompt_at,
    prompts,
    with_server,
)
from tests.unit import synth


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (ProbeSpec(concurrency=MAX_CONCURRENCY + 1), "concurrency"),
        (ProbeSpec(requests=None, seconds=None), "number of requests or a duration"),
        (ProbeSpec(requests=None, seconds=3600), "duration"),
        (ProbeSpec(prompt_tokens=10, shared_prefix_tokens=20), "shared prefix"),
        (ProbeSpec(n=64), "n must be"),
        (ProbeSpec(max_tokens=0), "max tokens"),
    ],
)
def test_caps_and_nonsense_are_refused(spec: ProbeSpec, problem: str) -> None:
    assert any(problem in p for p in spec.problems())


def test_a_reasonable_probe_may_run_and_says_what_it_sends() -> None:
    spec = ProbeSpec(concurrency=30, requests=60, prompt_tokens=64, max_tokens=64)
    assert spec.problems() == []
    assert spec.describe("http://h:8000") == (
        "30 concurrent clients sending 60 requests to http://h:8000: prompts of 64 tokens, up to 64 output tokens each"
    )


def test_prompts_are_exact_reproducible_and_share_the_prefix() -> None:
    spec = ProbeSpec(prompt_tokens=50, shared_prefix_tokens=20, seed=7)
    a, b = prompts(spec, 3), prompts(spec, 3)
    assert a == b and all(len(p) == 50 for p in a)
    assert a[0][:20] == a[1][:20] == a[2][:20] and a[0][20:] != a[1][20:]
    # A long duration-mode probe never repeats a prompt (a repeat would hit the prefix cache).
    assert prompt_at(spec, 0) != prompt_at(spec, 100_000)
    assert len({tuple(prompt_at(ProbeSpec(prompt_tokens=8), i)) for i in range(5000)}) == 5000


def test_the_confirmation_names_every_setting_that_changes_the_load() -> None:
    text = ProbeSpec(concurrency=4, requests=None, seconds=30, n=4, shared_prefix_tokens=64, ignore_eos=False,
                     prompt_tokens=128, max_tokens=32).describe("http://h:8000")
    assert text == ("4 concurrent clients sending requests for 30 s to http://h:8000: prompts of 128 tokens, n = 4, "
                    "64 of them shared, stopping at EOS, up to 32 output tokens each")


def test_percentiles_match_numpy() -> None:
    rng = random.Random(3)
    for n in (1, 2, 7, 100):
        values = [rng.expovariate(10) for _ in range(n)]
        for p in (50, 95, 99):
            assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))
    assert percentile([], 50) is None


def test_summary_counts_and_rates() -> None:
    results = (
        RequestResult(0.0, 2.0, ttft=0.5, gaps=(0.1, 0.2, 0.3), output_tokens=4),
        RequestResult(0.5, 3.0, ttft=1.0, gaps=(0.4,), output_tokens=2),
        RequestResult(1.0, 1.1, error="http_4xx", detail="HTTP 404: no model"),
    )
    obj = ProbeSummary(ProbeSpec(), "http://h", 0.0, 4.0, results).to_json()
    assert (obj["requests"], obj["completed"], obj["errors"]) == (3, 2, 1)
    assert obj["errors_by_kind"] == {"http_4xx": 1} and obj["error_details"] == {"http_4xx": "HTTP 404: no model"}
    assert obj["output_tokens_per_second"] == 6 / 4 and obj["requests_per_second"] == 2 / 4
    assert obj["ttft_seconds"]["p50"] == 0.75
    assert obj["itl_seconds"]["p50"] == 0.25  # every gap of every request: 0.1 0.2 0.3 0.4
    assert obj["e2e_seconds"]["p50"] == 2.25


def test_the_server_side_is_the_window_around_the_probe() -> None:
    history = [
        synth.scrape(9.0, gen=100, itl_counts=[5] + [0] * 13),
        synth.scrape(10.5, gen=300, itl_counts=[5, 20] + [0] * 12),
        synth.scrape(12.0, gen=500, itl_counts=[5, 40] + [0] * 12),
        synth.scrape(30.0, gen=9999, itl_counts=[5, 99] + [0] * 12),  # long after: not the probe's
    ]
    summary = with_server(ProbeSummary(ProbeSpec(), "http://h", 10.0, 11.0, ()), history)
    server = summary.server
    assert server is not None
    assert (server.from_ts, server.to_ts) == (9.0, 12.0)
    assert server.generation_tokens == 400
    assert server.itl.p50 is not None and (server.itl.p50.lower, server.itl.p50.upper) == (0.01, 0.025)
    unbracketed = with_server(ProbeSummary(ProbeSpec(), "http://h", 10.0, 40.0, ()), history)
    assert unbracketed.server is None and "unknown" in (unbracketed.server_note or "")


def test_disagreement_outside_the_bucket_beyond_noise() -> None:
    bucket = Quantile(0.015, 0.01, 0.025)
    at_p50 = Percentiles(bucket, None, None)
    server = ServerSide(0.0, 2.0, None, None, ttft=at_p50, itl=at_p50, e2e=Percentiles(None, None, None))
    clients = (RequestResult(0.0, 1.0, ttft=0.080, gaps=(0.026,), output_tokens=2),)
    found = disagreements(ProbeSummary(ProbeSpec(), "http://h", 0.0, 1.0, clients, server=server))
    assert [d.metric for d in found] == ["TTFT p50"]  # ITL 26 ms is within noise of the 25 ms edge
    assert "55.0 ms above the server's bucket 10–25 ms" in found[0].text


def test_before_after_says_which_way_is_better() -> None:
    def run(ttft: tuple[float, float, float], tokens: int, failed: int = 0) -> ProbeSummary:
        # 101 requests over 50.5 s: 2 per second, and p50 / p95 / p99 are exactly the 51st, 96th
        # and 100th smallest TTFT (numpy's ranks fall on whole numbers).
        p50, p95, p99 = ttft
        values = [p50] * 51 + [p95] * 45 + [p99] * 5
        ok = tuple(RequestResult(0.0, 1.0, ttft=v, output_tokens=tokens) for v in values)
        errors = tuple(RequestResult(0.0, 1.0, error="http_5xx") for _ in range(failed))
        return ProbeSummary(ProbeSpec(), "http://h", 0.0, 50.5, ok + errors)

    before = run((0.4, 1.0, 2.0), tokens=50)  # 100 output tokens per second
    after = run((0.2, 1.5, 2.0), tokens=75)  # 150
    rows = {name: change for name, _, _, change in comparison(before, after)}
    assert rows["output tok/s"] == "+50 % (better)"
    assert rows["TTFT p50 (s)"] == "-50 % (better)"
    assert rows["TTFT p95 (s)"] == "+50 % (worse)"
    assert rows["requests/s"] == "+0 %"
    assert rows["ITL p50 (s)"] == "—"
    worse = {name: change for name, _, _, change in comparison(before, run((0.2, 1.5, 2.0), tokens=75, failed=3))}
    assert worse["errors"] == "from 0 to 3 (worse)"
