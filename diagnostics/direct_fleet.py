"""A fleet without Prometheus: the configured targets, each read by its own collector (the one the
Live and Diagnose pages read: :func:`diagnostics.collector.shared_collector`), side by side in the
fleet table of :mod:`diagnostics.core.fleet.direct`.

Which targets, and each one's API key, come from the configuration alone (``VLLM_URL`` and
``[targets]`` in the secrets files Streamlit reads, :func:`configured`): a key goes to the target
it was configured for and to no other URL, whoever lists it.
"""

from __future__ import annotations

import os
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnostics.collector import Collector
from diagnostics.core.fleet.direct import DirectTarget
from diagnostics.core.metrics.history import HistorySource
from diagnostics.core.targets import TargetsConfig, normalize_url, same_url, targets_from
from diagnostics.sources.vllm_http import VllmClient


def secrets_files(home: Path | None = None, cwd: Path | None = None) -> list[Path]:
    """The secrets files Streamlit reads, in its order (a later file's keys win): the user's
    ``~/.streamlit/secrets.toml``, then the project's ``.streamlit/secrets.toml``."""
    home = Path.home() if home is None else home
    cwd = Path.cwd() if cwd is None else cwd
    return [home / ".streamlit" / "secrets.toml", cwd / ".streamlit" / "secrets.toml"]


def read_secrets(paths: Sequence[Path]) -> dict[str, Any]:
    """The secrets as Streamlit merges them (top-level keys of a later file replace an earlier
    file's); a file that is absent or unreadable adds nothing (the app then says so)."""
    merged: dict[str, Any] = {}
    for path in paths:
        try:
            merged.update(tomllib.loads(path.read_text(encoding="utf-8")))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue
    return merged


def configured(env: Mapping[str, str] | None = None, paths: Sequence[Path] | None = None) -> TargetsConfig:
    """The configured targets (``VLLM_URL``, ``[targets]``) with their keys, outside Streamlit."""
    return targets_from(read_secrets(secrets_files() if paths is None else paths), os.environ if env is None else env)


def snapshot(name: str, source: HistorySource) -> DirectTarget:
    """What one collector holds now, read once (its history is copied under its lock)."""
    return DirectTarget(name, source.status(), tuple(source.history()), tuple(source.gpu_history()))


@dataclass(frozen=True, slots=True)
class UrlTarget:
    """A server for the fleet: its URL, a name (the configured one, else the URL) and the key
    configured for exactly that URL (or none)."""

    url: str
    name: str
    api_key: str | None = field(default=None, repr=False)


def url_targets(urls: Sequence[str], config: TargetsConfig) -> list[UrlTarget]:
    """Each URL normalised, with the key and name configured for that URL only (``ValueError`` for
    a URL that cannot be used); a URL given twice is listed once."""
    out: list[UrlTarget] = []
    for url in urls:
        normal = normalize_url(url)
        if any(same_url(normal, t.url) for t in out):
            continue
        name = next((t.name for t in config.targets if same_url(t.url, normal)), normal)
        out.append(UrlTarget(normal, name, config.key_for(normal)))
    return out


def configured_targets(config: TargetsConfig) -> list[UrlTarget]:
    """Every configured target whose URL can be used (the sidebar names the others)."""
    out: list[UrlTarget] = []
    for t in config.targets:
        try:
            out.append(UrlTarget(normalize_url(t.url), t.name, t.api_key))
        except ValueError:
            continue
    return out


def collect(targets: Sequence[UrlTarget], seconds: float, interval_seconds: float = 1.0,
            timeout_seconds: float = 2.0) -> list[DirectTarget]:
    """Scrape every target at once for ``seconds`` (and until each has answered or failed once), one
    collector thread each (a target that hangs or is down costs the others nothing), and read what
    each kept."""
    collectors = [Collector(VllmClient(t.url, t.api_key, timeout_seconds=timeout_seconds),
                            interval_seconds=interval_seconds, retention_seconds=seconds + 60)
                  for t in targets]
    for c in collectors:
        c.start()
    try:
        time.sleep(seconds)
        # A target whose first scrape is still in flight (a slow or busy host) is given until that
        # scrape answers or times out (three requests at most), not reported as never scraped.
        deadline = time.monotonic() + 3 * timeout_seconds + 1.0
        while any(not c.history() for c in collectors) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for c in collectors:
            c.stop()
            c.client.close()
    return [snapshot(t.name, c) for t, c in zip(targets, collectors)]
