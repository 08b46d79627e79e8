"""SLO attainment from histogram buckets: exact at a bucket bound, otherwise bounded by the buckets
around the budget (never interpolated); goodput across two budgets at least a + b − 1; beside it the
outcome rules' failed, rejected and given-up shares. Checks on real recordings, against their raw
bucket lines and the recorder's own clients."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.slo import Attainment, SloAttainment, attainment, slo_attainment
from diagnostics.recording import read_recording

# 100 observations: 10 ≤ 0.1 s, 60 in (0.1, 0.5], 20 in (0.5, 1.0], 10 above.
HIST = Histogram((0.1, 0.5, 1.0, float("inf")), (10.0, 70.0, 90.0, 100.0), 50.0, 100.0)


def test_a_budget_on_a_bucket_bound_is_exact() -> None:
    a = attainment(HIST, 0.5, "request")
    assert a is not None and a.exact
    assert a.share_at_least == a.share_at_most == pytest.approx(0.70)
    assert a.text() == "70.0 % of requests within 500 ms"


def test_a_budget_between_bounds_is_a_range_stated_from_the_bound_below() -> None:
    a = attainment(HIST, 0.8, "request")
    assert a is not None and not a.exact
    assert (a.lower_bound_seconds, a.upper_bound_seconds) == (0.5, 1.0)
    assert (a.share_at_least, a.share_at_most) == (pytest.approx(0.7), pytest.approx(0.9))
    assert a.text() == "≥ 70.0 % of requests within 500 ms, the bucket bound ≤ the 800 ms budget (≤ 90.0 % within it)"


def test_a_budget_below_the_first_bound_claims_nothing_certain() -> None:
    a = attainment(HIST, 0.05, "request")
    assert a is not None and a.lower_bound_seconds is None and a.share_at_least == 0.0
    assert a.share_at_most == pytest.approx(0.1)
    assert a.text().startswith("≤ 10.0 % of requests within 50 ms")


def test_a_budget_beyond_the_last_bound_is_at_most_everything() -> None:
    a = attainment(HIST, 5.0, "request")
    assert a is not None and a.upper_bound_seconds is None
    assert (a.share_at_least, a.share_at_most) == (pytest.approx(0.9), 1.0)


def test_shares_are_rounded_toward_what_they_claim() -> None:
    a = Attainment(0.3, "request", 1000.0, 0.25, 999.6, 0.5, 999.6)
    assert "≥ 99.9 %" in a.text()  # 99.96 % is not "≥ 100.0 %"


def test_goodput_of_two_per_request_budgets_is_at_least_their_sum_minus_one() -> None:
    ttft = attainment(HIST, 1.0, "request")  # 90 %
    itl = attainment(HIST, 0.5, "request")  # 70 %
    slo = SloAttainment(ttft, itl)
    assert slo.goodput_at_least == pytest.approx(0.6)
    assert slo.text().startswith("goodput ≥ 60.0 % of requests within TTFT and ITL")
    # Per token gap, ITL says nothing of requests: no goodput figure, the shares still shown.
    gaps = attainment(HIST, 0.5, "token gap")
    assert SloAttainment(ttft, gaps).goodput_at_least is None
    assert SloAttainment(ttft, gaps).text().startswith("goodput not stated: ITL is judged per token gap")


def test_no_budget_no_attainment() -> None:
    assert slo_attainment([], None, None) is None


INCIDENTS = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"


def _bucket(text: str, name: str, le: str) -> float:
    return sum(float(v) for v in re.findall(rf'^{re.escape(name)}_bucket{{[^}}]*le="{re.escape(le)}"[^}}]*}} (\S+)$',
                                            text, re.M))


def test_on_a_real_recording_the_share_is_the_bucket_delta_over_the_count_delta() -> None:
    """queue_cap_burst (40 requests queued at --max-num-seqs 4): a 1 s TTFT budget sits on a bucket
    bound, so the share is exact; computed here from the raw exposition lines of the first and last
    scrape, not through the parser."""
    recording = read_recording(INCIDENTS / "queue_cap_burst.jsonl.gz")
    texts = [r.metrics for r in recording.records if r.metrics]
    first, last = texts[0], texts[-1]
    name = "vllm:time_to_first_token_seconds"
    within = _bucket(last, name, "1.0") - _bucket(first, name, "1.0")
    total = _bucket(last, name, "+Inf") - _bucket(first, name, "+Inf")
    assert total == 40.0  # the recipe's 40 requests
    slo = slo_attainment(recording.scrapes(), 1000.0, 100.0)
    assert slo is not None and slo.ttft is not None and slo.ttft.exact
    assert slo.ttft.share_at_least == pytest.approx(within / total)
    assert slo.itl is not None and slo.itl.per == "request"  # vLLM 0.32 exports the per-request TPOT


def test_status_prints_the_slo_line_and_its_json_with_the_buckets_honesty() -> None:
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "diagnostics", "status", "--replay", str(INCIDENTS / "queue_cap_burst.jsonl.gz"),
            "--window", "600", "--ttft-budget-ms", "1000", "--itl-budget-ms", "80"]
    text = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=60).stdout
    slo_line = next(line for line in text.splitlines() if line.startswith("SLO"))
    # 80 ms lies between the TPOT buckets' 75 and 100 ms bounds: stated from 75 ms, as a lower bound.
    assert "within 75 ms, the bucket bound ≤ the 80 ms budget" in slo_line
    # Beside it, the outcome shares: all 40 of the recipe's requests were answered and finished.
    outcomes_line = next(line for line in text.splitlines() if line.startswith("outcomes"))
    assert "failed 0.0 % (0 of 40) · rejected 4xx 0.0 % (0 of 40) · given up 0.0 % (0 of 40 answered)" in outcomes_line
    obj = json.loads(subprocess.run([*args, "--json"], cwd=root, capture_output=True, text=True, timeout=60).stdout)
    assert obj["slo"]["ttft"]["exact"] is True and obj["slo"]["itl"]["lower_bound_seconds"] == 0.075
    assert obj["slo"]["goodput_at_least"] is not None


def test_the_fleet_row_shows_goodput_and_a_dash_without_budgets() -> None:
    from diagnostics.core.fleet.table import FleetRow

    slo = SloAttainment(attainment(HIST, 1.0, "request"), attainment(HIST, 0.5, "request"))
    assert FleetRow("a:8000", "m", True, {}, slo=slo).goodput_text == "≥ 60.0 %"
    assert FleetRow("a:8000", "m", True, {}).goodput_text == "—"
    assert FleetRow("a:8000", "m", True, {}, slo=slo).to_json()["slo"]["goodput_at_least"] == pytest.approx(0.6)


def test_the_fleet_table_frame_has_the_goodput_column() -> None:
    from diagnostics.core.fleet.table import FleetRow
    from diagnostics.ui import fleet_view

    slo = SloAttainment(attainment(HIST, 1.0, "request"), None)
    df = fleet_view.frame([FleetRow("a:8000", "m", True, {}, slo=slo)], lambda page, row: f"/{page}")
    assert df.loc[0, "goodput"] == "≥ 90.0 %"
    assert "goodput" in fleet_view.column_config()


def test_the_verdict_is_the_most_severe_finding_whatever_their_order() -> None:
    from diagnostics.core.diagnosis.types import Finding
    from diagnostics.core.diagnosis.verdict import verdict

    warning = Finding(id="queue_at_cap", severity="warning", title="queue", evidence={})
    critical = Finding(id="server_down", severity="critical", title="down", evidence={})
    info = Finding(id="itl_budget_unset", severity="info", title="no budget", evidence={})
    for order in ([warning, critical, info], [info, critical, warning]):
        v = verdict(order)
        assert (v.severity, v.finding_id, v.title, v.num_findings) == ("critical", "server_down", "down", 2)
    assert verdict([info]).healthy and verdict([]).finding_id is None


def test_an_at_most_share_is_rounded_up_and_an_at_least_share_down() -> None:
    """2,000 of 3,000 at or below the bound under the budget (66.67 %: "≥ 66.6 %") and 2,701 at or
    below the bound over it (90.03 %: "≤ 90.1 %", never the 90.0 % it is not under); in the first
    bucket, 301 of 3,000 (10.03 %) is "≤ 10.1 %"."""
    between = Attainment(0.3, "request", 3000.0, 0.25, 2000.0, 0.5, 2701.0)
    assert between.text() == ("≥ 66.6 % of requests within 250 ms, the bucket bound ≤ the 300 ms budget "
                              "(≤ 90.1 % within it)")
    first = Attainment(0.05, "request", 3000.0, None, 0.0, 0.1, 301.0)
    assert first.text().startswith("≤ 10.1 % of requests within 50 ms")


LABELS = json.loads((INCIDENTS / "labels.json").read_text())


def _status_json(name: str) -> dict[str, Any]:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "diagnostics", "status", "--replay", str(INCIDENTS / f"{name}.jsonl.gz"),
            "--window", "600", "--json"]
    return dict(json.loads(subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=60).stdout))


@pytest.mark.parametrize(("name", "share", "status_code"), [
    # 800-word prompts over --max-model-len 512 beside 4 closed-loop clients: the clients saw 41 HTTP 400s.
    ("rejected_over_len_512", "rejected", "400"),
    # 12 clients with a 2 s read timeout queued at --max-num-seqs 2: 56 of them gave up (no answer: -1).
    ("gave_up_streaming_cap2", "gave_up", "-1"),
])
def test_status_states_the_outcome_share_the_rule_judged_with_the_clients_own_count(
        name: str, share: str, status_code: str) -> None:
    """One computation: the share ``status`` prints beside goodput is the one the outcome rule's
    finding carries, and its count is what the recorder's own clients saw."""
    from diagnostics.core.diagnosis import diagnose, prepare

    clients = LABELS[name]["clients"]
    obj = _status_json(name)["outcomes"]
    assert obj[share] == clients["by_status"][status_code]
    recording = read_recording(INCIDENTS / f"{name}.jsonl.gz")
    finding = next(f for f in diagnose(prepare(recording.scrapes(), info=recording.info()))
                   if f.id in ("requests_rejected", "clients_gave_up"))
    assert obj[f"{share}_share_perc"] == pytest.approx(finding.evidence[f"{share}_share_perc"])
    whole = clients["requests"]  # every request the clients sent got an answer (the give-ups a 2xx)
    assert obj[f"{share}_share_perc"] == pytest.approx(clients["by_status"][status_code] / whole)
    assert f"{clients['by_status'][status_code] / whole * 100:.1f} % ({clients['by_status'][status_code]} of {whole}" \
        in obj["text"]


def test_the_fleet_table_and_its_cli_show_the_outcome_shares_beside_goodput() -> None:
    """A replica refusing 41 of its 108 requests (the real rejected_over_len_512 recording): the
    Fleet frame's and ``fleet``'s text cells say 38.0 % (41); a replica not diagnosed says a dash."""
    from diagnostics.cli.render import render_fleet
    from diagnostics.core.diagnosis.outcomes import window_outcomes
    from diagnostics.core.fleet.table import FleetRow
    from diagnostics.ui import fleet_view

    seen = window_outcomes(read_recording(INCIDENTS / "rejected_over_len_512.jsonl.gz").scrapes(), 512)
    rows = [FleetRow("a:8000", "m", True, {}, outcomes=seen), FleetRow("b:8000", "m", True, {})]
    df = fleet_view.frame(rows, lambda page, row: f"/{page}")
    assert df.loc[0, "rejected 4xx"] == "38.0 % (41)" and df.loc[0, "failed"] == "0.0 % (0)"
    assert df.loc[1, "gave up"] == "—"
    assert {"failed", "rejected 4xx", "gave up"} <= set(fleet_view.column_config())
    text = render_fleet(rows, [])
    assert "38.0 % (41)" in text.splitlines()[1] and "gave up" in text.splitlines()[0]
    assert rows[0].to_json()["outcomes"]["rejected"] == 41


def test_a_server_without_the_per_request_tpot_is_judged_per_token_gap_and_states_no_goodput() -> None:
    """Servers before vLLM 0.9 export no request_time_per_output_token_seconds: the ITL budget falls
    back to inter_token_latency_seconds, one observation per token gap, and no goodput is claimed from
    it. queue_cap_burst with the per-request lines removed; the share from the raw bucket lines."""
    from diagnostics.core.metrics.catalog import parse_snapshot
    from diagnostics.core.metrics.derive import Scrape

    recording = read_recording(INCIDENTS / "queue_cap_burst.jsonl.gz")
    texts = [r.metrics for r in recording.records if r.metrics]
    older = ["\n".join(line for line in t.splitlines() if "request_time_per_output_token" not in line) + "\n"
             for t in texts]
    scrapes = [Scrape(float(i), parse_snapshot(t)) for i, t in enumerate(older)]
    name = "vllm:inter_token_latency_seconds"
    within = _bucket(older[-1], name, "0.1") - _bucket(older[0], name, "0.1")
    total = _bucket(older[-1], name, "+Inf") - _bucket(older[0], name, "+Inf")
    assert total > 40  # token gaps, many more than the 40 requests
    slo = slo_attainment(scrapes, None, 100.0)
    assert slo is not None and slo.itl is not None and slo.itl.per == "token gap" and slo.itl.exact
    assert slo.itl.share_at_least == pytest.approx(within / total)
    assert slo.goodput_at_least is None and slo.text().startswith("goodput not stated")
    with_tpot = slo_attainment(recording.scrapes(), None, 100.0)
    assert with_tpot is not None and with_tpot.itl is not None and with_tpot.itl.per == "request"
