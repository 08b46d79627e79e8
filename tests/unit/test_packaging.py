"""`pip install .` gives a `vllm-triage` console command equal to `python -m diagnostics`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pip_install_gives_the_vllm_triage_command(tmp_path: Path) -> None:
    # Built from a copy, so the checkout gets no build/ or egg-info (a stale build/ could ship
    # deleted modules).
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copytree(ROOT / "diagnostics", source / "diagnostics", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", "--target", str(target), str(source)], check=True, timeout=300,
                   capture_output=True)
    command = target / "bin" / "vllm-triage"
    assert command.exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    installed = subprocess.run([str(command), "diagnose", "--log",
                                str(ROOT / "tests/fixtures/log-0.32.0-kv-too-small-for-max-model-len.txt"), "--json"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    module = subprocess.run([sys.executable, "-m", "diagnostics", "diagnose", "--log",
                             str(ROOT / "tests/fixtures/log-0.32.0-kv-too-small-for-max-model-len.txt"), "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert installed.returncode == module.returncode == 2
    assert installed.stdout == module.stdout
    # The command ran the installed copy, not the checkout.
    where = subprocess.run([sys.executable, "-c", "import diagnostics; print(diagnostics.__file__)"], env=env,
                           cwd=tmp_path, capture_output=True, text=True).stdout
    assert where.startswith(str(target))


def test_the_package_depends_on_what_requirements_txt_installs() -> None:
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert sorted(declared) == sorted(listed)
