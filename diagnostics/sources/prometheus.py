"""The Prometheus HTTP API adapter (prometheus-api-client): instant and range queries, and the
scrape interval of the vLLM targets. Thin: the PromQL and the meaning of answers live in
:mod:`diagnostics.core.fleet.promql`.

Every call has a whole-request deadline (a Prometheus that trickles its answer is as bad as one that
never answers) and fails with a :class:`~diagnostics.errors.TargetError` whose message says which
Prometheus and what went wrong; nothing is retried behind the caller's back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from typing import Any, TypeVar

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from diagnostics.core.fleet.promql import parse_duration
from diagnostics.core.targets import normalize_url
from diagnostics.errors import BadPayload, TargetHTTPError, TargetTimeout, TargetUnreachable

DEFAULT_TIMEOUT_SECONDS = 15.0
DEFAULT_SCRAPE_INTERVAL_SECONDS = 15.0
INTERVAL_CACHE_SECONDS = 300.0  # the scrape interval is configuration: read it once in a while

T = TypeVar("T")


class PrometheusClient:
    """One Prometheus (or anything with its HTTP query API: Thanos, Mimir, VictoriaMetrics)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = normalize_url(url, "Prometheus URL")
        self.timeout_seconds = timeout_seconds
        self._conn = PrometheusConnect(
            url=self.url, headers=headers, retry=Retry(total=0), timeout=timeout_seconds
        )
        self._lock = threading.Lock()
        self._intervals: dict[str | None, tuple[float, float]] = {}
        self.num_requests = 0  # how many HTTP requests this client has sent (the bench counts them)

    def close(self) -> None:
        self._conn.close()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        with self._lock:
            self.num_requests += 1
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prometheus")
        future = pool.submit(fn)
        try:
            return future.result(timeout=self.timeout_seconds)
        except FutureTimeout:
            raise TargetTimeout(
                f"Prometheus at {self.url} did not answer {what} within {self.timeout_seconds:g} s"
            ) from None
        except PrometheusApiClientException as exc:
            raise TargetHTTPError(f"Prometheus at {self.url} refused {what}: {_api_error(exc)}", _status(exc)) from None
        except requests.Timeout:
            raise TargetTimeout(
                f"Prometheus at {self.url} did not answer {what} within {self.timeout_seconds:g} s"
            ) from None
        except requests.ConnectionError as exc:
            raise TargetUnreachable(f"Prometheus at {self.url} is unreachable: {_reason(exc)}") from None
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            raise BadPayload(f"Prometheus at {self.url} gave no usable answer to {what}: {type(exc).__name__}") from None
        finally:
            pool.shutdown(wait=False)

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        params = {"time": f"{at:.3f}"} if at is not None else None
        result = self._call("a query", lambda: self._conn.custom_query(promql, params=params))
        return _list(result, self.url)

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's result matrix (``start`` and ``end`` in Unix seconds)."""
        result = self._call(
            "a range query",
            lambda: self._conn.custom_query_range(
                promql,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=f"{step:g}s",
            ),
        )
        return _list(result, self.url)

    def scrape_interval(self, instance: str | None = None) -> float:
        """The scrape interval Prometheus uses for the vLLM targets (the active targets API; 15 s,
        Prometheus's default, where the API is absent: Thanos, Mimir)."""
        cached = self._intervals.get(instance)
        if cached is not None and time.monotonic() - cached[0] < INTERVAL_CACHE_SECONDS:
            return cached[1]
        try:
            data = self._call("the targets API", lambda: self._conn.get_targets(state="active"))
        except (TargetHTTPError, BadPayload):
            data = {}
        targets = data.get("activeTargets") if isinstance(data, dict) else None
        intervals = []
        for target in targets if isinstance(targets, list) else []:
            labels = target.get("labels", {}) if isinstance(target, dict) else {}
            if instance is not None and labels.get("instance") != instance:
                continue
            text = str(target.get("scrapeInterval", "")) if isinstance(target, dict) else ""
            seconds = _seconds(text)
            if seconds:
                intervals.append(seconds)
        interval = max(intervals) if intervals else DEFAULT_SCRAPE_INTERVAL_SECONDS
        self._intervals[instance] = (time.monotonic(), interval)
        return interval


def _list(result: Any, url: str) -> list[dict[str, Any]]:
    if not isinstance(result, list):
        raise BadPayload(f"Prometheus at {url} answered with {type(result).__name__}, not a result list")
    return result


def _seconds(text: str) -> float | None:
    try:
        return parse_duration(text)
    except ValueError:
        return None


def _api_error(exc: PrometheusApiClientException) -> str:
    text = str(exc)
    marker = '"error":"'
    if marker in text:
        return text.split(marker, 1)[1].split('"', 1)[0][:300]
    return text[:300]


def _status(exc: PrometheusApiClientException) -> int:
    text = str(exc)
    try:
        return int(text.split("HTTP Status Code ", 1)[1].split(" ", 1)[0])
    except (IndexError, ValueError):
        return 0


def _reason(exc: Exception) -> str:
    text = str(exc)
    for hint in ("Connection refused", "Name or service not known", "timed out", "Connection reset"):
        if hint in text:
            return hint.lower()
    return type(exc).__name__
