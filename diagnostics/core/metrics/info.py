"""Value types for what a target is and how it is doing (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

TargetState = Literal["starting", "up", "down", "stale", "not_vllm"]


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What ``/version`` and ``/v1/models`` say; the raw JSON is kept for recordings."""

    version: str | None
    model: str | None
    max_model_len: int | None
    version_json: Any
    models_json: Any

    @classmethod
    def from_json(cls, version_json: Any, models_json: Any) -> ServerInfo:
        version = version_json.get("version") if isinstance(version_json, dict) else None
        model = None
        max_model_len = None
        data = models_json.get("data") if isinstance(models_json, dict) else None
        if isinstance(data, list):
            bases = [m for m in data if isinstance(m, dict) and not m.get("parent")]
            if bases:
                model = str(bases[0].get("id")) if bases[0].get("id") is not None else None
                raw_len = bases[0].get("max_model_len")
                max_model_len = raw_len if isinstance(raw_len, int) else None
        return cls(str(version) if version is not None else None, model, max_model_len, version_json, models_json)


@dataclass(frozen=True, slots=True)
class TargetStatus:
    """The collector's view of its target, kept beside the history.

    ``since`` is when the current state began (for *down*: the first failed scrape after the last
    good one). ``error`` is the last failure's message, with no secret in it. ``info_error`` says
    why ``/version`` or ``/v1/models`` could not be read (vLLM guards ``/v1`` with ``--api-key``
    while ``/metrics`` stays open, so a missing key shows up only there).
    """

    target: str
    state: TargetState
    since: float | None
    error: str | None
    last_ok_ts: float | None
    last_attempt_ts: float | None
    info: ServerInfo | None
    num_scrapes: int
    num_failures: int
    info_error: str | None = None
