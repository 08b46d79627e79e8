"""A real Prometheus (the Debian ``prometheus`` binary) on loopback for the tests: scraping live
targets every second, or serving a recorded incident backfilled into its TSDB with ``promtool``."""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from diagnostics.core.metrics.parse import parse_vllm_samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binaries() -> tuple[str, str]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        raise RuntimeError("prometheus / promtool not installed: run ./scripts/test.sh (apt-get install prometheus)")
    return prometheus, promtool


SCRAPE_TIMEOUT_S = 1.0  # how long Prometheus waits for a target's answer before it gives up the scrape


class PrometheusServer:
    """``prometheus`` with its own data dir; ``targets`` are ``host:port`` scraped every second under
    ``job="vllm"``."""

    def __init__(self, targets: Iterable[str] = (), *, data_dir: Path | None = None,
                 extra_jobs: Iterable[tuple[str, str, list[str]]] = ()) -> None:
        """``extra_jobs``: (job name, metrics path, targets) scraped beside ``job="vllm"`` (a dcgm-exporter)."""
        self.targets = list(targets)
        self.extra_jobs = list(extra_jobs)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = tempfile.TemporaryDirectory(prefix="prom-test-")
        self.dir = Path(self._tmp.name)
        self.data_dir = data_dir or self.dir / "data"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        prometheus, _ = binaries()
        config = self.dir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: 1s\n  scrape_timeout: {SCRAPE_TIMEOUT_S:g}s\n"
            "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
            f"      - targets: {json.dumps(self.targets)}\n"
            + "".join(f"  - job_name: {name}\n    metrics_path: {path}\n    static_configs:\n"
                      f"      - targets: {json.dumps(targets)}\n" for name, path, targets in self.extra_jobs)
        )
        self.log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.data_dir}",
                "--storage.tsdb.retention.time=100y",  # backfilled incidents are old on purpose
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in {timeout} s: {self.log_text()[-2000:]}")

    def log_text(self) -> str:
        path = self.dir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_scrapes(self, count: int, timeout: float = 60.0) -> None:
        """Until every target has been scraped ``count`` times (``count_over_time(up[…])``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = httpx.get(f"{self.url}/api/v1/query", params={"query": "count_over_time(up[10m])"}, timeout=5)
            got = {s["metric"]["instance"]: float(s["value"][1]) for s in r.json()["data"]["result"]}
            if len(got) >= len(self.targets) and all(v >= count for v in got.values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"targets not scraped {count} times in {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()


Scrapes = list[tuple[float, str | None]]
"""(ts, /metrics text or None for a failed scrape), oldest first."""


def recording_scrapes(path: Path) -> Scrapes:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [(r["ts"], r.get("metrics")) for r in map(json.loads, handle)]


def openmetrics(scrapes: Scrapes, instance: str, job: str = "vllm", shift: float = 0.0) -> str:
    """Scrapes as OpenMetrics with timestamps, labelled as Prometheus would have scraped them
    (``job``, ``instance``, ``up``): the input of ``promtool tsdb create-blocks-from``."""
    by_family: dict[str, list[str]] = {}
    target = f'job="{job}",instance="{instance}"'
    for raw_ts, text in scrapes:
        ts = raw_ts + shift
        by_family.setdefault("up", []).append(f"up{{{target}}} {0 if text is None else 1} {ts:.3f}")
        if text is None:
            continue
        for s in parse_vllm_samples(text):
            labels = "".join(f',{k}="{v}"' for k, v in s.labels.items())
            by_family.setdefault(s.name, []).append(f"{s.name}{{{target}{labels}}} {s.value!r} {ts:.3f}")
    lines: list[str] = []
    for name, samples in by_family.items():
        lines.append(f"# TYPE {name} gauge")  # untyped as far as the TSDB cares; names keep their suffixes
        lines.extend(samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def recording_span(path: Path) -> tuple[float, float]:
    stamps = [ts for ts, _ in recording_scrapes(path)]
    return stamps[0], stamps[-1]


def backfill(recordings: dict[str, Path | Scrapes], data_dir: Path, end: float | None = None) -> None:
    """Write each recording (instance → file) into ``data_dir`` as TSDB blocks; with ``end``, each
    is shifted in time to end there (recordings made on different days become one fleet)."""
    _, promtool = binaries()
    data_dir.mkdir(parents=True, exist_ok=True)
    for instance, source in recordings.items():
        scrapes = recording_scrapes(source) if isinstance(source, Path) else source
        src = data_dir.parent / f"{instance.replace(':', '_')}.om"
        shift = 0.0 if end is None else end - scrapes[-1][0]
        src.write_text(openmetrics(scrapes, instance, shift=shift))
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(data_dir)],
                       check=True, capture_output=True, timeout=300)
