"""Predictions attached to a diagnosis: every suggestion of a warning or critical finding that
the simulated engine models gets its predicted effect, or a note saying why there is none."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from diagnostics.core.diagnosis.types import Finding, KnownFlags
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.whatif.flags import MODELLED, NotModelled
from diagnostics.core.whatif.gate import aimed_for
from diagnostics.core.whatif.predict import Baseline, baseline
from diagnostics.core.whatif.words import summary

SWITCHES = ("--enable-prefix-caching", "--no-enable-prefix-caching")


def suggestion_changes(flag: str, value: object) -> dict[str, str]:
    """A suggestion's flag and value as a what-if change (a switch without a value turns it on);
    :class:`NotModelled` when a flag that needs a value has none (the rule could not derive it)."""
    if value is None or value is True:
        if flag in SWITCHES or flag not in MODELLED:
            return {flag: "true"}
        raise NotModelled(f"{flag}: the suggestion names no value to replay (the window did not show which)")
    return {flag: str(value)}


def with_predictions(findings: Sequence[Finding], scrapes: Sequence[Scrape], known: KnownFlags,
                     *, seed: int = 0) -> tuple[tuple[Finding, ...], Baseline | None, str | None]:
    """The findings with a ``prediction`` on every suggestion of a warning or critical finding that
    the simulator models (or a ``prediction_note`` saying why there is none); the baseline used, and
    why there is none when the window cannot be replayed. Each prediction is checked on its own
    finding's aimed metrics (:mod:`.gate`): where the baseline does not reproduce them, the note
    says so with both numbers and there is no after-value."""
    wanted = [f for f in findings if f.severity != "info" and f.suggestions]
    if not wanted:
        return tuple(findings), None, None
    try:
        base = baseline(scrapes, known, seed=seed)
    except ValueError as exc:
        note = f"no prediction: {exc}"
        return tuple(_noted(f, note) if f in wanted else f for f in findings), None, str(exc)
    except Exception as exc:  # noqa: BLE001 — a prediction must never cost the diagnosis
        note = f"no prediction: the replay failed ({type(exc).__name__}: {exc})"
        return tuple(_noted(f, note) if f in wanted else f for f in findings), None, note
    out = []
    for f in findings:
        if f not in wanted:
            out.append(f)
            continue
        suggestions = []
        for sug in f.suggestions:
            try:
                pred = base.predict(suggestion_changes(sug.flag, sug.value), aimed=aimed_for([f.id]))
                suggestions.append(replace(sug, prediction=pred, prediction_note=summary(pred)))
            except ValueError as exc:  # NotModelled, or a value that cannot be applied
                suggestions.append(replace(sug, prediction_note=f"no prediction: {exc}"))
            except Exception as exc:  # noqa: BLE001 — a prediction must never cost the diagnosis
                suggestions.append(replace(sug, prediction_note=f"no prediction: the replay failed "
                                                                f"({type(exc).__name__}: {exc})"))
        out.append(replace(f, suggestions=tuple(suggestions)))
    return tuple(out), base, None


def _noted(finding: Finding, note: str) -> Finding:
    return replace(finding, suggestions=tuple(replace(s, prediction_note=note) for s in finding.suggestions))
