"""How busy the host was outside one `vllm serve`, sampled while a test records it.

A healthy server's latency triples when something else on a 2-core host starts using a core (the
other test worker's server, a build): the product is right to call that a change (its first check
is the host's co-tenants). A test that wants a steady host measures whether it had one from
``/proc``: the host's busy CPU time (``/proc/stat``) less the CPU time of the server's own processes
(those in its session: it is started with ``start_new_session``)."""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from pathlib import Path
from types import TracebackType

TICKS = os.sysconf("SC_CLK_TCK")


def host_busy_ticks() -> int:
    """Busy CPU ticks of the whole host since boot: every field of /proc/stat's cpu line but idle and iowait."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest and guest_nice are already in user and nice)
    return sum(fields[:8]) - fields[3] - fields[4]


def session_ticks(sid: int) -> int:
    """User + system ticks of the live processes whose session id is ``sid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited between the listing and the read
        # the command name may hold spaces and parentheses: the fields start after its last ')'
        rest = stat[stat.rindex(")") + 2:].split()
        if int(rest[3]) == sid:  # field 6 (session); rest[0] is field 3
            total += int(rest[11]) + int(rest[12])  # fields 14, 15: utime, stime
    return total


class OutsideLoad:
    """Samples, every ``every`` seconds on a thread, the CPU time the host spent outside session
    ``sid``; :meth:`cores` is its mean in cores over a span of wall-clock (epoch) time."""

    def __init__(self, sid: int, every: float = 0.5) -> None:
        self.sid, self.every = sid, every
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.time(), host_busy_ticks() - session_ticks(self.sid)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every)

    def __enter__(self) -> OutsideLoad:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def cores(self, start: float, end: float) -> float | None:
        """Mean cores busy outside the session between the samples nearest ``start`` and ``end``
        (None when the span holds fewer than two samples)."""
        times = [t for t, _ in self.samples]
        i, j = bisect_left(times, start), min(bisect_left(times, end), len(times) - 1)
        if j <= i:
            return None
        (t0, c0), (t1, c1) = self.samples[i], self.samples[j]
        return (c1 - c0) / TICKS / (t1 - t0) if t1 > t0 else None
