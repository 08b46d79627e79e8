"""``python -m diagnostics serve``: the dashboard, with a flight recorder for configured targets.

Streamlit runs a page script only when a browser session opens it, so a collector started by a page
begins when the engineer arrives, and the minutes before are gone. Here the configured targets
(``VLLM_URL`` and ``[targets]`` in ``.streamlit/secrets.toml``) get their shared collectors first,
in this process, and Streamlit then runs in the same process: the pages find those collectors in
the registry (:func:`diagnostics.collector.shared_collector`), history bounded by its retention.
Those collectors also write the history store (``--data-dir``, :mod:`diagnostics.sources.store`) and
first take back its last hour, so a restarted dashboard shows the minutes before its restart.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnostics.collector import Collector, shared_collector, use_history_store
from diagnostics.core.fleet.promql import parse_duration
from diagnostics.core.store import DEFAULT_POLICY, StorePolicy
from diagnostics.core.store.policy import MIB
from diagnostics.core.targets import normalize_url, targets_from
from diagnostics.direct_fleet import read_secrets, secrets_files
from diagnostics.sources import nvml
from diagnostics.sources.store import HistoryStore, default_data_dir

ROOT = Path(__file__).resolve().parents[2]


def configured_urls(secrets: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The configured targets' normalised URLs (those that can be used)."""
    out = []
    for target in targets_from(secrets, env).targets:
        try:
            out.append(normalize_url(target.url))
        except ValueError:
            continue
    return out


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


@dataclass(frozen=True, slots=True)
class HistoryArgs:
    """What serve's line says of the history store (the rest of the line goes to Streamlit)."""

    data_dir: Path | None
    policy: StorePolicy
    problem: str | None = None


def history_args(words: Sequence[str]) -> tuple[HistoryArgs, list[str]]:
    """``--data-dir DIR``, ``--no-history``, ``--history-max-mib N`` and ``--history-retention 7d``
    (``=`` forms too) taken out of serve's line."""
    rest: list[str] = []
    chosen: Path | None = default_data_dir()
    max_bytes: int | None = None
    retention: float | None = None
    problem = None
    flags = ("--data-dir", "--history-max-mib", "--history-retention")
    it = iter(words)
    for word in it:
        name, eq, value = word.partition("=")
        if word == "--no-history":
            chosen = None
            continue
        if name not in flags:
            rest.append(word)
            continue
        if not eq:
            value = next(it, "")
        try:
            if name == "--data-dir":
                chosen = Path(value).expanduser()
            elif name == "--history-max-mib":
                max_bytes = int(float(value) * MIB)
            else:
                retention = parse_duration(value)
        except ValueError as exc:
            problem = f"{name} {value!r}: {exc}"
    policy = DEFAULT_POLICY.limited(max_bytes=max_bytes, retention_seconds=retention)
    problem = problem or ("; ".join(policy.problems()) or None)
    return HistoryArgs(chosen, policy, problem), rest


def open_history(spec: HistoryArgs, urls: Sequence[str]) -> HistoryStore | None:
    """The store the configured targets' collectors write to (and read their last hour back from),
    said on stderr; a URL typed in the sidebar and the simulated engine are not kept."""
    if spec.data_dir is None:
        print("history store: off", file=sys.stderr, flush=True)
        return None
    store = HistoryStore(spec.data_dir, spec.policy)
    use_history_store(store, urls)
    if store.state.message:
        print(f"warning: {store.state.message}", file=sys.stderr, flush=True)
    else:
        print(f"history store: {store.path} ({store.policy.describe()})", file=sys.stderr, flush=True)
    return store


def _history_line(store: HistoryStore | None, collector: Collector) -> str:
    extent = store.extent(collector.target) if store is not None and store.state.message is None else None
    if extent is None:
        return f"{collector.target} from now on"
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(extent[0]))
    return f"{collector.target} (history from {start})"


def serve(streamlit_args: Sequence[str]) -> int:
    if not (ROOT / "app.py").exists():
        print("error: serve runs from a checkout of the repository (app.py and pages/ are not installed); "
              "use ./scripts/run.sh there", file=sys.stderr)
        return 2
    spec, streamlit_args = history_args(streamlit_args)
    if spec.problem:
        print(f"error: {spec.problem}", file=sys.stderr)
        return 2
    secrets = read_secrets(secrets_files())
    store = open_history(spec, configured_urls(secrets, os.environ))
    recorders = start_flight_recorders(secrets, os.environ)
    if recorders:
        names = ", ".join(_history_line(store, c) for c in recorders)
        print(f"flight recorder: collecting {names}", file=sys.stderr, flush=True)
    from streamlit.web import cli as streamlit_cli

    sys.argv = ["streamlit", "run", str(ROOT / "app.py"), *streamlit_args]
    try:
        streamlit_cli.main()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        if store is not None:
            store.close()
    return 0
