"""Real ``vllm serve`` processes for the integration tests, shared by the whole session.

Two servers start in parallel on first use: ``main`` (64 MiB of KV cache: 1,024 blocks of 128
tokens) and ``tiny`` (12 blocks: preemption and waiting within seconds). ``vllm_factory`` starts
more with other flags.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.vllm_server import VllmServer, build_tiny_model

TINY_ARGS = ("--num-gpu-blocks-override", "12", "--gpu-memory-utilization", "0.3", "--max-model-len", "1024")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def vllm_servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, VllmServer]]:
    work = tmp_path_factory.mktemp("vllm")
    servers = {
        "main": VllmServer(tiny_model, work / "main").start(),
        "tiny": VllmServer(tiny_model, work / "tiny", TINY_ARGS).start(),
    }
    try:
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def vllm_main(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers["main"]


@pytest.fixture(scope="session")
def vllm_tiny(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers["tiny"]


@pytest.fixture(scope="session")
def vllm_factory(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., VllmServer]]:
    """Start another real server with other flags: ``vllm_factory("--max-num-seqs", "4")``."""
    started: list[VllmServer] = []
    work = tmp_path_factory.mktemp("vllm-extra")

    def start(*args: str) -> VllmServer:
        server = VllmServer(tiny_model, work / f"s{len(started)}", tuple(args)).start()
        started.append(server)
        return server.wait_ready()

    yield start
    for server in started:
        server.stop()
