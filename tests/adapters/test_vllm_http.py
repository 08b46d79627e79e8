from __future__ import annotations

import socket

import httpx
import pytest

from diagnostics.errors import BadPayload, NotVllm, TargetHTTPError, TargetTimeout, TargetUnreachable
from diagnostics.sources.vllm_http import VllmClient
from tests.conftest import fixture_text

SECRET = "sk-very-secret-123"


def client_for(handler, **kw) -> VllmClient:  # type: ignore[no-untyped-def]
    return VllmClient("http://vllm.test:8000", SECRET, transport=httpx.MockTransport(handler), **kw)


def metrics_handler(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/metrics":
        return httpx.Response(200, text=fixture_text("metrics-0.32.0-burst.txt"))
    if request.url.path == "/version":
        return httpx.Response(200, json={"version": "0.32.0"})
    if request.url.path == "/v1/models":
        return httpx.Response(200, text=fixture_text("models-0.32.0.json"))
    return httpx.Response(200)


def test_bearer_token_is_sent_and_never_shown() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return metrics_handler(request)

    client = client_for(handler)
    assert client.metrics_text().startswith("#")
    assert seen == [f"Bearer {SECRET}"]
    assert SECRET not in repr(client) and SECRET not in str(vars(client))


def test_info_reads_version_model_and_max_model_len() -> None:
    info = client_for(metrics_handler).info()
    assert (info.version, info.model, info.max_model_len) == ("0.32.0", "tiny", 2048)


def test_connection_refused_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TargetUnreachable, match="cannot reach"):
        VllmClient(f"http://127.0.0.1:{port}").metrics_text()


def test_timeout_is_typed() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(TargetTimeout, match="within 2 s"):
        client_for(handler).metrics_text()


@pytest.mark.parametrize("status", [404, 500, 503])
def test_http_errors_carry_the_status(status: int) -> None:
    with pytest.raises(TargetHTTPError) as info:
        client_for(lambda r: httpx.Response(status)).metrics_text()
    assert info.value.status_code == status


def test_401_hints_at_the_api_key_without_showing_it() -> None:
    with pytest.raises(TargetHTTPError, match="check the API key") as info:
        client_for(lambda r: httpx.Response(401)).metrics_text()
    assert SECRET not in str(info.value)


def test_an_html_page_is_not_vllm() -> None:
    html = httpx.Response(200, text="<html><body>login</body></html>", headers={"content-type": "text/html"})
    with pytest.raises(NotVllm, match="HTML"):
        client_for(lambda r: html).metrics_text()


def test_a_prometheus_endpoint_without_vllm_families_is_not_vllm() -> None:
    node = "# TYPE node_load1 gauge\nnode_load1 0.5\nprocess_start_time_seconds 1.7e9\n"
    with pytest.raises(NotVllm, match="no vllm: metrics"):
        client_for(lambda r: httpx.Response(200, text=node)).metrics_text()


def test_a_50_mb_body_is_refused_by_the_size_cap() -> None:
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(50):
            yield b"#" * (1024 * 1024)

    with pytest.raises(BadPayload, match="exceeds"):
        client_for(lambda r: httpx.Response(200, content=chunks())).metrics_text()


def test_a_realistic_large_payload_is_accepted(burst_text: str) -> None:
    """40 engines (data parallel) of the real 0.32 payload, served under a real model's name:
    about 1.8 MB, under the 8 MiB cap."""
    import re

    named = burst_text.replace('model_name="tiny"', 'model_name="meta-llama/Llama-3.1-70B-Instruct"')
    lines = [line for line in named.splitlines() if line.startswith("vllm:")]
    text = named + "\n".join(re.sub(r'engine="0"', f'engine="{i}"', line)
                               for i in range(1, 40) for line in lines) + "\n"
    assert 1.6 * 2**20 < len(text.encode()) < 8 * 2**20  # 1.8 MB
    got = client_for(lambda r: httpx.Response(200, text=text)).metrics_text()
    assert len(got) == len(text)
    from diagnostics.core.metrics.catalog import parse_snapshot

    assert len(parse_snapshot(got).engines) == 40


def test_json_endpoint_answering_garbage_is_bad_payload() -> None:
    with pytest.raises(BadPayload, match="JSON"):
        client_for(lambda r: httpx.Response(200, text="not json")).info()
