"""The fleet view (pure): one row per instance, what stands out, and a fleet-wide diagnosis.

Rows are built from the concept queries' answers (:data:`~diagnostics.core.fleet.promql.FLEET_COLUMNS`)
and each instance's own diagnosis; :func:`outliers` marks the cells an on-call engineer should look
at first, :func:`fleet_findings` says what several replicas share ("3 of 8 replicas preempting; all
on model m").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.core.diagnosis.outcomes import Outcomes
from diagnostics.core.diagnosis.types import SEVERITY_ORDER, Finding
from diagnostics.core.fleet.promql import Discovered
from diagnostics.core.metrics.slo import SloAttainment


@dataclass(frozen=True, slots=True)
class FleetRow:
    instance: str
    model: str | None
    up: bool | None
    values: Mapping[str, float | None]
    findings: tuple[Finding, ...] = ()
    error: str | None = None  # why this instance's diagnosis could not run
    slo: SloAttainment | None = None  # with budgets: the shares within them over the range
    outcomes: Outcomes | None = None  # failed, rejected and given-up requests over the range (None: not diagnosed)
    state: str | None = None  # a direct target's collector state (up, down, not_vllm, stale, starting)
    detail: str | None = None  # and why it is not up, in the collector's words

    @property
    def goodput_text(self) -> str:
        """The goodput cell: "≥ 93.0 %" (certainly within every budget set), or a dash."""
        good = self.slo.goodput_at_least if self.slo is not None else None
        return "—" if good is None else f"≥ {good * 100:.1f} %"

    @property
    def state_text(self) -> str:
        """The up cell: "up", "DOWN", "NOT vLLM" (it answers, but not with vLLM's metrics), "stale",
        "starting", or "?" when nothing says."""
        if self.state is not None and self.state in _STATE_TEXT:
            return _STATE_TEXT[self.state]
        return {True: "up", False: "DOWN", None: "?"}[self.up]

    @property
    def worst_text(self) -> str:
        """The worst-finding cell: "CRITICAL: title"; "nothing above info" for a replica whose
        diagnosis found only notes (an info title there read as the replica's trouble); else why
        there is none (the diagnosis failed, the target is not up), else a dash."""
        worst = self.worst
        if worst is not None and worst.severity != "info":
            return f"{worst.severity.upper()}: {worst.title}"
        if worst is not None:
            return "nothing above info"
        return self.error or self.detail or "—"

    @property
    def worst(self) -> Finding | None:
        return min(self.findings, key=lambda f: SEVERITY_ORDER[f.severity], default=None)

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "instance": self.instance,
            "model": self.model,
            "up": self.up,
            **{k: _clean(v) for k, v in self.values.items()},
            "worst_finding": None if worst is None else {"id": worst.id, "severity": worst.severity, "title": worst.title},
            "findings": [f.id for f in self.findings],
            "error": self.error,
            "slo": self.slo.to_json() if self.slo is not None else None,
            "outcomes": self.outcomes.to_json() if self.outcomes is not None else None,
            **({"state": self.state, "detail": self.detail} if self.state is not None else {}),
        }


_STATE_TEXT = {"up": "up", "down": "DOWN", "not_vllm": "NOT vLLM", "stale": "stale", "starting": "starting"}


def _clean(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def rows(
    instances: Sequence[Discovered],
    columns: Mapping[str, Mapping[str, float]],
    findings: Mapping[str, Sequence[Finding]] | None = None,
    errors: Mapping[str, str] | None = None,
    slo: Mapping[str, SloAttainment | None] | None = None,
    outcomes: Mapping[str, Outcomes] | None = None,
) -> list[FleetRow]:
    """One row per instance; ``columns`` maps a column key to ``{instance: value}``."""
    findings = findings or {}
    errors = errors or {}
    slo = slo or {}
    outcomes = outcomes or {}
    out = []
    for d in instances:
        values = {key: _clean(per.get(d.instance)) for key, per in columns.items()}
        out.append(FleetRow(d.instance, d.model, d.up, values, tuple(findings.get(d.instance, ())),
                            errors.get(d.instance), slo.get(d.instance), outcomes.get(d.instance)))
    return out


@dataclass(frozen=True, slots=True)
class Outlier:
    instance: str
    key: str
    why: str


# Absolute levels that matter on any single replica, whatever its peers do.
_ALARM = {"kv_cache_usage_perc": 0.95, "kv_cache_usage_peak": 0.99, "preemptions_per_s": 0.0}


def outliers(fleet: Sequence[FleetRow], *, spread: float = 2.0) -> list[Outlier]:
    """Cells to look at: a replica down; a level that matters on its own (KV near full, any
    preemption, requests waiting); and, among up replicas of one model, the busiest and idlest when
    one does ``spread`` × the other's work (an imbalanced load balancer)."""
    out: list[Outlier] = []
    for row in fleet:
        if row.up is False:
            out.append(Outlier(row.instance, "up", "down"))
        for key, level in _ALARM.items():
            value = row.values.get(key)
            if value is not None and value > level:
                out.append(Outlier(row.instance, key, "above " + ("0" if level == 0 else f"{level:.0%}")))
        waiting = row.values.get("num_requests_waiting")
        if waiting:
            out.append(Outlier(row.instance, "num_requests_waiting", "requests waiting"))
    by_model: dict[str | None, list[FleetRow]] = {}
    for row in fleet:
        if row.up is not False:
            by_model.setdefault(row.model, []).append(row)
    for model, peers in by_model.items():
        for key, noise in _IMBALANCE.items():
            known = [(v, r) for r in peers if (v := r.values.get(key)) is not None]
            if len(known) < 2:
                continue
            (low, low_row), (high, high_row) = min(known, key=lambda p: p[0]), max(known, key=lambda p: p[0])
            if high - low > noise and high > spread * low:
                why = f"load imbalance across replicas of {model or 'one model'}: {high:.3g} vs {low:.3g}"
                out.append(Outlier(high_row.instance, key, why))
                out.append(Outlier(low_row.instance, key, why))
    return out


# A replica doing `spread` times its peer's work, by more than this, is an imbalanced load balancer.
_IMBALANCE = {"num_requests_running": 2.0, "generation_tokens_per_s": 5.0}


@dataclass(frozen=True, slots=True)
class FleetFinding:
    """A finding shared by several replicas."""

    id: str
    severity: str
    title: str
    instances: tuple[str, ...]
    models: tuple[str, ...]
    total: int  # servers in the fleet
    replicas: bool = True  # every server of the fleet serves one model (else they are "servers", not replicas)

    @property
    def text(self) -> str:
        n = len(self.instances)
        where = ""
        if len(self.models) == 1:
            where = f"; {'all ' if n > 1 else ''}on model {self.models[0]}"
        elif self.models:
            where = f"; on {len(self.models)} models ({', '.join(self.models)})"
        return f"{n} of {self.total} {'replicas' if self.replicas else 'servers'}: {self.title}{where}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "title": self.title, "instances": list(self.instances),
                "models": list(self.models), "total": self.total, "text": self.text}


_SHORT = {
    "down": "down",
    "server_down": "down in this window",
    "server_restarted": "restarted in this window",
    "kv_pressure": "KV cache full and preempting",
    "queue_at_cap": "queueing at --max-num-seqs",
    "silent_stall": "stalled (requests running, no tokens)",
    "tokens_stopped": "no tokens at the end of the window",
    "head_of_line_blocking": "head-of-line blocking by long prefills",
    "slow_decode": "decode slower than the ITL budget",
    "ttft_queue_dominated": "TTFT over budget, mostly queueing",
    "ttft_prefill_dominated": "TTFT over budget, mostly prefill",
    "sharing_disabled": "prefix caching off with shared prefixes",
    "sharing_not_happening": "prefix caching on but not sharing",
}


def fleet_findings(fleet: Sequence[FleetRow]) -> list[FleetFinding]:
    """Findings grouped across replicas, worst first, then by how many replicas share them."""
    groups: dict[str, list[tuple[FleetRow, Finding | None]]] = {}
    for row in fleet:
        if row.up is False:
            groups.setdefault("down", []).append((row, None))
        for f in row.findings:
            if f.severity == "info":
                continue  # the fleet view is for what needs action; each row keeps its own
            if f.id == "server_down" and row.up is False:
                continue  # down now: said once, as "down"
            groups.setdefault(f.id, []).append((row, f))
    out = []
    replicas = len({row.model for row in fleet if row.model}) <= 1
    for fid, members in groups.items():
        first = next((f for _, f in members if f is not None), None)
        severity = "critical" if fid == "down" else first.severity if first else "info"
        title = _SHORT.get(fid) or (first.title if first else fid)
        instances = tuple(sorted({r.instance for r, _ in members}))
        models = tuple(sorted({r.model for r, _ in members if r.model}))
        out.append(FleetFinding(fid, severity, title, instances, models, len(fleet), replicas))
    out.sort(key=lambda g: (SEVERITY_ORDER.get(g.severity, 3), -len(g.instances), g.id))
    return out
