"""Start the dashboard as `./scripts/run.sh` does (`python -m diagnostics serve`, which runs
`streamlit run app.py` in-process after starting the configured targets' collectors) on a free
loopback port for the browser tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from tests.integration.vllm_server import free_port

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def streamlit_app(env: Mapping[str, str], log_path: Path) -> Iterator[str]:
    """The app's base URL once its health endpoint answers; stopped on exit."""
    port = free_port()
    env = dict(env)
    # The history store goes beside the log, not into the user's state directory (unless a test names one).
    env.setdefault("VLLM_TRIAGE_DATA_DIR", str(log_path.parent / "history"))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "diagnostics", "serve", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180  # a busy host takes long to import Streamlit
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/_stcore/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            else:
                raise RuntimeError(f"streamlit did not start: {log_path.read_text(errors='replace')[-2000:]}")
            yield url
        finally:
            proc.terminate()
            proc.wait(10)
