"""Prometheus text exposition → samples, for the ``vllm:`` families only.

prometheus_client's ``text_string_to_metric_families`` is the reference parser, but it takes about
20 ms for a real 52 KB vLLM payload: 2 % of a 1 s scrape interval spent before any maths. This
parser reads only what the dashboard uses (``vllm:`` samples, minus ``*_created``, plus
``process_start_time_seconds`` and the API server's ``http_requests_total``) and is checked sample-for-sample against prometheus_client on real
payloads (``tests/unit/test_parse.py``, ``bench/ingest.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from diagnostics.errors import BadMetricsPayload

VLLM_PREFIX = "vllm:"
PROCESS_START = "process_start_time_seconds"
# prometheus-fastapi-instrumentator's counter in vLLM's API server: requests by handler, method and
# status class ("2xx", "4xx", "5xx"); the outcomes of requests the engine never saw are only here.
HTTP_REQUESTS = "http_requests_total"
# Its request-size summary: the bytes each handler received (refused requests too), ``_sum`` read.
HTTP_REQUEST_SIZE_SUM = "http_request_size_bytes_sum"

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_UNESCAPE = re.compile(r"\\(.)")


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposed sample line: ``name{labels} value``."""

    name: str
    labels: dict[str, str]
    value: float


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _parse_labels(text: str, line_no: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    end = len(text)
    while pos < end:
        m = _LABEL.match(text, pos)
        if m is None:
            if text[pos:].strip() in ("", ","):
                break
            raise BadMetricsPayload(f"line {line_no}: malformed labels {text[:80]!r}")
        value = m.group(2)
        labels[m.group(1)] = _unescape(value) if "\\" in value else value
        pos = m.end()
    return labels


def _parse_value(text: str, line_no: int) -> float:
    parts = text.split()
    if not parts or len(parts) > 2:
        raise BadMetricsPayload(f"line {line_no}: expected a value, got {text[:80]!r}")
    try:
        return float(parts[0])
    except ValueError:
        raise BadMetricsPayload(f"line {line_no}: not a number: {parts[0][:40]!r}") from None


def parse_line(line: str, line_no: int = 0) -> Sample:
    """Parse one sample line; raise :class:`BadMetricsPayload` when it is malformed."""
    brace = line.find("{")
    if brace >= 0:
        close = line.rfind("}")
        if close < brace:
            raise BadMetricsPayload(f"line {line_no}: unterminated label set {line[:80]!r}")
        name = line[:brace].strip()
        labels = _parse_labels(line[brace + 1 : close], line_no)
        value = _parse_value(line[close + 1 :], line_no)
    else:
        name, _, rest = line.partition(" ")
        labels = {}
        value = _parse_value(rest, line_no)
    if not _NAME.match(name):
        raise BadMetricsPayload(f"line {line_no}: bad metric name {name[:80]!r}")
    return Sample(name, labels, value)


def parse_vllm_samples(text: str) -> list[Sample]:
    """Every ``vllm:`` sample (``*_created`` skipped), ``process_start_time_seconds``,
    ``http_requests_total`` and ``http_request_size_bytes_sum``.

    Values are floats as exposed, NaN and ±Inf included. A malformed line among those read raises
    :class:`BadMetricsPayload` naming its line number; other families are not inspected.
    """
    samples: list[Sample] = []
    for line_no, line in enumerate(text.split("\n"), start=1):
        if line.startswith(VLLM_PREFIX):
            head = line.split("{", 1)[0].split(" ", 1)[0]
            if head.endswith("_created"):
                continue
            samples.append(parse_line(line.rstrip("\r"), line_no))
        elif line.startswith(PROCESS_START):
            sample = parse_line(line.rstrip("\r"), line_no)
            if sample.name == PROCESS_START and math.isfinite(sample.value):
                samples.append(sample)
        elif line.startswith(HTTP_REQUESTS):
            sample = parse_line(line.rstrip("\r"), line_no)
            if sample.name == HTTP_REQUESTS:
                samples.append(sample)
        elif line.startswith(HTTP_REQUEST_SIZE_SUM):
            sample = parse_line(line.rstrip("\r"), line_no)
            if sample.name == HTTP_REQUEST_SIZE_SUM:
                samples.append(sample)
    return samples


def parse_prefixed_samples(text: str, prefix: str) -> list[Sample]:
    """Every sample whose name starts with ``prefix`` (another exporter's families, e.g. dcgm-exporter's
    ``DCGM_FI_``), read with the same line parser; other lines are not inspected."""
    return [parse_line(line.rstrip("\r"), line_no)
            for line_no, line in enumerate(text.split("\n"), start=1) if line.startswith(prefix)]
