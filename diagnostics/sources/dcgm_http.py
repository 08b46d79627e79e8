"""NVIDIA dcgm-exporter over HTTP: the "GPU metrics URL" beside the vLLM URL, for a dashboard that is
not on the GPU host (Kubernetes, where dcgm-exporter runs as a DaemonSet on port 9400).

The same HTTP client as vLLM's (deadline, byte cap, typed errors) fetches the text, and the pure
parser (:func:`diagnostics.core.metrics.dcgm.parse_dcgm`) turns it into the same typed
:class:`GpuReading` NVML gives, so the collector, the charts and the rules cannot tell them apart.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from diagnostics.core.metrics.dcgm import parse_dcgm
from diagnostics.core.metrics.gpu import GpuReading
from diagnostics.core.targets import normalize_url
from diagnostics.errors import BadPayload, TargetError
from diagnostics.sources.vllm_http import VllmClient

DEFAULT_PATH = "/metrics"


def split_gpu_metrics_url(url: str) -> tuple[str, str]:
    """``host:9400`` or ``http://host:9400/metrics`` → (``http://host:9400``, ``/metrics``): the
    server and the path (``/metrics`` when none is given). ``ValueError`` for a URL that cannot be used."""
    normal = normalize_url(url, "GPU metrics URL")
    parts = urlsplit(normal)
    path = parts.path or DEFAULT_PATH
    return f"{parts.scheme}://{parts.netloc}", path + (f"?{parts.query}" if parts.query else "")


class DcgmReader:
    """A GPU reader for the collector: one GET of the exporter per call; never raises (a failure
    is a reading that says why, as NVML's is)."""

    def __init__(self, url: str, *, timeout_seconds: float = 2.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        base, self.path = split_gpu_metrics_url(url)
        self.url = base + self.path
        self._client = VllmClient(base, timeout_seconds=timeout_seconds, transport=transport)

    def __repr__(self) -> str:
        return f"DcgmReader({self.url!r})"

    def __call__(self) -> GpuReading:
        try:
            return parse_dcgm(self._client.prometheus_text(self.path), source=self.url)
        except (TargetError, BadPayload) as exc:
            return GpuReading(unavailable=f"GPU metrics URL: {exc}", source=self.url)

    def close(self) -> None:
        self._client.close()
