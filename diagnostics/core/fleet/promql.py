"""Prometheus as a source (pure): the PromQL the fleet views send, and Prometheus's answers turned
back into the history a live collector produces.

Two kinds of question go to Prometheus:

* **Concept queries** for the fleet table and charts, written the way PromQL means them: counters
  through ``rate()`` over a window, fleet and per-instance quantiles as
  ``histogram_quantile(q, sum by (…, le) (rate(…_bucket[w])))``, ratios as a rate over a rate, and
  every spelling vLLM has used joined with ``or`` (after ``by (instance)`` the label sets match, so
  each instance answers with the newest spelling it exports). One query per concept for the whole
  fleet, never one per instance.
* **The raw series** of one instance (or of the fleet) over a range, at a step: every ``vllm:``
  sample, ``up`` and ``process_start_time_seconds``, regrouped per instance and timestamp into
  :class:`~diagnostics.core.metrics.derive.Scrape` — the very history the collector keeps — so the pages
  and the diagnosis work on a Prometheus-backed target unchanged (:func:`histories_from_matrix`),
  and into exposition text for a recording (:func:`exposition`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.core.metrics.catalog import COUNTERS, GAUGES, HISTOGRAMS, MEAN_CONCEPTS, snapshot_from_samples
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.metrics.parse import HTTP_REQUESTS, PROCESS_START, Sample

TARGET_LABELS = ("job", "instance")
"""Labels Prometheus adds to every scraped series; stripped before the catalog sees a sample."""

_MATCHER = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_Y = 365 * 86400
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_selector(text: str | None) -> str:
    """A user's series selector (``{job="vllm"}``, ``job="vllm"`` or empty) as the matchers inside
    the braces; raises ``ValueError`` for anything that is not a list of label matchers (it is
    pasted into every query, so nothing else may get through)."""
    body = (text or "").strip()
    if body.startswith("{"):
        if not body.endswith("}"):
            raise ValueError(f"selector {text!r}: missing closing brace")
        body = body[1:-1]
    body = body.strip().rstrip(",")
    if not body:
        return ""
    pos = 0
    parts: list[str] = []
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise ValueError(f'selector {text!r}: expected label matchers such as {{job="vllm"}}')
        parts.append(m.group(0).strip())
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                raise ValueError(f'selector {text!r}: expected label matchers such as {{job="vllm"}}')
            pos += 1
    return ",".join(parts)


def label_value(value: str) -> str:
    """``value`` quoted for a PromQL label matcher."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d``, plain seconds, or Prometheus's compound form (``1m30s``,
    as its targets API reports intervals) → seconds; ``ValueError`` otherwise."""
    m = _DURATION.match(text or "")
    if m is not None:
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2) or "s"]
    else:
        body = (text or "").strip()
        parts = _DURATION_PART.findall(body)
        if not parts or "".join(a + b for a, b in parts) != body:
            raise ValueError(f"{text!r} is not a duration such as 15m, 2h or 7d")
        seconds = sum(float(a) * (_UNIT_Y if b == "y" else _UNIT_SECONDS[b]) for a, b in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a duration such as 15m, 2h or 7d")
    return seconds


def duration(seconds: float) -> str:
    """Seconds as a PromQL duration: whole seconds where exact, else milliseconds (PromQL takes no
    fractions), at least 1 ms."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True, slots=True)
class Scope:
    """Which series a query reads: the user's selector, optionally narrowed to one instance."""

    selector: str = ""  # matchers, as :func:`parse_selector` returns them
    instance: str | None = None

    def matchers(self, *extra: str) -> str:
        parts = [p for p in (self.selector, *extra) if p]
        if self.instance is not None:
            parts.append(f"instance={label_value(self.instance)}")
        return "{" + ",".join(parts) + "}"


def raw_series_query(scope: Scope) -> str:
    """Every sample the catalog reads, plus ``up``: the input of :func:`histories_from_matrix`.
    ``http_requests_total`` (the API server's answers by handler and status) rides in the same query,
    so the outcome rules (rejected 4xx, clients that gave up) judge each instance through Prometheus
    without one more query per refresh."""
    names = f'__name__=~"vllm:.+|up|{PROCESS_START}|{HTTP_REQUESTS}"'
    return scope.matchers(names, '__name__!~".+_created"')


def up_query(scope: Scope) -> str:
    return f"up{scope.matchers()}"


def discovery_query(scope: Scope) -> str:
    """One series per (instance, model): which instances export vLLM metrics, and their model."""
    either = " or ".join(
        f"count by (instance, model_name) ({name}{scope.matchers()})" for name in GAUGES["num_requests_running"]
    )
    return either


def _or(parts: Iterable[str]) -> str:
    items = list(parts)
    return items[0] if len(items) == 1 else " or ".join(f"({p})" for p in items)


def _by(by: Sequence[str]) -> str:
    return ", ".join(by)


def gauge(concept: str, scope: Scope, by: Sequence[str] = ("instance",)) -> str:
    """A gauge per group now: the mean of engines for a fraction, the sum for a count."""
    agg = "avg" if concept in MEAN_CONCEPTS else "sum"
    return _or(f"{agg} by ({_by(by)}) ({name}{scope.matchers()})" for name in GAUGES[concept])


def gauge_peak(concept: str, scope: Scope, window_s: float, by: Sequence[str] = ("instance",)) -> str:
    """The highest value any engine of a group reached over the window."""
    w = duration(window_s)
    return _or(f"max by ({_by(by)}) (max_over_time({name}{scope.matchers()}[{w}]))" for name in GAUGES[concept])


def _counter_names(concept: str) -> list[str]:
    return [name + suffix for name in COUNTERS[concept] for suffix in ("_total", "")]


def rate(concept: str, scope: Scope, window_s: float, by: Sequence[str] = ("instance",)) -> str:
    """A counter's per-second rate over the window, summed per group (engines, extra labels)."""
    w = duration(window_s)
    return _or(f"sum by ({_by(by)}) (rate({name}{scope.matchers()}[{w}]))" for name in _counter_names(concept))


def ratio(numerator: str, denominator: str, scope: Scope, window_s: float, by: Sequence[str] = ("instance",)) -> str:
    """Δnumerator / Δdenominator over the window, per group (a windowed hit rate, not a lifetime one)."""
    return f"({rate(numerator, scope, window_s, by)}) / ({rate(denominator, scope, window_s, by)})"


def quantile(
    concept: str, q: float, scope: Scope, window_s: float, by: Sequence[str] = ("instance",)
) -> str:
    """The q-quantile of a histogram over the window: buckets summed per group *before*
    ``histogram_quantile`` (so a fleet quantile is the fleet's, not an average of instances')."""
    w = duration(window_s)
    groups = _by((*by, "le"))
    return _or(
        f"histogram_quantile({q}, sum by ({groups}) (rate({name}_bucket{scope.matchers()}[{w}])))"
        for name in HISTOGRAMS[concept]
    )


@dataclass(frozen=True, slots=True)
class Column:
    """One fleet-table column: its key (the ``status`` key where one exists), header, unit, query."""

    key: str
    header: str
    unit: str  # "", "%", "/s", "s"
    query: Any  # (scope, window_s) -> PromQL

    def promql(self, scope: Scope, window_s: float) -> str:
        return str(self.query(scope, window_s))


FLEET_COLUMNS: tuple[Column, ...] = (
    Column("kv_cache_usage_perc", "KV usage", "%", lambda s, w: gauge("kv_cache_usage_perc", s)),
    Column("kv_cache_usage_peak", "KV peak", "%", lambda s, w: gauge_peak("kv_cache_usage_perc", s, w)),
    Column("num_requests_running", "running", "", lambda s, w: gauge("num_requests_running", s)),
    Column("num_requests_waiting", "waiting", "", lambda s, w: gauge("num_requests_waiting", s)),
    Column("waiting_peak", "waiting peak", "", lambda s, w: gauge_peak("num_requests_waiting", s, w)),
    Column("preemptions_per_s", "preemptions", "/s", lambda s, w: rate("num_preemptions", s, w)),
    Column("generation_tokens_per_s", "gen tokens", "/s", lambda s, w: rate("generation_tokens", s, w)),
    Column(
        "prefix_cache_hit_rate",
        "prefix hits",
        "%",
        lambda s, w: ratio("prefix_cache_hits", "prefix_cache_queries", s, w),
    ),
    Column("ttft_p95_s", "TTFT p95", "s", lambda s, w: quantile("time_to_first_token_seconds", 0.95, s, w)),
    Column("itl_p95_s", "ITL p95", "s", lambda s, w: quantile("inter_token_latency_seconds", 0.95, s, w)),
)

CHART_CONCEPTS: dict[str, tuple[str, str, Any]] = {
    # key: (title, unit, (scope, rate window) -> PromQL by instance)
    "kv_cache_usage_perc": ("KV-cache usage", "%", lambda s, w: gauge("kv_cache_usage_perc", s)),
    "num_requests_running": ("Running requests", "", lambda s, w: gauge("num_requests_running", s)),
    "num_requests_waiting": ("Waiting requests", "", lambda s, w: gauge("num_requests_waiting", s)),
    "preemptions_per_s": ("Preemptions", "/s", lambda s, w: rate("num_preemptions", s, w)),
    "itl_p95_s": ("ITL p95", "s", lambda s, w: quantile("inter_token_latency_seconds", 0.95, s, w)),
}


def rate_window(step_s: float, scrape_interval_s: float) -> float:
    """The window for ``rate()`` in a range query: at least four scrapes, and one step plus a
    scrape so neighbouring points never leave a sample out (Grafana's ``$__rate_interval``)."""
    return max(step_s + scrape_interval_s, 4 * scrape_interval_s)


def auto_step(range_s: float, scrape_interval_s: float, max_points: int = 240) -> float:
    """A step that keeps a range query to ``max_points`` per series, never finer than a scrape."""
    return max(scrape_interval_s, math.ceil(range_s / max_points))


# -- answers -----------------------------------------------------------------------------------


def _number(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def vector_by_instance(result: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """An instant-query vector keyed by ``instance`` (a series without one is skipped)."""
    out: dict[str, float] = {}
    for series in result:
        instance = series.get("metric", {}).get("instance")
        value = series.get("value")
        if instance is not None and isinstance(value, (list, tuple)) and len(value) == 2:
            out[str(instance)] = _number(value[1])
    return out


def matrix_by_instance(result: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """A range-query matrix keyed by ``instance``: ``[(ts, value), …]`` oldest first."""
    out: dict[str, list[tuple[float, float]]] = {}
    for series in result:
        instance = series.get("metric", {}).get("instance")
        if instance is None:
            continue
        points = [(float(ts), _number(v)) for ts, v in series.get("values", ())]
        out[str(instance)] = sorted(points)
    return out


@dataclass(frozen=True, slots=True)
class Discovered:
    instance: str
    model: str | None
    up: bool | None  # None: Prometheus has no ``up`` for it (federated or remote-written data)


def discovered(up: Sequence[Mapping[str, Any]], models: Sequence[Mapping[str, Any]]) -> list[Discovered]:
    """Instances that export vLLM metrics (or did: a down one has ``up`` 0 and no model now)."""
    model_of: dict[str, str] = {}
    for series in models:
        metric = series.get("metric", {})
        if "instance" in metric:
            model_of.setdefault(str(metric["instance"]), str(metric.get("model_name") or "") or "")
    up_of = {k: v >= 1 for k, v in vector_by_instance(up).items() if not math.isnan(v)}
    names = set(model_of)
    # A target that is down now still belongs to the fleet if its job also scrapes vLLM instances.
    names |= {i for i, ok in up_of.items() if not ok}
    return [Discovered(i, model_of.get(i) or None, up_of.get(i)) for i in sorted(names)]


def _series(result: Sequence[Mapping[str, Any]]) -> Iterable[tuple[str, str, dict[str, str], Sequence[Any]]]:
    """Each answered series as (instance, name, the server's own labels, points)."""
    for series in result:
        labels = dict(series.get("metric", {}))
        name = labels.pop("__name__", None)
        instance = labels.get("instance")
        if name is None or instance is None:
            continue
        for key in TARGET_LABELS:
            labels.pop(key, None)
        yield str(instance), str(name), labels, series.get("values", ())


def samples_by_instance(result: Sequence[Mapping[str, Any]]) -> dict[str, dict[float, list[Sample]]]:
    """A raw-series answer as each instance's samples per scrape timestamp (``up`` included), the
    target labels Prometheus added stripped, oldest first."""
    out: dict[str, dict[float, list[Sample]]] = {}
    for instance, name, labels, points in _series(result):
        by_ts = out.setdefault(instance, {})
        for ts, v in points:
            by_ts.setdefault(float(ts), []).append(Sample(name, labels, _number(v)))
    return {i: dict(sorted(by_ts.items())) for i, by_ts in sorted(out.items())}


def is_down(samples: Sequence[Sample]) -> bool:
    """A scrape Prometheus saw fail (``up`` 0), or one without a vLLM sample."""
    up = next((s.value for s in samples if s.name == "up"), 1.0)
    return up < 1 or not any(s.name.startswith("vllm:") for s in samples)


def histories_from_matrix(result: Sequence[Mapping[str, Any]]) -> dict[str, list[Scrape]]:
    """A raw-series range answer (:func:`raw_series_query`) → per-instance history, as the live
    collector would have kept it at those instants: a snapshot where the instance had ``vllm:``
    samples, an error scrape where Prometheus saw it down (``up`` 0) or had no sample."""
    out: dict[str, list[Scrape]] = {}
    for instance, by_ts in samples_by_instance(result).items():
        scrapes: list[Scrape] = []
        for ts, samples in by_ts.items():
            if is_down(samples):
                why = "down" if any(s.name == "up" and s.value == 0 for s in samples) else "no vLLM samples"
                # Prometheus does not say why its scrape failed.
                scrapes.append(Scrape(ts, None, f"Prometheus: {instance} {why} at this instant", ErrorKind.UNKNOWN))
            else:
                scrapes.append(Scrape(ts, snapshot_from_samples(samples)))
        out[instance] = scrapes
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(samples: Iterable[Sample]) -> str:
    """Samples as Prometheus text exposition (what a recording stores), ``up`` left out."""
    lines = []
    for s in samples:
        if s.name == "up":
            continue
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
        value = "NaN" if math.isnan(s.value) else repr(s.value) if math.isfinite(s.value) else (
            "+Inf" if s.value > 0 else "-Inf"
        )
        lines.append(f"{s.name}{{{labels}}} {value}" if labels else f"{s.name} {value}")
    return "\n".join(lines) + "\n"
