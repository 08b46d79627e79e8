"""vLLM's HTTP surface for the simulated engine, on loopback: /health, /version, /v1/models,
/v1/completions and /v1/chat/completions (streaming too) and /metrics; plus /sim/scenario to
switch scenarios at runtime, and /dcgm/metrics: its GPUs as NVIDIA dcgm-exporter shows them (the GPU
metrics URL; :mod:`diagnostics.sim.dcgm`). The dashboard attaches to it exactly as to a real server.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from diagnostics.core.simulator.request import SimRequest
from diagnostics.core.simulator.scenarios import SCENARIOS
from diagnostics.sim.driver import Simulation

SIM_VERSION = "0.32.0"
MAX_REQUEST_BYTES = 1 << 20
MAX_WAIT_SECONDS = 600.0
SIM_DCGM_PATH = "/dcgm/metrics"


def _prompt_ids(prompt: Any) -> list[int]:
    """Token ids for a prompt: ids are taken as they are, text is 'tokenized' as one id per word."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return [zlib.crc32(word.encode()) % 30000 + 10 for word in str(prompt).split()] or [10]


class _Handler(BaseHTTPRequestHandler):
    sim: Simulation
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        sim = self.sim
        path = self.path.split("?")[0]
        if path in ("/health", "/ping"):
            self._send(200, b"")
        elif path == "/version":
            self._json(200, {"version": SIM_VERSION, "simulated": True, "scenario": sim.scenario.name})
        elif path == "/v1/models":
            cfg = sim.scenario.config
            self._json(200, {"object": "list", "data": [{
                "id": cfg.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": f"simulated/{cfg.model.name}", "parent": None, "max_model_len": cfg.max_model_len}]})
        elif path.rstrip("/") == "/metrics":
            self._send(200, sim.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path.rstrip("/") == SIM_DCGM_PATH:
            self._send(200, sim.dcgm_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/sim/scenario":
            self._json(200, {"scenario": sim.scenario.name, "scenarios": {
                n: {"title": s.title, "symptom": s.symptom, "finding": s.knob} for n, s in SCENARIOS.items()}})
        else:
            self._json(404, {"error": "not found"})

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            self._json(413, {"error": "request too large"})
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": "body is not JSON"})
            return None
        if not isinstance(body, dict):
            self._json(400, {"error": "body must be a JSON object"})
            return None
        return body

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        if body is None:
            return
        path = self.path.split("?")[0]
        if path == "/sim/scenario":
            try:
                self.sim.set_scenario(str(body.get("scenario", "")))
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
                return
            self._json(200, {"scenario": self.sim.scenario.name})
        elif path in ("/v1/completions", "/v1/chat/completions"):
            self._generate(body, chat=path.endswith("chat/completions"))
        else:
            self._json(404, {"error": "not found"})

    def _generate(self, body: dict[str, Any], chat: bool) -> None:
        if chat:
            messages = body.get("messages") or []
            prompt: Any = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            prompt = body.get("prompt", "")
        try:
            max_tokens = max(1, min(int(body.get("max_tokens") or 16), 8192))
            n = max(1, min(int(body.get("n") or 1), 16))
        except (TypeError, ValueError):
            self.sim.metrics.answered(400, self.path.split("?")[0])
            self._json(400, {"error": "max_tokens and n must be integers"})
            return
        ids = _prompt_ids(prompt)
        limit = self.sim.scenario.config.max_model_len
        if len(ids) > limit:
            # vllm/renderers/params.py _token_len_check: refused before the engine sees it (HTTP 400).
            self.sim.metrics.answered(400, self.path.split("?")[0])
            self._json(400, {"error": {"message": f"This model's maximum context length is {limit} tokens. However, "
                                                  f"your prompt contains {len(ids)} input tokens, which exceeds this "
                                                  "limit even without any output tokens. Please reduce the length of "
                                                  "the input prompt.", "type": "BadRequestError", "code": 400}})
            return
        done = threading.Event()
        counts: dict[str, int] = {}
        lock = threading.Lock()
        remaining = [n]

        def on_token(req: SimRequest) -> None:
            with lock:
                counts[req.request.request_id] = req.num_output
                if req.finished_reason is not None or req.num_output >= req.max_tokens:
                    remaining[0] -= 1
                    if remaining[0] <= 0:
                        done.set()

        reqs = self.sim.add_request(ids, max_tokens, n, on_token)
        if reqs is None:
            self._json(503, {"error": {"message": "The server is overloaded: the queue limit "
                                                  "(--max-num-queued-reqs) was reached.", "type": "ServiceUnavailable",
                                       "code": 503}})
            return
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        model = self.sim.scenario.config.served_model_name
        if body.get("stream"):
            self._stream(rid, model, reqs, done, chat)
            return
        if not done.wait(MAX_WAIT_SECONDS):
            self._json(504, {"error": "the simulated engine did not finish in time"})
            return
        choices = []
        for i, req in enumerate(reqs):
            text = " ".join("tok" for _ in range(req.num_output))
            reason = "length" if req.finished_reason != "abort" else "abort"
            choice: dict[str, Any] = {"index": i, "finish_reason": reason}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            choices.append(choice)
        prompt_tokens = reqs[0].request.num_prompt_tokens
        self._json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion", "model": model,
                         "choices": choices, "usage": {"prompt_tokens": prompt_tokens,
                                                       "completion_tokens": sum(r.num_output for r in reqs),
                                                       "total_tokens": prompt_tokens + sum(r.num_output for r in reqs)}})

    def _stream(self, rid: str, model: str, reqs: list[SimRequest], done: threading.Event, chat: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = [0] * len(reqs)
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        try:
            while time.monotonic() < deadline:
                finished = done.is_set()
                for i, req in enumerate(reqs):
                    while sent[i] < req.num_output:
                        sent[i] += 1
                        delta: dict[str, Any] = ({"delta": {"content": "tok "}} if chat else {"text": "tok "})
                        chunk = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                                 "model": model, "choices": [{"index": i, "finish_reason": None, **delta}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                if finished:
                    break
                done.wait(0.01)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


class SimServer:
    """The simulated server on ``127.0.0.1:port`` (0 = a free port), in daemon threads."""

    def __init__(self, scenario: str = "healthy", port: int = 0, host: str = "127.0.0.1", speed: float = 1.0) -> None:
        self.sim = Simulation(scenario)
        handler = type("SimHandler", (_Handler,), {"sim": self.sim})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        # dcgm-exporter names the node its GPUs are on: here the address the server listens on (the
        # host part of its vLLM instance, so the Fleet page's join by host matches it), or this
        # machine's name for a wildcard address.
        node = host if host not in ("", "0.0.0.0", "::") else socket.gethostname()
        self.sim.name_gpu_host(node, f"{node}:{self.httpd.server_address[1]}")
        self._speed = speed
        self._thread: threading.Thread | None = None

    def start(self) -> SimServer:
        self.sim.start(self._speed)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="simulated vLLM http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.sim.stop()
