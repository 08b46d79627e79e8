"""The small exception tree raised by adapters and parsers; only pages and the CLI turn these into
messages for people."""

from __future__ import annotations

from diagnostics.core.metrics.failure import ErrorKind


class DiagnosticsError(Exception):
    """Base of every error this package raises on purpose."""


class TargetError(DiagnosticsError):
    """The target could not give a usable answer; ``kind`` says which way (a failed scrape keeps it)."""

    kind: ErrorKind = ErrorKind.UNKNOWN


class TargetUnreachable(TargetError):
    """Connection refused, DNS failure, reset: nothing answered."""

    kind = ErrorKind.UNREACHABLE


class TargetTimeout(TargetError):
    """The target did not answer within the timeout."""

    kind = ErrorKind.TIMEOUT


class TargetHTTPError(TargetError):
    """The target answered with an HTTP error status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.kind = ErrorKind.ENGINE_UNAVAILABLE if status_code == 503 else ErrorKind.HTTP_STATUS


class NotVllm(TargetError):
    """The target answered, but not as a vLLM server (no ``vllm:`` metric family)."""

    kind = ErrorKind.NOT_VLLM


class BadPayload(TargetError):
    """A response (or recorded payload) that cannot be parsed."""

    kind = ErrorKind.BAD_PAYLOAD


class BadMetricsPayload(BadPayload):
    """Prometheus text that cannot be parsed: truncated, malformed, or too large."""


class BadRecording(DiagnosticsError):
    """A recording file that cannot be read; ``line_no`` names the offending line when known."""

    def __init__(self, message: str, line_no: int | None = None) -> None:
        super().__init__(message)
        self.line_no = line_no


class NvmlUnavailable(DiagnosticsError):
    """No NVIDIA driver or library on this host: GPU memory is unknown, not zero."""
