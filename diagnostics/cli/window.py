"""Getting the window of history a command reads: a recording, N seconds of a server, or a range of
one instance from Prometheus, each as a :class:`HistorySource`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from diagnostics.cli.exits import EXIT_FILE, EXIT_NOT_VLLM, EXIT_TARGET, EXIT_USAGE, CliError
from diagnostics.collector import Collector
from diagnostics.core.fleet.promql import Scope, parse_selector
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.metrics.history import HistorySource
from diagnostics.core.targets import normalize_url
from diagnostics.errors import BadRecording, NotVllm, TargetError
from diagnostics.recording import Recording, RecordingWriter, read_recording
from diagnostics.sources import nvml
from diagnostics.sources.dcgm_http import DcgmReader
from diagnostics.sources.store import HistoryStore, StoredTarget, StoreError, default_data_dir
from diagnostics.sources.vllm_http import VllmClient, api_key_from_env

if TYPE_CHECKING:  # imported when used: the Prometheus client takes longer to import than the rest
    from diagnostics.prometheus_fleet import PrometheusTarget
    from diagnostics.sources.prometheus import PrometheusClient


def client(args: argparse.Namespace) -> VllmClient:
    """The ``--url`` server's client (exit 2 for a URL that cannot be used)."""
    try:
        return VllmClient(args.url, api_key_from_env(args.api_key_env), timeout_seconds=args.timeout or 2.0)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def check_first(vllm: VllmClient) -> None:
    """Fail fast, with one line, when the target is not there or not vLLM."""
    try:
        vllm.metrics_text()
    except NotVllm as exc:
        raise CliError(str(exc), EXIT_NOT_VLLM) from None
    except TargetError as exc:
        raise CliError(str(exc), EXIT_TARGET) from None


def gpu_reader(args: argparse.Namespace) -> tuple[Callable[[], GpuReading] | None, str | None]:
    """The GPU health reader beside the scrapes: the ``--gpu-metrics-url`` dcgm-exporter when given
    (exit 2 for a URL that cannot be used), NVML when this host has a driver, else none."""
    url = getattr(args, "gpu_metrics_url", None)
    if url:
        try:
            dcgm = DcgmReader(url, timeout_seconds=args.timeout or 2.0)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        return dcgm, dcgm.url
    reader = nvml.probe()[0]
    return reader, nvml.SOURCE if reader is not None else None


def collect(vllm: VllmClient, seconds: float, interval: float, writer: RecordingWriter | None,
            gpus: tuple[Callable[[], GpuReading] | None, str | None] = (None, None),
            store: HistoryStore | None = None) -> Collector:
    """Scrape for ``seconds`` in this thread (every ``interval``), each scrape also to ``writer`` (and
    to ``store``); ``gpus`` (a reader and its source, :func:`gpu_reader`) read GPU health beside each
    scrape."""
    collector = Collector(vllm, interval_seconds=interval, retention_seconds=max(seconds, interval) + 60,
                          gpu_reader=gpus[0], gpu_source=gpus[1])
    if store is not None:
        collector.use_store(store, preload=False)
    if writer is not None:
        collector.add_sink(writer.write)
    deadline = time.monotonic() + seconds
    while True:
        collector.scrape_once()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval, remaining))
    return collector


def prometheus(args: argparse.Namespace) -> tuple[PrometheusClient, Scope]:
    """The ``--prometheus`` client and the ``--selector`` scope (exit 2 for either unusable)."""
    from diagnostics.sources.prometheus import PrometheusClient

    try:
        prom = PrometheusClient(args.prometheus, timeout_seconds=args.timeout or 15.0)
        return prom, Scope(parse_selector(args.selector))
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def prometheus_window(args: argparse.Namespace, since: float) -> PrometheusTarget:
    """One instance's history over the last ``since`` seconds (ending at ``--until``), read from
    Prometheus; ``--instance`` picks it when Prometheus has more than one."""
    from diagnostics import prometheus_fleet as fleet

    prom, scope = prometheus(args)
    try:
        found = fleet.discover(prom, scope, args.until)
    except TargetError as exc:
        raise CliError(str(exc), EXIT_TARGET) from None
    names = [d.instance for d in found]
    if args.instance is None:
        if len(found) != 1:
            listed = ", ".join(names) or "none"
            raise CliError(f"--instance is needed: Prometheus has {len(found)} vLLM instances ({listed})", EXIT_USAGE)
        instance = found[0]
    else:
        match = next((d for d in found if d.instance == args.instance), None)
        if match is None:
            listed = ", ".join(names) or "none"
            raise CliError(f"no vLLM instance {args.instance!r} in Prometheus (it has: {listed})", EXIT_TARGET)
        instance = match
    target = fleet.PrometheusTarget(prom, replace(scope, instance=instance.instance), range_s=since,
                                    model=instance.model, end=args.until)
    history = target.refresh()
    status = target.status()
    if status.error and not history:
        raise CliError(status.error, EXIT_TARGET)
    return target


def data_dir(args: argparse.Namespace) -> Path:
    """``--data-dir``, else the default one (exit 2 when history is turned off and none is named)."""
    named = getattr(args, "data_dir", None)
    found = Path(named).expanduser() if named else default_data_dir()
    if found is None:
        raise CliError("history is off ($VLLM_TRIAGE_DATA_DIR): name a store with --data-dir", EXIT_USAGE)
    return found


def open_store(args: argparse.Namespace, *, write: bool) -> HistoryStore:
    """The history store of ``--data-dir`` (to write: ``record --url``; else to read)."""
    store = HistoryStore(data_dir(args), write=write)
    if write and store.state.message:
        print(f"warning: {store.state.message}", file=sys.stderr)
    return store


def store_window(args: argparse.Namespace, since: float) -> StoredTarget:
    """One target's history over the last ``since`` seconds (ending at ``--until``) from the store;
    ``--url`` picks the target when the store holds several (exit 3 when it holds nothing there)."""
    store = open_store(args, write=False)
    try:
        urls = store.targets()
    except StoreError as exc:
        raise CliError(str(exc), EXIT_TARGET) from None
    if args.url:
        try:
            url = normalize_url(args.url)
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        if url not in urls:
            raise CliError(f"the history store {store.path} has no history of {url} (it has: "
                           f"{', '.join(urls) or 'none'})", EXIT_TARGET)
    elif len(urls) == 1:
        url = urls[0]
    else:
        raise CliError(f"--url is needed: the history store {store.path} holds {len(urls)} targets "
                       f"({', '.join(urls) or 'none'})", EXIT_USAGE if urls else EXIT_TARGET)
    end = args.until if args.until is not None else time.time()
    target = StoredTarget(store, url, range_s=since, end=end)
    target.refresh()
    history = target.history()
    if not history:
        status = target.status()
        raise CliError(status.error or f"no history of {url} in this range", EXIT_TARGET)
    return target


def read(path: str) -> Recording:
    """A recording, with one warning line per skipped line; exit 5 when nothing is usable."""
    try:
        recording = read_recording(path)
    except BadRecording as exc:
        raise CliError(f"{path}: {exc}", EXIT_FILE) from None
    for problem in recording.problems:
        print(f"warning: {path}: {problem}", file=sys.stderr)
    return recording


def source(args: argparse.Namespace, *, since: float) -> HistorySource | None:
    """The window a command reads: the ``--replay`` recording, ``--seconds`` of the ``--url``
    server, or ``since`` seconds of one instance from ``--prometheus`` (None when none is given)."""
    if args.replay:
        return read(args.replay).replay()
    if getattr(args, "from_store", False):
        return store_window(args, since)
    if args.url:
        vllm = client(args)
        check_first(vllm)
        return collect(vllm, args.seconds, args.interval, None, gpu_reader(args))
    if args.prometheus:
        return prometheus_window(args, since)
    return None
