"""Serving features that change what an otherwise healthy server does: an engine put to sleep
(sleep mode), and speculative decoding whose drafts are mostly rejected."""

from __future__ import annotations

from diagnostics.core.diagnosis.context import Context, episodes
from diagnostics.core.diagnosis.types import Finding, Suggestion
from diagnostics.core.metrics.derive import spec_decode
from diagnostics.core.text import SLEEP_LEVELS, fmt_duration


def engine_asleep(ctx: Context) -> list[Finding]:
    """An engine put to sleep (``POST /sleep``, ``--enable-sleep-mode``): it serves nothing until
    woken. Critical, with how to wake it; the stall rules stay quiet meanwhile (not a hang)."""
    points = [(s.ts, bool(snap.asleep())) for s, snap in ctx.ok]
    findings = []
    for start, end in episodes(points):
        snaps = [snap for s, snap in ctx.ok if start <= s.ts <= end]
        engines: dict[str, str] = {}
        for snap in snaps:
            engines.update({key[1] or "0": level for key, level in snap.asleep().items()})
        levels = sorted(set(engines.values()))
        ongoing = ctx.ok[-1][0].ts == end
        waiting = max((snap.value("num_requests_waiting") or 0.0) for snap in snaps)
        names = ", ".join(f"engine {e}" for e in sorted(engines))
        findings.append(Finding(
            id="engine_asleep",
            severity="critical",
            title=f"{names.capitalize()} asleep ({'; '.join(SLEEP_LEVELS.get(lv, lv) for lv in levels)})"
            + (f" for at least {fmt_duration(end - start)}, still asleep" if ongoing
               else f" for {fmt_duration(end - start)}, then woken") + ": it serves nothing until woken",
            evidence={"engines": sorted(engines), "sleep_states": levels, "asleep_since_at": start,
                      "seconds_asleep": round(end - start, 3), "ongoing": ongoing,
                      "max_num_requests_waiting": waiting},
            checks=(
                "Wake it with POST /wake_up (the endpoint exists when the server runs with VLLM_SERVER_DEV_MODE=1); "
                "after level 2 the weights must be reloaded before it serves again.",
                "Find out who put it to sleep (an RL trainer sharing the GPU, an autoscaler): it is not a hang, and "
                "restarting it loses whatever that owner expected to resume.",
            ),
            time_range=(start, end),
        ))
    return findings


def speculative_decoding(ctx: Context) -> list[Finding]:
    """Speculation that is mostly rejected: fewer ``num_speculative_tokens`` (the positions that
    are accepted often enough), or none when even the first is mostly rejected and each verify step
    emits under ``spec_min_gain`` tokens — then it costs more than it gains."""
    t = ctx.thresholds
    spec = spec_decode([s for s, _ in ctx.ok])
    if spec is None or spec.draft_tokens < t.spec_min_draft_tokens:
        return []
    rate, length, k = spec.acceptance_rate, spec.mean_accepted_length, spec.num_speculative_tokens
    if rate is None or length is None or k is None or rate >= t.spec_low_acceptance:
        return []
    per_pos = spec.per_position_rate
    keep = next((i for i, r in enumerate(per_pos) if r < t.spec_keep_position), len(per_pos))
    off = keep == 0 and length < t.spec_min_gain
    if off:
        suggestion = Suggestion("--speculative-config", "set", None,
                                f"Drop --speculative-config: each verify step emits {length:.2f} tokens on average "
                                f"while checking {k + 1}, so speculation costs more compute than it saves.")
    else:
        value = max(1, keep)
        why = (f"Draft positions past {value} are accepted under {t.spec_keep_position * 100:.0f} % of the time: "
               "drafting them wastes verify work." if keep else
               f"Even the first draft token is accepted under {t.spec_keep_position * 100:.0f} % of the time, but "
               f"each verify step still emits {length:.2f} tokens: keep one draft token, not {k}.")
        suggestion = Suggestion("--speculative-config", "decrease", f"'{{\"num_speculative_tokens\": {value}, …}}'",
                                why)
    start, end = ctx.ok[0][0].ts, ctx.ok[-1][0].ts
    return [Finding(
        id="spec_low_acceptance",
        severity="warning",
        title=f"Speculative decoding mostly rejected: {rate * 100:.0f} % of draft tokens accepted, "
        f"{length:.2f} tokens per verify step with {k} drafted" + ("; it costs more than it gains" if off else ""),
        evidence={"acceptance_rate_perc": rate, "mean_accepted_length": round(length, 3), "num_speculative_tokens": k,
                  "per_position_acceptance": [f"{i}: {r * 100:.0f} %" for i, r in enumerate(per_pos)],
                  "drafts": spec.drafts, "draft_tokens": spec.draft_tokens},
        suggestions=(suggestion,),
        checks=(
            "Acceptance depends on the traffic: n-gram lookup needs outputs that repeat the prompt (code edits, "
            "extraction); a draft model needs one trained like the target. Compare ITL with speculation off.",
            "Keep the change only if ITL p50 and throughput improve at the same load (the Probe page measures it).",
        ),
        time_range=(start, end),
    )]
