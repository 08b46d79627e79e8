"""A data-parallel server's engines side by side (one line per engine), as the fleet draws instances."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import plotly.graph_objects as go

from diagnostics.core.figures.fleet import fleet_figure
from diagnostics.core.metrics.catalog import EngineKey, Snapshot
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.series import rate_series

ENGINE_PANELS: tuple[tuple[str, str, str, str], ...] = (
    # (concept, title, unit, kind): one line per engine of a data-parallel server
    ("kv_cache_usage_perc", "KV-cache usage by engine", "%", "gauge"),
    ("generation_tokens", "Generated tokens by engine", "tok/s", "rate"),
    ("num_requests_running", "Running by engine", "requests", "gauge"),
    ("num_requests_waiting", "Waiting by engine", "requests", "gauge"),
)


def engine_pick(concept: str, engine: EngineKey) -> Callable[[Snapshot], float | None]:
    """One engine's value of a concept, as series builders pick it."""
    return lambda snap: snap.value(concept, engine)


def engine_names(history: Sequence[Scrape]) -> dict[EngineKey, str]:
    """The engines the newest good scrape labels, named as a person reads them ("engine 1")."""
    for scrape in reversed(history):
        if scrape.snapshot is not None:
            keys = scrape.snapshot.engines
            models = {model for model, _ in keys}
            return {key: f"engine {key[1] or '0'}" + (f" · {key[0]}" if len(models) > 1 else "") for key in keys}
    return {}


def engines_figure(history: Sequence[Scrape], concept: str, title: str, unit: str, kind: str,
                   highlight: Collection[str] = ()) -> go.Figure | None:
    """One line per engine for a gauge, or a counter's per-interval rate; None with a single engine."""
    names = engine_names(history)
    if len(names) < 2:
        return None
    series: dict[str, list[tuple[float, float]]] = {}
    for key, name in names.items():
        if kind == "rate":
            rates = rate_series(history, engine_pick(concept, key))
            series[name] = [(t, math.nan if v is None else v) for t, v in zip(rates.ts, rates.values)]
        else:
            pick = engine_pick(concept, key)
            series[name] = [(s.ts, v) for s in history if s.snapshot is not None and (v := pick(s.snapshot)) is not None]
    return fleet_figure(title, unit, series, highlight)
