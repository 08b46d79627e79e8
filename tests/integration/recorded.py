"""What the integration tests share around a real server: a recording taken while an action runs
(the app's own collector and file format), and the CLI's JSON answer about it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diagnostics.collector import Collector
from diagnostics.recording import Record, RecordingWriter
from diagnostics.sources.vllm_http import VllmClient

ROOT = Path(__file__).resolve().parents[2]


def record_while(url: str, path: Path, action: Callable[[], None], *, interval: float = 0.5, before: float = 1.0,
                 after: float = 1.5, watch: Callable[[Record], None] | None = None) -> Path:
    """A recording of the server at ``url`` from ``before`` seconds ahead of ``action`` to ``after``
    seconds past it; ``watch`` sees each record as it is written (an action that waits for the
    recording to hold something)."""
    collector = Collector(VllmClient(url), interval_seconds=interval)
    with RecordingWriter(path) as writer:
        collector.add_sink(writer.write)
        if watch is not None:
            collector.add_sink(watch)
        collector.start()
        try:
            time.sleep(before)
            action()
            time.sleep(after)
        finally:
            collector.stop()
    return path


def cli_json(*args: str) -> Any:
    """``python -m diagnostics ARGS --json``: its parsed output (exit 0, 1 or 2 only)."""
    out = subprocess.run([sys.executable, "-m", "diagnostics", *args, "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode in (0, 1, 2), out.stderr
    return json.loads(out.stdout)


def diagnose_json(*args: str) -> tuple[int, list[dict[str, Any]]]:
    """``diagnose ARGS --json``: its exit code and findings."""
    out = subprocess.run([sys.executable, "-m", "diagnostics", "diagnose", *args, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1, 2), out.stderr
    return out.returncode, list(json.loads(out.stdout)["findings"])
