"""Every real ``vllm serve`` the suite uses, by name, started early and in parallel.

A vLLM start on this machine is 15-90 s, mostly one core's work or waiting on its own processes, so
nine started one module at a time cost the suite three minutes of waiting. The pool starts the
servers the session's tests will ask for ahead of them: the first one asked for (and its fixture's
partners) at once, every other one the session needs as soon as that one is ready, in the
background while the tests that need only the first ones run. A module fixture takes its servers
with :meth:`ServerPool.get` (ready when it returns) and gives them back with
:meth:`ServerPool.release` (stopped: a module may leave one killed or stopped).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.vllm_server import VllmServer, build_tiny_lora, build_tiny_model

TINY_ARGS = ("--num-gpu-blocks-override", "12", "--gpu-memory-utilization", "0.3", "--max-model-len", "1024")
API_KEY = "sk-triage-test-0123456789"
SPECULATION = ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, '
               '"prompt_lookup_min": 1}')


@dataclass(frozen=True)
class Spec:
    """How to start one server: the model shape (``build_tiny_model``), its flags (a callable of
    the pool's work folder where a flag names a file the pool builds), its environment."""

    shape: str = "tiny"
    args: Callable[[Path], tuple[str, ...]] = lambda _work: ()
    env: dict[str, str] = field(default_factory=dict)


SPECS: dict[str, Spec] = {
    # 64 MiB of KV cache: 1,024 blocks of 128 tokens.
    "main": Spec(),
    # 12 blocks: preemption and waiting within seconds.
    "tiny": Spec(args=lambda _w: TINY_ARGS),
    "cap4": Spec(args=lambda _w: ("--max-num-seqs", "4", "--max-num-queued-reqs", "8")),
    # /sleep and /wake_up need the dev mode.
    "noprefix": Spec(args=lambda _w: ("--no-enable-prefix-caching",), env={"VLLM_SERVER_DEV_MODE": "1"}),
    # Two 1,800-token prompts prefill in one step under this budget: 0.4-1.6 s on 2 idle cores (the
    # 4-layer model's 1,200 tokens took 60 ms, under a decoder's notice on a fast host).
    "small": Spec("small", lambda _w: ("--max-num-batched-tokens", "4096", "--kv-cache-memory-bytes", str(256 * 2**20))),
    "lora": Spec(args=lambda w: ("--enable-lora", "--max-loras", "1", "--max-lora-rank", "8",
                                 "--lora-modules", f"a={w / 'lora'}", f"b={w / 'lora'}")),
    "dp2": Spec(args=lambda _w: ("--data-parallel-size", "2")),
    # Real weights that always answer token 0, so the prompt decides what the n-gram drafter proposes.
    "spec": Spec("repeat", lambda _w: ("--load-format", "safetensors", "--speculative-config", SPECULATION,
                                       "--enable-mfu-metrics")),
    "keyed": Spec(args=lambda _w: ("--api-key", API_KEY)),
}

# The fixtures that take servers from the pool, and which ones: the pool reads the session's tests'
# fixtures to know what to start ahead.
FIXTURES: dict[str, tuple[str, ...]] = {
    "vllm_servers": ("main", "tiny"),
    "condition_servers": ("cap4", "noprefix", "small", "lora"),
    "dp2": ("dp2",),
    "spec_server": ("spec",),
    "keyed_server": ("keyed",),
}


def needed_by(fixture_names: Iterable[Iterable[str]]) -> list[str]:
    """The servers the tests with these fixture names ask for, in :data:`SPECS` order."""
    wanted = {server for names in fixture_names for name in names for server in FIXTURES.get(name, ())}
    return [name for name in SPECS if name in wanted]


class ServerPool:
    def __init__(self, tiny_model: Path, work: Path, ahead: Iterable[str] = ()) -> None:
        self.tiny_model = tiny_model
        self.work = work
        self.ahead = [name for name in ahead if name in SPECS]
        self.servers: dict[str, VllmServer] = {}
        self.lock = threading.Lock()
        self.prefetch: threading.Thread | None = None

    def _model(self, shape: str) -> Path:
        return self.tiny_model if shape == "tiny" else build_tiny_model(self.work / f"model-{shape}", shape)

    def start(self, name: str) -> VllmServer:
        """Start ``name`` unless it is started (not waiting for it)."""
        with self.lock:
            if name in self.servers:
                return self.servers[name]
            spec = SPECS[name]
            if name == "lora":
                build_tiny_lora(self.work / "lora")
            # Short folders: vLLM's IPC socket path must fit in 107 characters.
            server = VllmServer(self._model(spec.shape), self.work / name, spec.args(self.work), env=spec.env or None)
            self.servers[name] = server.start()
            return server

    def get(self, *names: str) -> list[VllmServer]:
        """``names`` started and ready; the first call then starts every other server the session
        needs, in the background."""
        servers = [self.start(name) for name in names]
        for server in servers:
            server.wait_ready()
        if self.prefetch is None:
            self.prefetch = threading.Thread(target=self._start_ahead, daemon=True)
            self.prefetch.start()
        return servers

    def _start_ahead(self) -> None:
        for name in self.ahead:
            try:
                self.start(name)
            except Exception:  # noqa: BLE001, S112 — started again, and said, by the fixture that asks for it
                continue

    def take(self, fixture: str) -> dict[str, VllmServer]:
        """The servers :data:`FIXTURES` gives ``fixture``, ready, by name."""
        names = FIXTURES[fixture]
        return dict(zip(names, self.get(*names), strict=True))

    @contextlib.contextmanager
    def lend(self, fixture: str) -> Iterator[dict[str, VllmServer]]:
        """:meth:`take`, released on exit."""
        try:
            yield self.take(fixture)
        finally:
            self.release(*FIXTURES[fixture])

    def release(self, *names: str) -> None:
        """Stop ``names`` (a module is done with them; one asked for again starts anew)."""
        for name in names:
            with self.lock:
                server = self.servers.pop(name, None)
            if server is not None:
                server.stop()

    def close(self) -> None:
        if self.prefetch is not None:
            self.prefetch.join(120)
        for server in list(self.servers.values()):
            server.stop()
