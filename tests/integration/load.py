"""A bounded load generator for the integration tests: N completion requests, all at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.integration.vllm_server import SERVED_NAME


def completions(
    url: str,
    num_requests: int,
    *,
    prompt: str = "block cache token prefill decode queue engine server memory",
    max_tokens: int = 64,
    n: int = 1,
    concurrency: int | None = None,
    timeout: float = 120.0,
) -> list[int]:
    """Send ``num_requests`` completions (``ignore_eos``: exactly ``max_tokens`` each); status codes."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "n": n, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=timeout) as client:

        def one(_: int) -> int:
            try:
                return client.post("/v1/completions", json=body).status_code
            except httpx.HTTPError:
                return -1

        with ThreadPoolExecutor(max_workers=concurrency or num_requests) as pool:
            return list(pool.map(one, range(num_requests)))


def in_background(url: str, num_requests: int, **kw: object) -> tuple[threading.Thread, list[int]]:
    """Start :func:`completions` in a thread; join the thread to wait for every answer."""
    results: list[int] = []

    def run() -> None:
        results.extend(completions(url, num_requests, **kw))  # type: ignore[arg-type]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results
