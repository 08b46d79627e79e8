"""Runs the rule table over a context: the one place where rules are combined."""

from __future__ import annotations

from collections.abc import Sequence

from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.table import RULES
from diagnostics.core.diagnosis.types import SEVERITY_ORDER, Finding


def diagnose(ctx: Context) -> list[Finding]:
    """Every rule of :data:`RULES` over the context; findings sorted by severity, then time.

    A rule whose ``suppressed_by`` rule reported a problem loses its own warnings and criticals
    (the other rule names the cause); its info findings, which say why it could not judge, stay.
    """
    by_rule = {rule.id: rule.run(ctx) if ctx.ok or not rule.needs_scrapes else [] for rule in RULES}
    findings: list[Finding] = []
    for rule in RULES:
        suppressed = any(f.severity != "info" for other in rule.suppressed_by for f in by_rule[other])
        findings += [f for f in by_rule[rule.id] if not suppressed or f.severity == "info"]
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.time_range[0] if f.time_range else 0))


def exit_code(findings: Sequence[Finding]) -> int:
    """0 = nothing above info, 1 = a warning, 2 = a critical finding."""
    worst = min((SEVERITY_ORDER[f.severity] for f in findings), default=2)
    return {0: 2, 1: 1}.get(worst, 0)
