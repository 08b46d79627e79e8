"""The vLLM HTTP adapter: ``/health``, ``/version``, ``/v1/models``, ``/metrics``.

All IO goes through one ``httpx.Client`` (tests pass an ``httpx.MockTransport``). Every failure is
one of the typed errors in :mod:`diagnostics.errors`. The API key is sent as a bearer token and
never appears in ``repr``, messages or logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Any

import httpx

from diagnostics.core.metrics.info import ServerInfo
from diagnostics.core.targets import normalize_url
from diagnostics.errors import (
    BadMetricsPayload,
    BadPayload,
    NotVllm,
    TargetError,
    TargetHTTPError,
    TargetTimeout,
    TargetUnreachable,
)

DEFAULT_TIMEOUT_SECONDS = 2.0
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_API_KEY_ENV = "VLLM_API_KEY"


def api_key_from_env(var: str | None = DEFAULT_API_KEY_ENV) -> str | None:
    """The API key held in environment variable ``var`` (None when unset or empty)."""
    if not var:
        return None
    return os.environ.get(var) or None


class VllmClient:
    """A synchronous client for one vLLM server."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = normalize_url(base_url)
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout_seconds,
            # A fresh connection per request (one a second at most): the deadline finds its socket
            # through the connect event, which a kept-alive connection would not fire again.
            limits=httpx.Limits(max_keepalive_connections=0),
            transport=transport,
            follow_redirects=True,
            trust_env=False,
        )

    def __repr__(self) -> str:
        return f"VllmClient({self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def _get(self, path: str) -> tuple[bytes, str]:
        """GET ``path`` within ``timeout_seconds`` in all: httpx's timeout bounds each read, so a
        server that trickles its status line, headers or body would hold the caller for many
        timeouts. A timer shuts the request's socket down at the deadline (the trace hook hands
        it over as soon as it is connected), which ends a read blocked on it."""
        deadline = time.monotonic() + self.timeout_seconds
        streams: list[Any] = []

        def trace(event: str, info: dict[str, Any]) -> None:
            if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
                streams.append(info.get("return_value"))

        timer = threading.Timer(self.timeout_seconds, _shutdown, (streams,))
        timer.daemon = True
        timer.start()
        try:
            with self._http.stream("GET", path, extensions={"trace": trace}) as response:
                return self._read(path, response, deadline)
        except TargetError:
            raise
        except httpx.TimeoutException:
            raise TargetTimeout(f"{path} did not answer within {self.timeout_seconds:g} s") from None
        except httpx.HTTPError as exc:
            if time.monotonic() >= deadline:
                raise TargetTimeout(f"{path} did not answer within {self.timeout_seconds:g} s") from None
            if isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
                raise TargetUnreachable(f"cannot reach {self.base_url}: {_short(exc)}") from None
            raise TargetUnreachable(f"{path} failed: {_short(exc)}") from None
        finally:
            timer.cancel()

    def _read(self, path: str, response: httpx.Response, deadline: float) -> tuple[bytes, str]:
        if response.status_code >= 400:
            reason = response.reason_phrase or "error"
            hint = " (check the API key)" if response.status_code in (401, 403) else ""
            raise TargetHTTPError(f"{path} answered HTTP {response.status_code} {reason}{hint}", response.status_code)
        chunks = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise BadPayload(f"{path} response exceeds {self.max_bytes // 1024} KiB; refused")
            if time.monotonic() >= deadline:
                raise TargetTimeout(f"{path} did not answer within {self.timeout_seconds:g} s")
            chunks.append(chunk)
        if time.monotonic() >= deadline:
            # The deadline's shutdown ends a body that has no length (HTTP/1.0) as if complete.
            raise TargetTimeout(f"{path} did not answer within {self.timeout_seconds:g} s")
        return b"".join(chunks), response.headers.get("content-type", "")

    def _get_json(self, path: str) -> Any:
        body, _ = self._get(path)
        try:
            return json.loads(body)
        except ValueError:
            raise BadPayload(f"{path} did not answer JSON") from None

    def health(self) -> bool:
        """True on 200; a 503 (engine dead) raises :class:`TargetHTTPError`."""
        self._get("/health")
        return True

    def info(self) -> ServerInfo:
        """``/version`` and ``/v1/models`` together."""
        return ServerInfo.from_json(self._get_json("/version"), self._get_json("/v1/models"))

    def prometheus_text(self, path: str = "/metrics") -> str:
        """The raw Prometheus text at ``path`` (any exporter: dcgm-exporter's too), refused when it
        is an HTML page or not UTF-8."""
        body, content_type = self._get(path)
        if "html" in content_type.lower() or body.lstrip()[:1] == b"<":
            raise NotVllm(f"{self.base_url}{path} answered an HTML page, not Prometheus metrics")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise BadMetricsPayload(f"{path} is not UTF-8 text") from None

    def metrics_text(self) -> str:
        """The raw ``/metrics`` text, checked to be Prometheus text with ``vllm:`` families."""
        text = self.prometheus_text("/metrics")
        if "\nvllm:" not in text and not text.startswith("vllm:"):
            raise NotVllm(
                f"{self.base_url}/metrics has no vllm: metrics (not a vLLM server, "
                "or one started with --disable-log-stats)"
            )
        return text


def _shutdown(streams: list[Any]) -> None:
    """Wake a read blocked on the request's socket (closing it from another thread would not)."""
    for stream in list(streams):
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


__all__ = [
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TIMEOUT_SECONDS",
    "ServerInfo",
    "TargetError",
    "VllmClient",
    "api_key_from_env",
]
