"""``diagnose`` follows the monitoring-plugin convention (0 OK, 1 warning, 2 critical, 3 unknown):
bad usage, an unreachable target or an unreadable file is 3, never the 2 of a critical finding.
The other verbs keep their documented codes. Real subprocesses, as cron would run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def cli(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "diagnostics", *args], cwd=ROOT, capture_output=True,
                          timeout=60).returncode


@pytest.mark.parametrize(("args", "code"), [
    (("diagnose", "--no-such-flag"), 3),
    (("diagnose",), 3),  # no source
    (("diagnose", "--itl-budget-ms", "fast", "--log", "x"), 3),
    (("diagnose", "--url", "http://127.0.0.1:1", "--seconds", "1"), 3),  # nothing listens on port 1
    (("diagnose", "--replay", "/nonexistent.jsonl.gz"), 3),
    (("diagnose", "--log", str(FIXTURES / "log-0.32.0-kv-too-small-for-max-model-len.txt")), 2),  # critical
    (("diagnose", "--replay", str(FIXTURES / "recording-tiny-burst-0.32.0.jsonl.gz")), 1),  # KV pressure warning
    (("status", "--no-such-flag"), 2),
    (("status", "--url", "http://127.0.0.1:1"), 3),
    (("status", "--replay", "/nonexistent.jsonl.gz"), 5),
])
def test_exit_codes(args: tuple[str, ...], code: int) -> None:
    assert cli(*args) == code


def test_a_server_killed_with_sigkill_is_critical_and_still_down_with_its_time_range() -> None:
    """The real recording of a server killed (-9) under streaming load (the corpus's outage_kill,
    made by tests/fixtures/incidents/record.py; recorded once rather than killing a live server in
    every run): critical, ongoing to the end of the recording, with the range it has been down."""
    out = subprocess.run([sys.executable, "-m", "diagnostics", "diagnose", "--replay",
                          str(FIXTURES / "incidents" / "outage_kill.jsonl.gz"), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    down = json.loads(out.stdout)["findings"][0]
    assert down["id"] == "server_down" and down["severity"] == "critical"
    assert down["evidence"]["ongoing"] is True and down["time_range"][1] > down["time_range"][0]


@pytest.mark.parametrize("log", sorted((FIXTURES / "startup").glob("*.log")), ids=lambda p: p.stem)
def test_diagnose_on_any_real_failed_start_is_critical(log: Path) -> None:
    """Every real failed start of the corpus (tests/fixtures/startup, its record.py), memory or not."""
    assert cli("diagnose", "--log", str(log)) == 2


def test_diagnose_on_an_unknown_startup_error_is_critical_and_an_empty_log_is_not_ok(tmp_path: Path) -> None:
    unknown = tmp_path / "unknown.log"
    unknown.write_text("(APIServer pid=7) INFO 12-01 10:00:00 [api_utils.py:347]  version 0.32.0\n"
                       "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                       "FluxCapacitorError: the flux capacitor is cold\n")
    assert cli("diagnose", "--log", str(unknown)) == 2
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert cli("diagnose", "--log", str(empty)) == 1
