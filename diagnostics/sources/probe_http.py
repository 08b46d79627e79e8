"""The probe's HTTP side: ``concurrency`` asyncio clients streaming ``/v1/completions`` from a
vLLM server, timing every output chunk, in a background thread that can be cancelled (in-flight
requests are closed, and vLLM aborts them). What to send and how to summarise it is
:mod:`diagnostics.core.probe`.

The transport is aiohttp, as `vllm bench serve` uses, not httpx as the rest of the package: on a
small machine the load generator shares the CPU with the server it measures, and httpx's pure-Python
HTTP parsing took 2.5× the client CPU per streamed token, which slowed the server by a quarter
(bench/probe_vs_bench_serve.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from diagnostics.core.probe import MAX_SECONDS, ProbeSpec, ProbeSummary, RequestResult, prompt_at
from diagnostics.core.targets import normalize_url

STOP_AFTER_REFUSED = 5


class ProbeRefused(ValueError):
    """The probe may not run: over a cap, or nothing to send."""


class ProbeFailed(Exception):
    """The probe could not start (the server's model list could not be read)."""


class Probe:
    """One probe run against one target; :meth:`start` returns at once, :meth:`wait` for the summary."""

    def __init__(
        self,
        url: str,
        spec: ProbeSpec,
        api_key: str | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        problems = spec.problems()
        if problems:
            raise ProbeRefused("; ".join(problems))
        self.url = normalize_url(url)
        self.spec = spec
        self._api_key = api_key
        self._clock = clock
        self._lock = threading.Lock()
        self._results: list[RequestResult] = []
        self._sent = 0
        self._refused = 0  # connection failures in a row
        self._cancel = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self.started: float | None = None
        self.ended: float | None = None
        self.failure: str | None = None
        self.model: str | None = spec.model

    # -- control -------------------------------------------------------------------------------

    def start(self) -> Probe:
        self._thread = threading.Thread(target=self._run, name=f"probe {self.url}", daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Stop sending and close the requests in flight (what they measured so far is kept)."""
        self._cancel.set()
        loop, main = self._loop, self._main
        if loop is not None and main is not None and not self.done:
            try:
                loop.call_soon_threadsafe(main.cancel)
            except RuntimeError:
                pass  # the run ended (its loop closed) between the check and the call

    def wait(self, timeout: float | None = None) -> ProbeSummary | None:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.summary() if self.done else None

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def progress(self) -> tuple[int, int, int]:
        """(requests sent, finished, failed) so far."""
        with self._lock:
            return self._sent, len(self._results), sum(1 for r in self._results if not r.ok)

    def summary(self) -> ProbeSummary:
        """What the clients measured so far (all of it once :attr:`done`), and why the run stopped."""
        with self._lock:
            results = tuple(sorted(self._results, key=lambda r: r.start))
        started = self.started if self.started is not None else self._clock()
        ended = self.ended if self.ended is not None else self._clock()
        return ProbeSummary(self.spec, self.url, started, ended, results, cancelled=self.cancelled,
                            failure=self.failure)

    # -- the run -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._run_async())
        except BaseException as exc:  # noqa: BLE001 - the thread reports, never dies silently
            if self.failure is None and not isinstance(exc, asyncio.CancelledError):
                self.failure = f"probe stopped: {type(exc).__name__}: {exc}"
        finally:
            if self.ended is None:
                self.ended = self._clock()

    async def _run_async(self) -> None:
        self._loop = asyncio.get_running_loop()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        connector = aiohttp.TCPConnector(limit=self.spec.concurrency + 2)
        timeout = aiohttp.ClientTimeout(total=self.spec.request_timeout_seconds, sock_connect=5.0)
        async with aiohttp.ClientSession(self.url, headers=headers, connector=connector, timeout=timeout) as client:
            if self.model is None:
                self.model = await self._first_model(client)
                if self.model is None:
                    return
            self._main = asyncio.current_task()
            if self._cancel.is_set():
                return
            self.started = self._clock()
            # However many requests were asked for, nothing is sent after the duration cap.
            deadline = time.monotonic() + min(self.spec.seconds or MAX_SECONDS, MAX_SECONDS)
            workers = [asyncio.create_task(self._worker(client, deadline)) for _ in range(self.spec.concurrency)]
            try:
                await asyncio.gather(*workers)
            except asyncio.CancelledError:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
            finally:
                self.ended = self._clock()

    async def _first_model(self, client: aiohttp.ClientSession) -> str | None:
        try:
            async with client.get("/v1/models", timeout=aiohttp.ClientTimeout(total=10.0)) as response:
                if response.status >= 400:
                    self.failure = f"{self.url}/v1/models answered HTTP {response.status}: cannot tell the model"
                    return None
                data = (await response.json(content_type=None)).get("data") or []
                return str(data[0]["id"])
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.failure = f"cannot reach {self.url}: {type(exc).__name__}"
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            self.failure = f"{self.url}/v1/models gave no model"
        return None

    def _next(self, deadline: float) -> int | None:
        with self._lock:
            if self._cancel.is_set():
                return None
            if self.spec.requests is not None and self._sent >= self.spec.requests:
                return None
            if time.monotonic() >= deadline:
                return None
            self._sent += 1
            return self._sent - 1

    async def _worker(self, client: aiohttp.ClientSession, deadline: float) -> None:
        while (i := self._next(deadline)) is not None:
            result = await self._one(client, prompt_at(self.spec, i))
            with self._lock:
                self._results.append(result)
                self._refused = self._refused + 1 if result.error == "connect" else 0
                if self._refused >= max(STOP_AFTER_REFUSED, self.spec.concurrency) and not self._cancel.is_set():
                    # The server is gone: stop sending rather than count a thousand refusals.
                    self.failure = f"stopped: {self._refused} connections in a row refused by {self.url}"
                    self._cancel.set()

    async def _one(self, client: aiohttp.ClientSession, prompt: list[int]) -> RequestResult:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.spec.max_tokens,
            "ignore_eos": self.spec.ignore_eos,
            "n": self.spec.n,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = self._clock()
        first: float | None = None
        last: dict[int, float] = {}
        gaps: list[float] = []
        chunks = 0
        usage: int | None = None
        done = False
        try:
            async with client.post("/v1/completions", json=body) as response:
                if response.status >= 400:
                    text = (await response.read()).decode("utf-8", "replace")
                    kind = "http_4xx" if response.status < 500 else "http_5xx"
                    return RequestResult(start, self._clock(), error=kind,
                                         detail=f"HTTP {response.status}: {_message(text)}")
                async for line in _sse_data(response):
                    if line == b"[DONE]":
                        done = True
                        break
                    now = self._clock()
                    chunk = json.loads(line)
                    if "error" in chunk:  # vLLM reports a failure after the 200 inside the stream
                        return RequestResult(start, now, _rel(first, start), tuple(gaps), chunks, error="stream_error",
                                             detail=_message(json.dumps(chunk)))
                    if chunk.get("usage"):
                        usage = int(chunk["usage"].get("completion_tokens") or 0)
                    for choice in chunk.get("choices") or ():
                        # Every chunk with a choice is a token, its text empty or not (a special
                        # token, or bytes that do not decode alone): as `vllm bench serve` counts.
                        index = int(choice.get("index", 0))
                        if first is None:
                            first = now
                        if index in last:
                            gaps.append(now - last[index])
                        last[index] = now
                        chunks += 1
        except asyncio.CancelledError:
            return RequestResult(start, self._clock(), _rel(first, start), tuple(gaps), chunks, error="cancelled")
        except aiohttp.ClientConnectorError as exc:
            return RequestResult(start, self._clock(), error="connect", detail=type(exc).__name__)
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is one too
            return RequestResult(start, self._clock(), _rel(first, start), tuple(gaps), chunks, error="timeout",
                                 detail=type(exc).__name__)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
            return RequestResult(start, self._clock(), _rel(first, start), tuple(gaps), chunks, error="disconnected",
                                 detail=type(exc).__name__)
        except (aiohttp.ClientError, ValueError, TypeError, KeyError) as exc:
            return RequestResult(start, self._clock(), error="bad_response", detail=type(exc).__name__)
        end = self._clock()
        if not done:
            return RequestResult(start, end, _rel(first, start), tuple(gaps), chunks, error="disconnected",
                                 detail="the stream ended without [DONE]")
        if first is None:
            return RequestResult(start, end, error="bad_response", detail="the stream carried no output token")
        return RequestResult(start, end, first - start, tuple(gaps), usage if usage is not None else chunks)


async def _sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of a server-sent event stream, as they arrive (raw bytes, split here)."""
    pending = b""
    async for block in response.content.iter_any():
        pending += block
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if pending.startswith(b"data:"):
        yield pending[5:].strip()


def _rel(t: float | None, start: float) -> float | None:
    return None if t is None else t - start


def _message(text: str) -> str:
    try:
        obj: Any = json.loads(text)
        if isinstance(obj, dict):
            inner = obj.get("error", obj)
            msg = inner.get("message") if isinstance(inner, dict) else inner
            return str(msg)[:200]
    except ValueError:
        pass
    return text[:200]
