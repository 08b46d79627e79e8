"""The simulated engine's GPUs as NVIDIA dcgm-exporter shows them: one device per engine (a
data-parallel rank has its own GPU), in dcgm-exporter's field names, units and labels
(``DCGM_FI_DEV_*``; ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``), with the fields a
custom counters CSV adds (enforced power limit, maximum clocks, temperature thresholds, clocks-event
reasons) so every part of the GPU panel is shown.

The numbers are the simulation's own: utilisation is the share of simulated time the engine spent
in steps since the last read; power and temperature follow it; a scenario's ``gpu_throttle`` holds
the SM clock down with NVML's reasons set (and the engine's steps slowed by the same ratio, see
:func:`~diagnostics.core.simulator.scenarios.make_engines`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from diagnostics.core.hardware import GPUS_BY_NAME, BoardLimits
from diagnostics.core.metrics.gpu import ClockEvent
from diagnostics.core.simulator.config import EngineConfig
from diagnostics.core.simulator.scenarios import GPU_THROTTLES

HOSTNAME = "sim-gpu-node"  # a Simulation without a server; SimServer names its host (see SimDcgm)
DEFAULT_BOARD = "H100 SXM"  # the board of a device the GPU table holds no limits for (the CPU host)
MIB = 2**20
_HELP = {
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_MAX_SM_CLOCK": "Maximum supported SM clock (in MHz).",
    "DCGM_FI_DEV_MAX_MEM_CLOCK": "Maximum supported memory clock (in MHz).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_SLOWDOWN_TEMP": "Slowdown temperature (in C).",
    "DCGM_FI_DEV_SHUTDOWN_TEMP": "Shutdown temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "Enforced power limit (in W).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "Current clock event reasons (bitmask).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
}


class SimDcgm:
    """The exporter's view of the simulated GPUs; :meth:`text` is one ``/metrics`` answer."""

    def __init__(self, config: EngineConfig, num_engines: int, throttle: str = "", hostname: str = HOSTNAME,
                 serial: str = HOSTNAME) -> None:
        """``hostname``: the ``Hostname`` label (the node the engine runs on); ``serial``: what the
        devices' UUIDs are derived from, so two simulated servers on one host have distinct GPUs."""
        self.config = config
        self.board: BoardLimits = _limits(config.gpu.variant)
        self.throttle = GPU_THROTTLES.get(throttle) if throttle else None
        self.num_engines = num_engines
        self.hostname = hostname
        self.serial = serial
        self._last: tuple[float, tuple[float, ...]] | None = None
        self._util = [0.0] * num_engines

    def text(self, now: float, busy_seconds: Sequence[float], running: Sequence[int]) -> str:
        """``now`` (simulated seconds), each engine's busy seconds so far and its running count."""
        if self._last is not None and now > self._last[0]:
            span = now - self._last[0]
            self._util = [min(1.0, max(0.0, (b - a) / span)) for a, b in zip(self._last[1], busy_seconds)]
        elif self._last is None:
            self._util = [1.0 if r else 0.0 for r in running]
        self._last = (now, tuple(busy_seconds))
        lines: dict[str, list[str]] = {name: [] for name in _HELP}
        for rank in range(self.num_engines):
            self._device(rank, self._util[rank], running[rank] if rank < len(running) else 0, lines)
        out = []
        for name, samples in lines.items():
            out += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} gauge", *samples]
        return "\n".join(out) + "\n"

    def _device(self, rank: int, util: float, running: int, lines: dict[str, list[str]]) -> None:
        b, t = self.board, self.throttle
        device_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"sim-gpu://{self.serial}/{rank}")
        labels = (f'gpu="{rank}",UUID="GPU-{device_uuid}",device="nvidia{rank}",'
                  f'modelName="{b.nvml_name}",Hostname="{self.hostname}"')
        sm = b.max_sm_clock_mhz * (t.sm_clock_ratio if t is not None else 1.0)
        events = int(t.events) if t is not None else (int(ClockEvent.GPU_IDLE) if not running else 0)
        power = b.idle_watts + (b.power_limit_watts - b.idle_watts) * util * 0.8
        temperature = 34.0 + 36.0 * util
        if t is not None and t.kind == "power":
            power = b.power_limit_watts * 0.998
        if t is not None and t.kind == "thermal":
            temperature = b.slowdown_celsius + 2.0
        total_mib = self.config.gpu.memory_bytes / MIB
        used_mib = total_mib * self.config.gpu_memory_utilization + 520.0  # vLLM's share + the CUDA context
        values = {
            "DCGM_FI_DEV_SM_CLOCK": f"{sm:.0f}" if util > 0 or running else "345",
            "DCGM_FI_DEV_MEM_CLOCK": f"{b.max_mem_clock_mhz:.0f}",
            "DCGM_FI_DEV_MAX_SM_CLOCK": f"{b.max_sm_clock_mhz:.0f}",
            "DCGM_FI_DEV_MAX_MEM_CLOCK": f"{b.max_mem_clock_mhz:.0f}",
            "DCGM_FI_DEV_GPU_TEMP": f"{temperature:.0f}",
            "DCGM_FI_DEV_SLOWDOWN_TEMP": f"{b.slowdown_celsius:.0f}",
            "DCGM_FI_DEV_SHUTDOWN_TEMP": f"{b.shutdown_celsius:.0f}",
            "DCGM_FI_DEV_POWER_USAGE": f"{power:.6f}",
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": f"{b.power_limit_watts:.6f}",
            "DCGM_FI_DEV_GPU_UTIL": f"{util * 100:.0f}",
            "DCGM_FI_DEV_MEM_COPY_UTIL": f"{util * 55:.0f}",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": str(events),
            "DCGM_FI_DEV_FB_FREE": f"{total_mib - used_mib:.0f}",
            "DCGM_FI_DEV_FB_USED": f"{used_mib:.0f}",
        }
        for name, value in values.items():
            lines[name].append(f"{name}{{{labels}}} {value}")


def _limits(variant: str | None) -> BoardLimits:
    """The board limits of the GPU table's row ``variant`` (the default board's where it has none)."""
    row = GPUS_BY_NAME.get(variant or "")
    if row is not None and row.limits is not None:
        return row.limits
    default = GPUS_BY_NAME[DEFAULT_BOARD].limits
    assert default is not None, f"{DEFAULT_BOARD}: the GPU table holds no board limits for it"
    return default
