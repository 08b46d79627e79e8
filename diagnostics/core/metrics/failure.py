"""Why a scrape failed, as a value: rules judge the kind, people read the message beside it.

A rule that matched the adapter's English ("timed out", "503") broke the day the wording changed;
the adapters' typed errors (:mod:`diagnostics.errors`) each name their kind instead, and a
recording stores it next to the message.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """The kind of a failed scrape (the value is what a recording stores)."""

    UNREACHABLE = "unreachable"  # nothing answered: connection refused or reset, DNS failure
    TIMEOUT = "timeout"  # no complete answer within the scrape timeout
    # HTTP 503 Service Unavailable: vLLM's frontend answers it while its engine is dead
    ENGINE_UNAVAILABLE = "engine_unavailable"
    HTTP_STATUS = "http_status"  # any other HTTP error status (401/403: the API key; 404; 500)
    NOT_VLLM = "not_vllm"  # an answer, but not a vLLM server's metrics
    BAD_PAYLOAD = "bad_payload"  # an answer that cannot be parsed (truncated, too large, not UTF-8)
    UNKNOWN = "unknown"  # the source does not say why (Prometheus' up == 0, an old recording)
