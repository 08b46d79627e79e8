"""The exit codes a command's failure maps to, and the one error commands raise for them."""

from __future__ import annotations

EXIT_USAGE = 2
EXIT_TARGET = 3
EXIT_NOT_VLLM = 4
EXIT_FILE = 5
EXIT_UNKNOWN = 3  # diagnose: the monitoring-plugin "UNKNOWN"


class CliError(Exception):
    """A command cannot go on: the one line to print, and the exit code (``diagnose`` answers
    :data:`EXIT_UNKNOWN` whatever the code)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
