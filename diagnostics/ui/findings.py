"""Finding cards and the searchable knob table for the Diagnose page."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import partial

import pandas as pd
import streamlit as st

from diagnostics.core import whatif
from diagnostics.core.diagnosis import Finding, KnownFlags, Suggestion, command_diff
from diagnostics.core.diagnosis.causes import card_lines
from diagnostics.core.diagnosis.knobs import KNOB_TABLE, KNOBS_BY_ID
from diagnostics.core.figures.diagnose import finding_figure
from diagnostics.core.figures.prediction import prediction_figure
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.text import evidence_rows, md_escape
from diagnostics.core.whatif.goals import Goal, GoalAnswer, seek
from diagnostics.ui.charts import chart

BADGES = {"critical": ":red-badge[CRITICAL]", "warning": ":orange-badge[WARNING]", "info": ":blue-badge[INFO]"}


def _when(time_range: tuple[float, float] | None) -> str:
    if not time_range:
        return ""
    a, b = (datetime.fromtimestamp(x).strftime("%H:%M:%S") for x in time_range)
    return f" · {a}" if a == b else f" · {a} – {b}"


def diff_text(flags: KnownFlags, suggestion: Suggestion) -> str:
    """The `vllm serve` line before and after one change, as a unified-diff snippet."""
    diff = command_diff(flags, [suggestion])
    return f"- {diff.before}\n+ {diff.after}"


@st.cache_data(show_spinner="Replaying this window on the simulated engine…", max_entries=16, ttl=900)
def _predicted(key: tuple[object, ...], _findings: Sequence[Finding], _history: Sequence[Scrape],
               _flags: KnownFlags) -> tuple[tuple[Finding, ...], dict[str, float | None] | None, str | None]:
    found, base, why = whatif.with_predictions(_findings, _history, _flags)
    return found, (base.baseline_error if base is not None else None), why


def with_predictions(findings: Sequence[Finding], history: Sequence[Scrape], flags: KnownFlags,
                     live: bool) -> tuple[tuple[Finding, ...], dict[str, float | None] | None, str | None]:
    """The findings with the predicted effect of each suggestion (cached: a live window is replayed
    again at most every 30 s)."""
    ok = [s for s in history if s.snapshot is not None]
    if not ok:
        return tuple(findings), None, None
    last = ok[-1].ts // 30 if live else ok[-1].ts
    key = (len(ok) if not live else 0, ok[0].ts if not live else 0, last,
           tuple((f.id, tuple((s.flag, str(s.value)) for s in f.suggestions)) for f in findings), flags)
    cached, error, why = _predicted(key, tuple(findings), ok, flags)
    # The cache keys on the findings' suggestions: apply what it holds to the findings of this run.
    by_id = {(f.id, tuple((s.flag, str(s.value)) for s in f.suggestions)): f for f in cached}
    out = tuple(by_id.get((f.id, tuple((s.flag, str(s.value)) for s in f.suggestions)), f) for f in findings)
    return out, error, why


def prediction(suggestion: Suggestion, replay_error: dict[str, float | None] | None, key: str) -> None:
    """The predicted effect of one suggestion, or why there is none."""
    if suggestion.prediction is not None and not suggestion.prediction.reproduces:
        # No after-value from a replay that misses the window: the note says both numbers.
        st.warning(f"**No prediction:** {md_escape(suggestion.prediction_note or '')}. The replay under the current "
                   "flags misses what this window recorded beyond the stated error, so what it says a change "
                   "does would not be about this incident.")
    elif suggestion.prediction is not None:
        chart(partial(prediction_figure, suggestion.prediction), key, "No metric to compare.")
        note = f"**Predicted:** {md_escape(suggestion.prediction_note or '')}"
        if (share := whatif.api_server_text(suggestion.prediction)) is not None:
            note += f"  \nTTFT: {md_escape(share)}."
        if replay_error:
            parts = [f"{whatif.LABELS[m]} {e * 100:.0f} %" for m in ("itl_p95_seconds", "ttft_p95_seconds",
                                                                   "output_tokens_per_second")
                     if (e := replay_error.get(m)) is not None]
            note += ("  \nHow far the replay under the current flags is from what this window recorded: "
                     + ", ".join(parts) + ". Treat the prediction as a direction and a rough size; confirm under "
                     "load (Probe page) after the change.")
        st.caption(note)
    elif suggestion.prediction_note:
        st.caption(md_escape(suggestion.prediction_note))


def budget_goals(itl_ms: float, ttft_ms: float) -> list[Goal]:
    """The page's budgets (p95, ms; 0 = none) as goals."""
    out = []
    if itl_ms:
        out.append(Goal("itl_p95_seconds", itl_ms / 1000))
    if ttft_ms:
        out.append(Goal("ttft_p95_seconds", ttft_ms / 1000))
    return out


@st.cache_data(show_spinner="Searching the modelled flags on this window's workload…", max_entries=8, ttl=900)
def _sought(key: tuple[object, ...], _history: Sequence[Scrape], _flags: KnownFlags,
            goals: tuple[Goal, ...], keep: tuple[str, ...]) -> GoalAnswer | str:
    try:
        return seek(_history, _flags, goals, keep)
    except ValueError as exc:
        return str(exc)


def goal_seek(history: Sequence[Scrape], flags: KnownFlags, goals: Sequence[Goal], keep_throughput: bool) -> None:
    """The smallest modelled change that meets the budget on this window, its trade-off and the
    next best two (or that none does, and the closest)."""
    ok = [s for s in history if s.snapshot is not None]
    if not goals:
        st.info("Set an ITL or a TTFT budget above: the search looks for a change that meets it.")
        return
    if len(ok) < 3:
        st.info("The window has too few scrapes to replay.")
        return
    keep = ("throughput",) if keep_throughput else ()
    answer = _sought((len(ok), ok[0].ts, ok[-1].ts, flags), ok, flags, tuple(goals), keep)
    if isinstance(answer, str):
        st.warning(f"Cannot replay this window: {md_escape(answer)}")
        return
    every = [*answer.goals, *answer.keep]
    span = answer.searched_span
    where = ("the whole window" if span[1] - span[0] >= answer.window_seconds - 1
             else f"its worst {span[1] - span[0]:.0f} s of {answer.window_seconds:.0f} s")
    st.caption(f"Goals: {md_escape(', '.join(g.text() for g in every))} · {answer.trials} changes replayed on {where} "
               f"in {answer.seconds:.1f} s" + (" (the time budget ran out before every candidate was tried)"
                                                 if answer.cut_short else ""))
    if not answer.reproduces:
        st.warning(f"**No answer:** {md_escape(whatif.not_reproduced(answer.checks))}, so no change can be judged "
                   "against it.")
        return
    if answer.already_met:
        st.success("The current flags already meet the budget on this window's replay.")
        return
    rows = []
    lead = answer.found[0] if answer.found else answer.closest
    for i, t in enumerate([x for x in (lead, *answer.found[1:], *answer.near) if x is not None]):
        p = t.prediction
        row: dict[str, str] = {"": "answer" if i == 0 and answer.found else ("closest" if i == 0 else "next best"),
                               "change": " ".join(f"{k} {v}" for k, v in t.changes.items()),
                               "meets every goal": "yes" if t.meets else "no"}
        for g in every:
            row[whatif.LABELS[g.metric]] = p.ranges[g.metric].text(g.metric) if g.metric in p.ranges else "—"
        row["trade-off"] = "; ".join(t.tradeoff(every)) or "nothing else moves by 5 % or more"
        rows.append(row)
    if answer.found:
        st.success(f"**Smallest change that meets the budget:** `{rows[0]['change']}`")
    else:
        st.warning("**No modelled change meets every goal.** The closest is below, with what it reaches.")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="goal-answers")


def finding_card(finding: Finding, history: Sequence[Scrape], flags: KnownFlags, key: str,
                 replay_error: dict[str, float | None] | None = None) -> None:
    """One finding: severity, title, evidence (with a small chart), the `vllm serve` change with its
    predicted effect, checks."""
    with st.container(border=True):
        st.markdown(
            f"{BADGES[finding.severity]} **{md_escape(finding.title)}**  \n`{finding.id}`{_when(finding.time_range)}"
        )
        left, right = st.columns([3, 2])
        with left:
            if finding.chart:
                chart(
                    partial(finding_figure, history, finding.chart, finding.time_range),
                    f"{key}-chart",
                    "No data to draw for this finding.",
                )
            if finding.suggestions:
                first, *others = finding.suggestions
                st.markdown(f"**Suggested change** — {md_escape(first.why)}")
                st.code(diff_text(flags, first), language="diff", wrap_lines=True)
                prediction(first, replay_error, f"{key}-prediction")
                if others:
                    st.markdown(
                        "**Or, instead**\n"
                        + "\n".join(
                            f"- `{s.flag}{'' if s.value is None else ' ' + str(s.value).replace('`', '')}` "
                            f"({s.direction}): {md_escape(s.why)}"
                            for s in others
                        )
                    )
        with right:
            rows = [{"evidence": label, "value": value} for label, value in evidence_rows(finding.evidence)]
            st.dataframe(pd.DataFrame(rows), hide_index=True, key=f"{key}-evidence")
            card = card_lines(finding.evidence)
            if "symptom" in finding.evidence:
                st.markdown(f"**Cause** — {md_escape(card.named)}" if card.named else
                            "**Cause not identified** — no flag is suggested.")
            if card.ruled_out:
                st.markdown("**Ruled out**\n" + "\n".join(f"- {md_escape(c.removeprefix('Not '))}"
                                                          for c in card.ruled_out))
            said = {*card.ruled_out, *card.unknown}
            checks = [c for c in finding.checks if c not in said] + list(card.unknown)
            if checks:
                st.markdown("**Check first**\n" + "\n".join(f"- {md_escape(c)}" for c in checks))
            if finding.knobs:
                st.caption("Knob table: " + ", ".join(KNOBS_BY_ID[k].symptom for k in finding.knobs))


def knob_table(findings: Sequence[Finding], key: str) -> None:
    """The knob table, searchable, each row with the findings of this run that rest on it."""
    query = st.text_input("Search the knob table", key=f"{key}-search", placeholder="e.g. preemption, --max-num-seqs")
    rows = []
    for row in KNOB_TABLE:
        used = [f.id for f in findings if row.id in f.knobs]
        rows.append(
            {
                "symptom": row.symptom,
                "check": row.check,
                "flags": " ".join(row.flags),
                "direction": row.direction,
                "findings now": ", ".join(used) or "—",
                "source": row.source,
            }
        )
    table = pd.DataFrame(rows)
    if query.strip():
        mask = table.apply(lambda r: query.lower() in " ".join(r.astype(str)).lower(), axis=1)
        table = table[mask]
    st.dataframe(
        table,
        hide_index=True,
        key=f"{key}-table",
        height=36 * (len(table) + 1) + 4,
        column_config={"check": st.column_config.TextColumn(width="large")},
    )
