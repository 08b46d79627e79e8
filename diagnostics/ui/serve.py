"""``python -m diagnostics serve``: the dashboard, with a flight recorder for configured targets.

Streamlit runs a page script only when a browser session opens it, so a collector started by a page
begins when the engineer arrives, and the minutes before are gone. Here the configured targets
(``VLLM_URL`` and ``[targets]`` in ``.streamlit/secrets.toml``) get their shared collectors first,
in this process, and Streamlit then runs in the same process: the pages find those collectors in
the registry (:func:`diagnostics.collector.shared_collector`), history bounded by its retention.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from diagnostics.collector import Collector, shared_collector
from diagnostics.core.targets import normalize_url, targets_from
from diagnostics.direct_fleet import read_secrets, secrets_files
from diagnostics.sources import nvml

ROOT = Path(__file__).resolve().parents[2]


def start_flight_recorders(secrets: Mapping[str, Any], env: Mapping[str, str]) -> list[Collector]:
    """Start the shared collector of every configured target (a URL that cannot be used is left
    for the sidebar to report)."""
    config = targets_from(secrets, env)
    reader = nvml.probe()[0]
    started = []
    for target in config.targets:
        try:
            url = normalize_url(target.url)
        except ValueError:
            continue
        started.append(shared_collector(url, target.api_key, gpu_reader=reader, gpu_metrics_url=target.gpu_metrics_url))
    return started


def serve(streamlit_args: Sequence[str]) -> int:
    if not (ROOT / "app.py").exists():
        print("error: serve runs from a checkout of the repository (app.py and pages/ are not installed); "
              "use ./scripts/run.sh there", file=sys.stderr)
        return 2
    recorders = start_flight_recorders(read_secrets(secrets_files()), os.environ)
    if recorders:
        names = ", ".join(c.target for c in recorders)
        print(f"flight recorder: collecting {names} from now on", file=sys.stderr, flush=True)
    from streamlit.web import cli as streamlit_cli

    sys.argv = ["streamlit", "run", str(ROOT / "app.py"), *streamlit_args]
    try:
        streamlit_cli.main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
