"""NVIDIA dcgm-exporter's Prometheus text → :class:`GpuReading` (pure): GPU health where NVML cannot
be reached (the dashboard is not on the GPU host, as in Kubernetes).

Field names and units are dcgm-exporter's (``etc/default-counters.csv``, ``dcp-metrics-included.csv``
in NVIDIA/dcgm-exporter): framebuffer in MiB, power in W, temperature in °C, clocks in MHz,
utilisation in %. Each sample carries the labels ``gpu`` (the index), ``UUID``, ``device``
(``nvidia0``), ``modelName`` and ``Hostname``. Fields outside the default counters (power limit,
maximum clocks, temperature thresholds, clocks-event reasons) are read when the exporter's counters
CSV adds them, and are ``None`` otherwise. The same builder reads the series returned by a
Prometheus instant query (:func:`devices_from_samples`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from diagnostics.core.metrics.gpu import ClockEvent, GpuDevice, GpuReading
from diagnostics.core.metrics.parse import Sample, parse_prefixed_samples

PREFIX = "DCGM_FI_"
MIB = 2**20

# Our field → the DCGM fields that carry it, newest spelling first; the scale turns DCGM's unit into ours.
FIELDS: dict[str, tuple[tuple[str, ...], float]] = {
    "fb_used": (("DCGM_FI_DEV_FB_USED",), MIB),
    "fb_free": (("DCGM_FI_DEV_FB_FREE",), MIB),
    "fb_reserved": (("DCGM_FI_DEV_FB_RESERVED",), MIB),
    "fb_total": (("DCGM_FI_DEV_FB_TOTAL",), MIB),
    "utilization_gpu_perc": (("DCGM_FI_DEV_GPU_UTIL",), 0.01),
    "utilization_memory_perc": (("DCGM_FI_DEV_MEM_COPY_UTIL",), 0.01),
    "temperature_celsius": (("DCGM_FI_DEV_GPU_TEMP",), 1.0),
    "temperature_slowdown_celsius": (("DCGM_FI_DEV_SLOWDOWN_TEMP",), 1.0),
    "temperature_shutdown_celsius": (("DCGM_FI_DEV_SHUTDOWN_TEMP",), 1.0),
    "power_watts": (("DCGM_FI_DEV_POWER_USAGE",), 1.0),
    "power_limit_watts": (("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT"), 1.0),
    "sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK",), 1.0),
    "sm_clock_max_mhz": (("DCGM_FI_DEV_MAX_SM_CLOCK",), 1.0),
    "memory_clock_mhz": (("DCGM_FI_DEV_MEM_CLOCK",), 1.0),
    "memory_clock_max_mhz": (("DCGM_FI_DEV_MAX_MEM_CLOCK",), 1.0),
    "clock_events": (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"), 1.0),
}
METRIC_NAMES = tuple(dict.fromkeys(name for names, _ in FIELDS.values() for name in names))
_FIELD_OF = {name: (field, rank, scale) for field, (names, scale) in FIELDS.items()
             for rank, name in enumerate(names)}


def device_key(labels: Mapping[str, str]) -> tuple[str, str]:
    """One device: its UUID when labelled, else (host, index)."""
    uuid = labels.get("UUID") or labels.get("uuid")
    return ("", uuid) if uuid else (labels.get("Hostname", ""), labels.get("gpu", ""))


def devices_from_samples(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> tuple[GpuDevice, ...]:
    """``(metric name, labels, value)`` triples (a scrape's samples, or a Prometheus query's series)
    → one :class:`GpuDevice` per GPU, ordered by host and index. Unknown names are ignored; a NaN
    value is absent."""
    values: dict[tuple[str, str], dict[str, tuple[int, float]]] = {}
    labels_of: dict[tuple[str, str], Mapping[str, str]] = {}
    for name, labels, value in samples:
        entry = _FIELD_OF.get(name)
        if entry is None or math.isnan(value):
            continue
        field, rank, scale = entry
        key = device_key(labels)
        labels_of.setdefault(key, labels)
        known = values.setdefault(key, {})
        if field not in known or rank < known[field][0]:
            known[field] = (rank, value * scale)
    devices = [_device(labels_of[key], {f: v for f, (_, v) in fields.items()}) for key, fields in values.items()]
    return tuple(sorted(devices, key=lambda d: (d.host or "", d.index, d.uuid or "")))


def _device(labels: Mapping[str, str], v: Mapping[str, float]) -> GpuDevice:
    used = v.get("fb_used")
    total = v.get("fb_total")
    if total is None and used is not None and "fb_free" in v:
        total = used + v["fb_free"] + v.get("fb_reserved", 0.0)
    try:
        index = int(labels.get("gpu", ""))
    except ValueError:
        index = -1
    events = v.get("clock_events")
    return GpuDevice(
        index,
        labels.get("modelName", "") or labels.get("device", ""),
        round(used) if used is not None else None,
        round(total) if total is not None else None,
        uuid=labels.get("UUID") or labels.get("uuid") or None,
        host=labels.get("Hostname") or None,
        clock_events=ClockEvent(int(events)) if events is not None else None,
        **{f: v.get(f) for f in FIELDS if f not in ("fb_used", "fb_free", "fb_reserved", "fb_total", "clock_events")},
    )


def parse_dcgm(text: str, source: str | None = None) -> GpuReading:
    """A dcgm-exporter ``/metrics`` payload → the reading of every GPU it exports; a reading that
    says why when it has none (raises ``BadMetricsPayload`` only for a malformed ``DCGM_FI_`` line)."""
    samples: list[Sample] = parse_prefixed_samples(text, PREFIX)
    devices = devices_from_samples((s.name, s.labels, s.value) for s in samples)
    if not devices:
        return GpuReading(unavailable="no DCGM_FI_DEV_ GPU fields in the payload (not a dcgm-exporter /metrics?)",
                          source=source)
    return GpuReading(devices, source=source)
