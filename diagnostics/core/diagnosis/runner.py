"""Runs the rule table over a context: the one place where rules are combined and where each
finding gets what its row points to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from diagnostics.core.diagnosis.causes import cause_knobs
from diagnostics.core.diagnosis.context import Context
from diagnostics.core.diagnosis.table import RULES, Rule
from diagnostics.core.diagnosis.types import SEVERITY_ORDER, Finding, KnownFlags


def diagnose(ctx: Context) -> list[Finding]:
    """Every rule of :data:`RULES` over the context; findings sorted by severity, then time.

    While requests run and no token moves (``ctx.tokens_stopped``), rules marked
    ``while_tokens_stopped=False`` are not run: their queue or capacity advice would be wrong. Rules
    marked ``only_when_quiet`` run last, and only when nothing above info was found. Every
    suggestion is checked against the server's known flags; one the configuration makes ineffective
    is dropped and the finding says why (see :meth:`KnownFlags.ineffective`).
    """
    findings: list[Finding] = []
    for rule in [r for r in RULES if not r.only_when_quiet] + [r for r in RULES if r.only_when_quiet]:
        if (rule.needs_scrapes and not ctx.ok) or (ctx.tokens_stopped is not None and not rule.while_tokens_stopped):
            continue
        if rule.only_when_quiet and any(f.severity != "info" for f in findings):
            continue
        findings += [_effective(f, ctx.flags) for f in run_rule(rule, ctx)]
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.id not in _LEADING,
                                           f.time_range[0] if f.time_range else 0))


_LEADING = frozenset(fid for rule in RULES if rule.leads for fid in rule.finding_ids)


def run_rule(rule: Rule, ctx: Context) -> list[Finding]:
    """One row's findings with what the row points to stamped on (:meth:`Rule.stamp`): its knobs (or,
    for a finding that names a cause of the cause table, that cause's knob row),
    its chart when there is a good scrape to draw it from, and the window judged (``window``
    evidence: first and last scrape) when the row's finding was judged on scrapes."""
    window = _window(ctx)
    out = []
    for finding in rule.run(ctx):
        stamp = rule.stamp(finding.id)
        evidence = {**finding.evidence, "window": window} if stamp.window and window else finding.evidence
        # A finding that checked its symptom's causes rests on the named cause's knob row, not the row's.
        knobs = cause_knobs(finding.evidence)
        out.append(replace(finding, knobs=stamp.knobs if knobs is None else knobs,
                           chart=stamp.chart if ctx.ok else None, evidence=evidence))
    return out


def _window(ctx: Context) -> dict[str, Any] | None:
    if not ctx.history:
        return None
    first, last = ctx.history[0].ts, ctx.history[-1].ts
    return {"start": first, "end": last, "seconds": round(last - first, 3)}


def _effective(finding: Finding, flags: KnownFlags) -> Finding:
    kept, dropped = [], []
    for s in finding.suggestions:
        why = flags.ineffective(s)
        if why is None:
            kept.append(s)
        else:
            dropped.append(f"Not suggested: {s.flag} ({why}).")
    if not dropped:
        return finding
    return replace(finding, suggestions=tuple(kept), checks=(*finding.checks, *dropped))


def exit_code(findings: Sequence[Finding]) -> int:
    """0 = nothing above info, 1 = a warning, 2 = a critical finding."""
    worst = min((SEVERITY_ORDER[f.severity] for f in findings), default=2)
    return {0: 2, 1: 1}.get(worst, 0)
