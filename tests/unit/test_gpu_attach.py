"""Where the GPU metrics URL comes from: the attach form, the configured targets, the CLI; and the
shared collector switching to it without a second collector for the same vLLM server."""

from __future__ import annotations

import httpx
import pytest

from diagnostics.cli.args import build_parser
from diagnostics.collector import register, shared_collector, stop_all
from diagnostics.core.targets import targets_from
from diagnostics.sources.dcgm_http import DcgmReader, split_gpu_metrics_url


def test_a_gpu_metrics_url_is_split_into_server_and_path() -> None:
    assert split_gpu_metrics_url("gpu-node:9400") == ("http://gpu-node:9400", "/metrics")
    assert split_gpu_metrics_url("http://gpu-node:9400/metrics/") == ("http://gpu-node:9400", "/metrics")
    assert split_gpu_metrics_url("https://h/dcgm/metrics") == ("https://h", "/dcgm/metrics")
    with pytest.raises(ValueError, match="GPU metrics URL"):
        split_gpu_metrics_url("ftp://h/metrics")


def test_configured_targets_carry_their_gpu_metrics_url_and_a_bad_one_is_named() -> None:
    config = targets_from({"targets": {"a": {"url": "http://a:8000", "gpu_metrics_url": "a:9400"},
                                       "b": {"url": "http://b:8000", "gpu_metrics_url": "ftp://b"}}},
                          {"VLLM_URL": "http://c:8000", "VLLM_GPU_METRICS_URL": "http://c:9400/metrics"})
    by_name = {t.name: t.gpu_metrics_url for t in config.targets}
    assert by_name == {"VLLM_URL": "http://c:9400/metrics", "a": "http://a:9400", "b": None}
    assert any("'b'" in p and "GPU metrics URL" in p for p in config.problems)


def test_the_cli_takes_a_gpu_metrics_url() -> None:
    args = build_parser().parse_args(["diagnose", "--url", "http://a:8000", "--gpu-metrics-url", "a:9400"])
    assert args.gpu_metrics_url == "a:9400"


def test_the_shared_collector_switches_to_a_gpu_metrics_url_given_later() -> None:
    from diagnostics.collector import Collector
    from diagnostics.sources.vllm_http import VllmClient

    client = VllmClient("http://vllm-x:8000", transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    first = register(Collector(client, interval_seconds=60))
    try:
        again = shared_collector("http://vllm-x:8000", gpu_metrics_url="http://vllm-x:9400/metrics")
        assert again is first
        assert first.gpu_source == "http://vllm-x:9400/metrics"
        reader = first._gpu_reader
        assert isinstance(reader, DcgmReader)
        # Asked again on the next refresh, spelled differently: the same reader, not a new client each time.
        shared_collector("http://vllm-x:8000", gpu_metrics_url="vllm-x:9400/metrics/")
        assert first._gpu_reader is reader
        shared_collector("http://vllm-x:8000", gpu_metrics_url="http://vllm-y:9400/metrics")
        assert first.gpu_source == "http://vllm-y:9400/metrics" and first._gpu_reader is not reader
    finally:
        stop_all()
