"""The pure core stays pure: no Streamlit, httpx or NVML import, enforced two ways."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core_imports_with_streamlit_httpx_and_nvml_absent() -> None:
    code = (
        "import sys\n"
        "for name in ('streamlit', 'httpx', 'pynvml'):\n"
        "    sys.modules[name] = None\n"
        "import diagnostics.core.metrics.catalog, diagnostics.core.metrics.derive, diagnostics.core.metrics.parse, diagnostics.core.metrics.info\n"
        "import diagnostics.core.diagnosis, diagnostics.core.diagnosis.alerts\n"
        "import diagnostics.recording\n"
        "sys.modules['sqlite3'] = None\n"
        "import diagnostics.core.store\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_ruff_bans_io_imports_in_the_core() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "TID251", "diagnostics"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "TID251", "--stdin-filename", "diagnostics/core/x.py", "-"],
        input="import streamlit\n",
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "TID251" in bad.stdout


def _loaded_after(module: str) -> list[str]:
    """The simulator and what-if modules that importing ``module`` loads, in a fresh interpreter."""
    code = (f"import json, sys, {module}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('diagnostics.core.simulator', "
            "'diagnostics.core.whatif')))))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def test_drawing_a_live_chart_loads_neither_the_simulator_nor_the_what_if() -> None:
    for module in ("diagnostics.core.figures.live", "diagnostics.core.figures.engines",
                   "diagnostics.core.figures.diagnose", "diagnostics.core.figures.fleet",
                   "diagnostics.core.figures.probe"):
        assert _loaded_after(module) == [], module
    # The what-if's own chart does load them: the check above sees such an import.
    assert "diagnostics.core.simulator.scheduler" in _loaded_after("diagnostics.core.figures.prediction")
