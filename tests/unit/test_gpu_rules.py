"""The GPU rules judge NVML / dcgm-exporter readings per device: a clock held down for heat or for
power is named with its reading (and no vLLM flag); a GPU busy all the time at its power limit while
requests wait, with KV room and below the batch cap, is named as capacity. A healthy GPU, a merely
busy one (utilisation pegged at a modest power draw), a KV-bound queue and a cap-held queue stay quiet."""

from __future__ import annotations

import pytest

from diagnostics.core.diagnosis import diagnose, prepare
from diagnostics.core.diagnosis.rules import gpu
from diagnostics.core.metrics.gpu import ClockEvent
from tests.unit.synth import gpu_readings
from tests.unit.test_rules import steady

THERMAL = ClockEvent.HW_THERMAL_SLOWDOWN | ClockEvent.SW_THERMAL_SLOWDOWN
HOT = {"clock_events": THERMAL, "sm_clock_mhz": 1275.0, "sm_clock_max_mhz": 1980.0, "temperature_celsius": 89.0,
       "temperature_slowdown_celsius": 87.0, "utilization_gpu_perc": 1.0}
HEALTHY = {"clock_events": ClockEvent(0), "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0,
           "temperature_celsius": 61.0, "temperature_slowdown_celsius": 87.0, "power_watts": 520.0,
           "power_limit_watts": 700.0, "utilization_gpu_perc": 0.97}


def _ids(findings: list) -> list[str]:  # type: ignore[type-arg]
    return [f.id for f in findings]


def test_a_thermally_throttled_gpu_is_named_with_its_clock_and_temperature_and_no_flag() -> None:
    ctx = prepare(steady(20, running=8, usage=0.3), gpus=gpu_readings(20, **HOT))
    [finding] = gpu.gpu_throttled(ctx)
    assert finding.severity == "warning"
    # 1275 / 1980 = 64.4 %; the medians of the readings, as the fixture wrote them.
    assert "thermally throttled in 100 % of readings" in finding.title
    assert "SM clock 1275 MHz of 1980 (64 %)" in finding.title and "89 °C (slowdown at 87 °C)" in finding.title
    assert finding.evidence["clock_event_reasons"] == ["SW thermal slowdown", "HW thermal slowdown"]
    assert finding.checks[0].startswith("No vLLM flag fixes a thermal limit")
    assert finding.suggestions == ()
    assert finding.time_range == (0.0, 19.0)


def test_a_power_capped_gpu_is_told_apart_from_a_hot_one() -> None:
    capped = dict(HEALTHY, clock_events=ClockEvent.SW_POWER_CAP, power_watts=699.0, sm_clock_mhz=1500.0)
    [finding] = gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(10, **capped)))
    assert "held at its power limit" in finding.title and "699 W of 700 W" in finding.title
    assert "SM clock 1500 MHz of 1980 (76 %)" in finding.title
    assert finding.checks[0].startswith("No vLLM flag raises a power limit")


def test_hw_slowdown_alone_is_thermal_only_past_the_slowdown_temperature() -> None:
    warm = dict(HOT, clock_events=ClockEvent.HW_SLOWDOWN)
    [hot] = gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(10, **warm)))
    [cool] = gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(10, **dict(warm, temperature_celsius=60.0))))
    assert "thermally throttled" in hot.title and "held at its power limit" in cool.title


def test_throttled_in_under_half_the_readings_or_too_few_readings_is_quiet() -> None:
    some = gpu_readings(10, **HOT)[:4] + gpu_readings(10, **HEALTHY)[4:]  # 4 of 10 throttled
    assert gpu.gpu_throttled(prepare(steady(10), gpus=some)) == []
    assert gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(2, **HOT))) == []  # 2 < gpu_min_readings


def test_idle_and_application_clocks_are_not_throttling() -> None:
    idle = dict(HEALTHY, clock_events=ClockEvent.GPU_IDLE | ClockEvent.APPLICATIONS_CLOCKS_SETTING)
    assert gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(10, **idle))) == []


def test_reasons_not_reported_judge_nothing() -> None:
    """NVML's NotSupported (or a DCGM without the reasons field) is unknown, not "not throttled"."""
    assert gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(10, sm_clock_mhz=1275.0))) == []


def test_a_healthy_busy_gpu_with_nobody_waiting_gives_no_gpu_finding() -> None:
    found = diagnose(prepare(steady(20, running=8, usage=0.3), gpus=gpu_readings(20, **HEALTHY)))
    assert not {"gpu_throttled", "gpu_saturated"} & set(_ids(found))


DRAWN = dict(HEALTHY, power_watts=665.0)  # 665 W is 95 % of 700 W, over the 90 % the rule asks


def test_a_gpu_busy_at_its_power_limit_while_requests_wait_is_saturated() -> None:
    ctx = prepare(steady(20, running=64, waiting=12, usage=0.5), gpus=gpu_readings(20, **DRAWN))
    [finding] = gpu.gpu_saturated(ctx)
    assert "saturated: busy 97 % of the time at 665 W of its 700 W limit while requests waited in 100 % of scrapes" \
        in finding.title
    assert finding.evidence["max_num_requests_waiting"] == 12 and finding.evidence["kv_cache_usage_perc"] == 0.5
    assert "--data-parallel-size" in finding.checks[1]


def test_utilisation_pegged_at_a_modest_power_draw_is_not_saturated() -> None:
    """520 W of 700 (74 %): a kernel always running, the SMs not out of work."""
    ctx = prepare(steady(20, running=64, waiting=12, usage=0.5), gpus=gpu_readings(20, **HEALTHY))
    assert gpu.gpu_saturated(ctx) == []


def test_without_a_power_limit_saturation_is_not_judged() -> None:
    ctx = prepare(steady(20, running=64, waiting=12, usage=0.5),
                  gpus=gpu_readings(20, **dict(DRAWN, power_limit_watts=None)))
    assert gpu.gpu_saturated(ctx) == []


def test_a_kv_bound_queue_is_kv_pressures_not_the_gpus() -> None:
    ctx = prepare(steady(20, running=64, waiting=12, usage=0.97), gpus=gpu_readings(20, **DRAWN))
    assert gpu.gpu_saturated(ctx) == []


def test_a_queue_held_at_a_known_max_num_seqs_is_the_caps_not_the_gpus() -> None:
    ctx = prepare(steady(20, running=8, waiting=30, usage=0.05), gpus=gpu_readings(20, **DRAWN), max_num_seqs=8)
    assert gpu.gpu_saturated(ctx) == []
    below = prepare(steady(20, running=8, waiting=30, usage=0.05), gpus=gpu_readings(20, **DRAWN), max_num_seqs=64)
    assert _ids(gpu.gpu_saturated(below)) == ["gpu_saturated"]


def test_a_throttled_gpu_is_not_also_called_saturated() -> None:
    ctx = prepare(steady(20, running=64, waiting=12, usage=0.5), gpus=gpu_readings(20, **dict(HOT, power_watts=665.0,
                                                                                               power_limit_watts=700.0)))
    assert _ids(diagnose(ctx)).count("gpu_throttled") == 1 and "gpu_saturated" not in _ids(diagnose(ctx))


def test_no_gpu_reading_judges_nothing() -> None:
    ctx = prepare(steady(20, running=64, waiting=12, usage=0.97))
    assert gpu.gpu_throttled(ctx) == [] and gpu.gpu_saturated(ctx) == []


def test_saturation_needs_every_gate_waiting_utilisation_and_power() -> None:
    """The sceptic's mutations: each gate of gpu_saturated alone must keep it quiet. DRAWN with nobody
    waiting; DRAWN at 60 % utilisation; DRAWN at 560 W of 700 (80 %, under the 90 % asked)."""
    nobody = prepare(steady(20, running=64, waiting=0, usage=0.5), gpus=gpu_readings(20, **DRAWN))
    assert gpu.gpu_saturated(nobody) == []
    for reading in (dict(DRAWN, utilization_gpu_perc=0.6), dict(DRAWN, power_watts=560.0)):
        ctx = prepare(steady(20, running=64, waiting=12, usage=0.5), gpus=gpu_readings(20, **reading))
        assert gpu.gpu_saturated(ctx) == [], reading


def test_throttled_in_exactly_half_the_readings_is_throttled_from_the_first_throttled_one() -> None:
    """5 healthy readings, then 5 hot ones: half (the share is "at least"), and the finding's time
    range begins at the first throttled reading (t = 5 s), not at the first reading."""
    readings = gpu_readings(10, **HEALTHY)[:5] + gpu_readings(10, **HOT)[5:]
    [finding] = gpu.gpu_throttled(prepare(steady(10), gpus=readings))
    assert finding.time_range == (5.0, 9.0)


def test_hw_slowdown_beside_a_power_reason_is_power_even_past_the_slowdown_temperature() -> None:
    """HW slowdown is heat or an external power brake: with the SW power cap set beside it the power
    side holds the clock, though the card reads 89 °C over its 87 °C slowdown."""
    braked = dict(HOT, clock_events=ClockEvent.HW_SLOWDOWN | ClockEvent.SW_POWER_CAP, power_watts=699.0,
                  power_limit_watts=700.0)
    [finding] = gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(10, **braked)))
    assert "held at its power limit" in finding.title and "699 W of 700 W" in finding.title
    assert finding.checks[0].startswith("No vLLM flag raises a power limit")


def test_hw_slowdown_at_exactly_the_slowdown_temperature_is_thermal() -> None:
    """NVML's slowdown threshold is the temperature at which the GPU slows: 87 °C of 87 is there."""
    at = dict(HOT, clock_events=ClockEvent.HW_SLOWDOWN, temperature_celsius=87.0)
    [finding] = gpu.gpu_throttled(prepare(steady(10), gpus=gpu_readings(10, **at)))
    assert "thermally throttled" in finding.title and "87 °C (slowdown at 87 °C)" in finding.title


def _varying(**per_reading: list[float]) -> list:  # type: ignore[type-arg]
    """One reading a second whose named fields take the listed values in turn (the rest HOT's)."""
    n = len(next(iter(per_reading.values())))
    return [gpu_readings(n, **dict(HOT, **{k: v[i] for k, v in per_reading.items()}))[i] for i in range(n)]


def test_the_throttle_finding_quotes_the_windows_median_not_its_last_reading() -> None:
    """Nine readings. Clocks 1980 1100 1275 1275 1300 1200 1250 1275 1500: sorted, the fifth is 1275
    (the last is 1500, the mean 1351). Temperatures 86 95 89 88 90 89 91 89 97: median 89 (last 97,
    mean 90.4)."""
    readings = _varying(sm_clock_mhz=[1980, 1100, 1275, 1275, 1300, 1200, 1250, 1275, 1500],
                        temperature_celsius=[86, 95, 89, 88, 90, 89, 91, 89, 97])
    [finding] = gpu.gpu_throttled(prepare(steady(9), gpus=readings))
    assert "SM clock 1275 MHz of 1980 (64 %)" in finding.title and "89 °C (slowdown at 87 °C)" in finding.title
    assert (finding.evidence["sm_clock_mhz"], finding.evidence["temperature_celsius"]) == (1275, 89)


def test_saturation_is_judged_on_the_median_utilisation_not_the_last_reading() -> None:
    """Nine readings at 97 % but the last at 50 %: the median is 97 %, saturated. Nine at 50 % but the
    last at 97 %: the median is 50 %, not."""
    waiting = steady(9, running=64, waiting=12, usage=0.5)
    mostly_busy = [gpu_readings(9, **dict(DRAWN, utilization_gpu_perc=u))[i]
                   for i, u in enumerate([0.97] * 8 + [0.5])]
    [finding] = gpu.gpu_saturated(prepare(waiting, gpus=mostly_busy))
    assert "busy 97 % of the time" in finding.title
    mostly_idle = [gpu_readings(9, **dict(DRAWN, utilization_gpu_perc=u))[i]
                   for i, u in enumerate([0.5] * 8 + [0.97])]
    assert gpu.gpu_saturated(prepare(waiting, gpus=mostly_idle)) == []


@pytest.mark.parametrize(("readings", "saturated"), [(2, False), (3, True)])
def test_saturation_needs_three_readings_of_the_device(readings: int, saturated: bool) -> None:
    """Issue 42: two GPU readings are too few to call a board saturated (gpu_min_readings = 3); three,
    at 665 of 700 W with requests waiting, are enough."""
    ctx = prepare(steady(20, running=64, waiting=12, usage=0.5), gpus=gpu_readings(readings, **DRAWN))
    assert bool(gpu.gpu_saturated(ctx)) is saturated


def test_gpu_0_of_two_hosts_is_two_devices() -> None:
    """Issue 42: dcgm-exporter behind a fleet names each board's host; GPU 0 of node-a (saturated, 665 W)
    and GPU 0 of node-b (idle, 100 W) are judged apart: one finding, for node-a's, not a median of both."""
    from dataclasses import replace

    from diagnostics.core.metrics.gpu import GpuReading

    [(_, one)] = gpu_readings(1, **DRAWN)[:1]
    busy = replace(one.devices[0], host="node-a", uuid="GPU-a")
    idle = replace(one.devices[0], host="node-b", uuid="GPU-b", power_watts=100.0, utilization_gpu_perc=0.1)
    readings = [(float(t), GpuReading((busy, idle), source="test")) for t in range(20)]
    found = gpu.gpu_saturated(prepare(steady(20, running=64, waiting=12, usage=0.5), gpus=readings))
    assert [f.evidence["host"] for f in found] == ["node-a"]
