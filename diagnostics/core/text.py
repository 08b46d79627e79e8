"""Text helpers for rendering: Markdown escaping of server strings, units people read."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from diagnostics.core.hardware import DevicePeak
from diagnostics.core.metrics.derive import SOURCE_NAMES, PromptSources, Quantile, Roofline
from diagnostics.core.metrics.gpu import GpuReading, clock_event_names, device_order

if TYPE_CHECKING:  # the diagnosis imports this module: its types are only named here
    from diagnostics.core.diagnosis.outcomes import Outcomes, Share

GIB = 2**30
# Everything Streamlit's Markdown (GFM + its directives: :emoji:, :red[...], $latex$) could act on.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~:$&])")


# How a person names each state vllm:engine_sleep_state can report (Snapshot.asleep()'s values).
SLEEP_LEVELS = {"scheduling_paused": "level 0: scheduling paused, weights and KV cache kept",
                "weights_offloaded": "level 1: weights offloaded to host memory, KV cache discarded",
                "discard_all": "level 2: weights and KV cache discarded"}


def md_escape(text: object) -> str:
    """A server-provided string made inert for ``st.markdown``-rendered elements."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", " ")


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def fmt_when(ts: float | None, now: float | None = None) -> str:
    """``14:02:07 (3 min ago)``."""
    if ts is None:
        return "—"
    ago = (now if now is not None else time.time()) - ts
    clock = datetime.fromtimestamp(ts).strftime("%H:%M:%S")
    if ago < 90:
        return f"{clock} ({ago:.0f} s ago)"
    if ago < 5400:
        return f"{clock} ({ago / 60:.0f} min ago)"
    return f"{clock} ({ago / 3600:.1f} h ago)"


def fmt_seconds_as_ms(seconds: float) -> str:
    """Latency in the unit people read: ms below 10 s, else seconds."""
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def fmt_duration(seconds: float) -> str:
    """How long something lasted, in a title: seconds below two minutes, else minutes."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def fmt_ms_or_bound(seconds: float, first_bound: float) -> str:
    """A median of interval medians, shown as "< bound" when it lies in the histogram's first bucket."""
    return f"< {fmt_seconds_as_ms(first_bound)}" if seconds <= first_bound else fmt_seconds_as_ms(seconds)


def fmt_latency(q: Quantile | None) -> str:
    """A latency quantile with its bucket honesty: ``< 300 ms`` in the first bucket, ``> 80.0 s``
    beyond the last finite one, else the interpolated value."""
    if q is None:
        return "—"
    if q.bound == "below":
        return f"< {fmt_seconds_as_ms(q.upper)}"
    if q.bound == "above":
        return f"> {fmt_seconds_as_ms(q.lower)}"
    return fmt_seconds_as_ms(q.value)


def fmt_optional(value: object, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}{suffix}"
    return f"{value}{suffix}"


def evidence_rows(evidence: dict[str, object]) -> list[tuple[str, str]]:
    """A finding's evidence in words and units a person reads: keys carry their unit (``_seconds``,
    ``_perc``, ``_bytes``, ``_ms``), which becomes ms or s, %, GiB; the JSON keeps the SI values."""
    rows = []
    for key, value in evidence.items():
        if key.endswith("_bound") or key == "symptom":
            continue  # shown with its value ("< 10 ms"); the symptom is the finding itself
        if key == "cause":
            rows.append(("cause", str(value).replace("_", " ") if value else "not identified"))
            continue
        if key == "causes" and isinstance(value, list):
            # A differential's rulings, by verdict (the card's checks say each one's number).
            by_fit = {fit: [str(r.get("cause", "")).replace("_", " ") for r in value
                            if isinstance(r, dict) and r.get("fit") == fit] for fit in ("ruled_out", "unknown")}
            rows += [(label, ", ".join(names)) for label, names in
                     (("ruled out", by_fit["ruled_out"]), ("not checked", by_fit["unknown"])) if names]
            continue
        text = _evidence_value(key, value)
        bound = evidence.get(key.removesuffix("_seconds") + "_bound") if key.endswith("_seconds") else None
        rows.append((_evidence_label(key), f"{bound} {text}" if bound else text))
    return rows


_UNIT_SUFFIXES = ("_seconds", "_perc", "_bytes", "_ms", "_at")


def _evidence_label(key: str) -> str:
    for suffix in _UNIT_SUFFIXES:
        key = key.removesuffix(suffix)
    return key.replace("num_requests_", "requests ").replace("_", " ")


def _evidence_value(key: str, value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "window" and isinstance(value, dict):
        end = time.strftime("%H:%M:%S", time.localtime(float(value.get("end", 0))))
        return f"{float(value.get('seconds', 0)):,.0f} s ending {end}"
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    if not isinstance(value, (int, float)):
        return str(value)
    if key.endswith("_at"):  # a wall-clock time (Unix seconds)
        return time.strftime("%H:%M:%S", time.localtime(float(value)))
    if key.endswith("_seconds") or key.startswith("seconds_"):
        return fmt_seconds_as_ms(float(value))
    if key.endswith("_ms"):
        return f"{value:,g} ms"
    if key.endswith("_perc"):
        return f"{float(value) * 100:.1f} %"
    if key.endswith("_bytes"):
        return fmt_bytes(float(value))
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:,.0f}"


def prompt_sources_text(sources: PromptSources | None) -> str | None:
    """``62 % local prefix cache, 38 % computed, 0 % external KV transfer; hits by tier: device 100 %``."""
    if sources is None or not sources.total:
        return None
    parts = [f"{sources.by_source[k] / sources.total * 100:.0f} % {SOURCE_NAMES.get(k, k)}"
             for k in sorted(sources.by_source, key=lambda k: -sources.by_source[k])]
    text = ", ".join(parts)
    tiers = sources.cached_by_tier
    if tiers and sum(tiers.values()) > 0:
        total = sum(tiers.values())
        text += "; hits by tier: " + ", ".join(f"{k} {v / total * 100:.0f} %" for k, v in sorted(tiers.items()) if v)
    return text


def si_scale(values: Sequence[float], unit: str) -> tuple[float, str]:
    """The SI prefix that puts the largest value between 1 and 1000 ("GFLOP/s" for 2e9 FLOP/s)."""
    top = max(values, default=0.0)
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= scale:
            return scale, prefix + unit
    return 1.0, unit


def _si(value: float, unit: str) -> str:
    scale, scaled = si_scale((value,), unit)
    return f"{value / scale:,.3g} {scaled}"


def roofline_text(roof: Roofline | None, peak: DevicePeak | None) -> str | None:
    """The live roofline in words: achieved work per GPU, and against the device's peaks where known."""
    if roof is None:
        return None
    text = f"vLLM estimates {_si(roof.flops_per_second, 'FLOP/s')} and {_si(roof.bytes_per_second, 'B/s')} per GPU"
    intensity = roof.flops_per_byte
    if intensity is not None:
        text += f" ({intensity:,.3g} FLOP/byte)"
    if peak is None:
        return text + "; no datasheet peak for this device here (NVML reports the device on the GPU host)."
    mfu = roof.flops_per_second / peak.flops_per_second
    bandwidth = roof.bytes_per_second / peak.bandwidth_bytes_per_second
    if intensity is not None and intensity < peak.ridge_flops_per_byte:
        verdict = f"memory-bound at {bandwidth * 100:.0f} % of the {peak.name}'s HBM bandwidth (MFU {mfu * 100:.1f} %)"
    else:
        verdict = f"compute-bound at MFU {mfu * 100:.1f} % of the {peak.name}'s peak ({bandwidth * 100:.0f} % of bandwidth)"
    return f"{text}: {verdict}; peaks from the {peak.source}."


def fmt_share_perc(share: Share) -> str:
    """A share of requests as a percentage to 0.1 % ("< 0.1 %" for a few of many, never a 0.0 % that
    hides them); "not counted" when the server does not export the count; a dash with no requests."""
    perc = share.perc
    if share.count is None:
        return "not counted"
    if perc is None:
        return "—"
    return "< 0.1 %" if 0 < perc < 0.001 else f"{perc * 100:.1f} %"


def fmt_share(share: Share, of: str = "") -> str:
    """``2.0 % (12 of 600)``; ``of`` names the whole when it is not "requests" ("answered")."""
    text = fmt_share_perc(share)
    if share.count is None or share.perc is None:
        return text
    return f"{text} ({share.count:,.0f} of {share.of:,.0f}{' ' + of if of else ''})"


def fmt_share_cell(share: Share) -> str:
    """A table cell: ``2.0 % (12)``."""
    text = fmt_share_perc(share)
    return text if share.count is None or share.perc is None else f"{text} ({share.count:,.0f})"


def outcome_shares_text(o: Outcomes) -> str:
    """The window's failed, rejected (4xx) and given-up shares with their counts, in one line: what
    stands beside goodput on Overview, Live, ``status`` and the Fleet table."""
    if not o.steps:
        return "outcomes not judged: fewer than two good scrapes in the window"
    line = (f"failed {fmt_share(o.failed_share)} · rejected 4xx {fmt_share(o.rejected_share)} · "
            f"given up {fmt_share(o.gave_up_share, 'answered')} in {fmt_duration(o.seconds)}")
    if not o.exports_http:
        line += " (rejected and given-up requests are counted from http_requests_total, which this server does not export)"
    return line


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One device now, in the units people read: the Live panel's table, the Fleet page's GPU list
    and ``status``'s GPU lines."""

    device: str
    clock_events: str
    utilization: str
    memory_busy: str  # the share of time the memory was read or written
    temperature: str
    power: str
    sm_clock: str
    memory_clock: str
    throttled_by: str  # the thermal or power reasons set now ("" when none)


def _of(value: float | None, unit: str, scale: float = 1.0, of: float | None = None) -> str:
    if value is None:
        return "—"
    text = f"{value * scale:.0f} {unit}"
    return text + (f" of {of * scale:.0f}" if of is not None else "")


def gpu_rows(reading: GpuReading) -> list[GpuRow]:
    """Each device's latest reading: its clocks-event reasons by name ("none" when the mask is 0,
    "not reported" when the source gave none), utilisation (and memory busy), temperature against
    its slowdown threshold, power against its limit, SM and memory clocks against their maxima."""
    rows = []
    for d in sorted(reading.devices, key=device_order):
        names = clock_event_names(d.clock_events)
        events = "not reported" if d.clock_events is None else (", ".join(names) if names else "none")
        rows.append(GpuRow(
            d.label, events,
            _of(d.utilization_gpu_perc, "%", 100.0),
            _of(d.utilization_memory_perc, "%", 100.0),
            _of(d.temperature_celsius, "°C") + (f" (slowdown {d.temperature_slowdown_celsius:.0f})"
                                                if d.temperature_slowdown_celsius is not None else ""),
            _of(d.power_watts, "W", of=d.power_limit_watts),
            _of(d.sm_clock_mhz, "MHz", of=d.sm_clock_max_mhz),
            _of(d.memory_clock_mhz, "MHz", of=d.memory_clock_max_mhz),
            ", ".join(clock_event_names(d.throttles)),
        ))
    return rows
