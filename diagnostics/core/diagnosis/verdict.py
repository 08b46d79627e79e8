"""The verdict a page leads with: the worst finding's title, or "healthy" (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diagnostics.core.diagnosis.types import SEVERITY_ORDER, Finding, Severity


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a window comes to, in one line: the worst finding above info (the first of the most
    severe; findings arrive sorted by severity, then time), or healthy when there is none."""

    severity: Severity | None  # None: healthy
    title: str
    finding_id: str | None
    num_findings: int  # findings above info

    @property
    def healthy(self) -> bool:
        return self.severity is None


def verdict(findings: Sequence[Finding]) -> Verdict:
    serious = [f for f in findings if f.severity != "info"]
    if not serious:
        return Verdict(None, "Healthy: no rule found anything to act on in this window", None, 0)
    worst = min(serious, key=lambda f: SEVERITY_ORDER[f.severity])
    return Verdict(worst.severity, worst.title, worst.id, len(serious))
