"""The GPU itself, read through NVML or NVIDIA's dcgm-exporter beside the scrapes: a device whose
clocks are held down for heat or power (the answer to "decode got slower and no flag changed"), and
a device busy all the time while requests wait.

Both are judged per device on the readings of the window, with the readings as evidence. A window
with no GPU reading (no NVML here and no GPU metrics URL) judges nothing: the Live page's GPU panel
says why it has none.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.types import Finding
from diagnostics.core.metrics.gpu import POWER_EVENTS, THERMAL_EVENTS, ClockEvent, GpuDevice, clock_event_names

THERMAL_CHECKS = (
    "No vLLM flag fixes a thermal limit: the GPU lowers its own clocks to stay under its slowdown temperature. "
    "Check the cooling: inlet air temperature, fans or liquid loop, blocked airflow, a neighbour card's exhaust.",
    "Compare with its peers on the same host (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`): one hot card is "
    "hardware or placement; every card hot is the room or the chassis.",
)
POWER_CHECKS = (
    "No vLLM flag raises a power limit: the board holds its clocks down to stay under its enforced limit. "
    "Check the power cap (`nvidia-smi -q -d POWER`: an administrator's `nvidia-smi -pl`, a datacenter policy, "
    "the power supply or rack budget).",
    "A power brake (HW power brake) is an external signal from the chassis or PSU: check the system's power "
    "supplies and its management controller's event log.",
)


def _devices(ctx: Context) -> dict[tuple[str, int, str], list[tuple[float, GpuDevice]]]:
    """Each device's readings over the window, with their times."""
    by_device: dict[tuple[str, int, str], list[tuple[float, GpuDevice]]] = {}
    for ts, reading in ctx.gpus:
        for device in reading.devices:
            by_device.setdefault((device.host or "", device.index, device.uuid or ""), []).append((ts, device))
    return by_device


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _readings(devices: Sequence[GpuDevice]) -> dict[str, float | None]:
    """The medians over the window of what the finding quotes."""
    return {
        "sm_clock_mhz": _median([d.sm_clock_mhz for d in devices]),
        "sm_clock_max_mhz": _median([d.sm_clock_max_mhz for d in devices]),
        "temperature_celsius": _median([d.temperature_celsius for d in devices]),
        "temperature_slowdown_celsius": _median([d.temperature_slowdown_celsius for d in devices]),
        "power_watts": _median([d.power_watts for d in devices]),
        "power_limit_watts": _median([d.power_limit_watts for d in devices]),
        "utilization_gpu_perc": _median([d.utilization_gpu_perc for d in devices]),
    }


def _clock_text(r: dict[str, float | None]) -> str:
    clock, top = r["sm_clock_mhz"], r["sm_clock_max_mhz"]
    if clock is None:
        return ""
    return f"SM clock {clock:.0f} MHz" + (f" of {top:.0f} ({clock / top * 100:.0f} %)" if top else "")


def gpu_throttled(ctx: Context) -> list[Finding]:
    """A device whose thermal or power clocks-event reasons are set in at least
    ``gpu_throttled_share`` of its readings: named, with its clock against its maximum and the
    temperature or power against the limit that holds it. Thermal and power are told apart (their
    checks differ); neither is a vLLM flag."""
    t = ctx.thresholds
    findings = []
    for timed in _devices(ctx).values():
        devices = [d for _, d in timed]
        known = [d for d in devices if d.clock_events is not None]
        if len(known) < t.gpu_min_readings:
            continue
        throttled = [d for d in known if d.throttles]
        share = len(throttled) / len(known)
        if share < t.gpu_throttled_share:
            continue
        reasons = ClockEvent(0)
        for d in throttled:
            reasons |= d.throttles
        thermal = bool(reasons & THERMAL_EVENTS) or (
            bool(reasons & ClockEvent.HW_SLOWDOWN) and not reasons & POWER_EVENTS
            and _over_slowdown(throttled))
        r = _readings(throttled)
        device = devices[-1]
        if thermal:
            cause = "thermally throttled"
            limit = (f"{r['temperature_celsius']:.0f} °C" if r["temperature_celsius"] is not None else "")
            if limit and r["temperature_slowdown_celsius"] is not None:
                limit += f" (slowdown at {r['temperature_slowdown_celsius']:.0f} °C)"
        else:
            cause = "held at its power limit"
            limit = f"{r['power_watts']:.0f} W" if r["power_watts"] is not None else ""
            if limit and r["power_limit_watts"] is not None:
                limit += f" of {r['power_limit_watts']:.0f} W"
        details = "; ".join(x for x in (_clock_text(r), limit) if x)
        start = next(ts for ts, d in timed if d.throttles)
        findings.append(Finding(
            id="gpu_throttled",
            severity="warning",
            title=f"{device.label} {cause} in {share * 100:.0f} % of readings"
            + (f": {details}" if details else "") + ". Every step is slower; no vLLM flag fixes it",
            evidence={"device": device.label, "uuid": device.uuid, "host": device.host,
                      "clock_event_reasons": list(clock_event_names(reasons)), "throttled_share": round(share, 3),
                      "num_readings": len(known), **{k: v for k, v in r.items() if v is not None}},
            checks=THERMAL_CHECKS if thermal else POWER_CHECKS,
            time_range=(start, timed[-1][0]),
        ))
    return findings


def _over_slowdown(devices: Sequence[GpuDevice]) -> bool:
    return any(d.temperature_celsius is not None and d.temperature_slowdown_celsius is not None
               and d.temperature_celsius >= d.temperature_slowdown_celsius for d in devices)


def gpu_saturated(ctx: Context) -> list[Finding]:
    """A device out of compute while requests wait: median utilisation at least
    ``gpu_saturated_utilization_perc``, drawing at least ``gpu_saturated_power_perc`` of its power
    limit (median), requests waiting in at least ``gpu_saturated_waiting_share`` of the scrapes, and
    not throttled (then the clock is the cause: :func:`gpu_throttled`). Utilisation alone counts the
    time a kernel ran, which vLLM decoding keeps near 100 % at any batch: the power draw is what says
    the SMs are working. Not judged without a power reading and its limit; not when the KV cache
    is full (``kv_full_perc``: the memory holds the batch, ``kv_pressure``) or the running count sits
    at a known --max-num-seqs (the cap holds it, ``queue_at_cap``)."""
    t = ctx.thresholds
    waiting = [snap.value("num_requests_waiting") for _, snap in ctx.ok]
    known_waiting = [w for w in waiting if w is not None]
    if not known_waiting:
        return []
    waited = sum(1 for w in known_waiting if w > 0) / len(known_waiting)
    if waited < t.gpu_saturated_waiting_share:
        return []
    kv_usage = _median([snap.value("kv_cache_usage_perc") for _, snap in ctx.ok])
    running = _median([snap.value("num_requests_running") for _, snap in ctx.ok])
    cap = ctx.flags.max_num_seqs
    if (kv_usage is not None and kv_usage >= t.kv_full_perc) or (cap and running is not None and running >= cap):
        return []
    findings = []
    for timed in _devices(ctx).values():
        devices = [d for _, d in timed]
        utils = [d.utilization_gpu_perc for d in devices if d.utilization_gpu_perc is not None]
        if len(utils) < t.gpu_min_readings or statistics.median(utils) < t.gpu_saturated_utilization_perc:
            continue
        if sum(1 for d in devices if d.throttles) / len(devices) >= t.gpu_throttled_share:
            continue
        r = _readings(devices)
        power, limit = r["power_watts"], r["power_limit_watts"]
        if power is None or not limit or power < t.gpu_saturated_power_perc * limit:
            continue
        device = devices[-1]
        util = statistics.median(utils)
        findings.append(Finding(
            id="gpu_saturated",
            severity="warning",
            title=f"{device.label} saturated: busy {util * 100:.0f} % of the time at {power:.0f} W of its "
            f"{limit:.0f} W limit while requests waited in {waited * 100:.0f} % of scrapes",
            evidence={"device": device.label, "uuid": device.uuid, "host": device.host,
                      "num_readings": len(utils), "waiting_share": round(waited, 3),
                      "max_num_requests_waiting": max(known_waiting), "kv_cache_usage_perc": kv_usage,
                      **{k: v for k, v in r.items() if v is not None}},
            checks=(
                "The GPU is out of compute, not memory or a cap: the KV cache has room and the batch is not at "
                "--max-num-seqs, yet the board runs at its power limit. A larger batch will not drain the queue.",
                "Add capacity for the load: another replica (--data-parallel-size or a second server behind the "
                "router), or --tensor-parallel-size across more GPUs; or shed early with --max-num-queued-reqs.",
            ),
            time_range=(timed[0][0], timed[-1][0]),
        ))
    return findings
