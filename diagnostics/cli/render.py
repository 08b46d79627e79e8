"""The text a person reads: one renderer per command's result, absent values as a dash."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from diagnostics.core import whatif
from diagnostics.core.diagnosis import Finding, KnownFlags, command_diff
from diagnostics.core.diagnosis.causes import card_lines
from diagnostics.core.diagnosis.outcomes import Outcomes, Share
from diagnostics.core.fleet.table import FleetFinding, FleetRow
from diagnostics.core.metrics.status import StatusReport
from diagnostics.core.probe import Percentiles, ProbeSummary, disagreements
from diagnostics.core.text import (
    SLEEP_LEVELS,
    evidence_rows,
    fmt_seconds_as_ms,
    fmt_share_cell,
    gpu_rows,
    outcome_shares_text,
    prompt_sources_text,
    roofline_text,
)
from diagnostics.core.whatif.goals import GoalAnswer, Trial


def _fmt(value: Any, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value * scale:.{digits}f}{unit}"
    return f"{value}{unit}"


def _fmt_s(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else fmt_seconds_as_ms(value)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f} %"


def _lat(report: StatusReport, concept: str, q: float) -> str:
    value, bound = report.latency(concept, q)
    if value is None:
        return "—"
    return (f"{bound} " if bound else "") + fmt_seconds_as_ms(value)


def render_status(report: StatusReport) -> str:
    """The human-readable status: one fact a line."""
    d, info, config = report.derived, report.info, report.derived.cache_config
    caching = config.enable_prefix_caching if config is not None else None
    state = report.state + (f" ({report.error})" if report.error else "")
    ttft, itl, queue = "time_to_first_token_seconds", "inter_token_latency_seconds", "request_queue_time_seconds"
    spec = d.spec_decode
    prompt_sources, roofline = prompt_sources_text(d.prompt_sources), roofline_text(d.roofline, None)
    lines = [
        f"target        {report.target}  [{state}]",
        f"vLLM          {_fmt(info.version if info else None)}   model {_fmt(info.model if info else None)}"
        f"   max_model_len {_fmt(info.max_model_len if info else None)}",
        f"KV cache      {_fmt(d.kv_cache_usage_perc, ' %', 100)} used"
        f"   {_fmt(d.kv_cache_used_blocks, digits=0)} of {_fmt(config.num_gpu_blocks if config else None)} blocks"
        f" × {_fmt(config.block_size if config else None)} tokens",
        f"requests      running {_fmt(d.num_requests_running, digits=0)}"
        f"   waiting {_fmt(d.num_requests_waiting, digits=0)}",
        f"prefix cache  hit rate {_fmt(d.prefix_cache_hit_rate, ' %', 100)} over {d.window_seconds:g} s"
        f"   (caching {'on' if caching else 'off' if caching is False else '—'})",
        *([f"prompt from   {prompt_sources}"] if prompt_sources else []),
        f"preemptions   {_fmt(d.num_preemptions_rate, '/s', digits=2)}",
        *([f"speculation   {_fmt(spec.acceptance_rate, ' %', 100)} of draft tokens accepted, "
           f"{_fmt(spec.mean_accepted_length, digits=2)} tokens per verify step"]
          if spec is not None and spec.acceptance_rate is not None else []),
        *([f"roofline      {roofline}"] if roofline else []),
        f"throughput    prompt {_fmt(d.prompt_tokens_rate, ' tok/s')}"
        f"   generation {_fmt(d.generation_tokens_rate, ' tok/s')}",
        f"TTFT          p50 {_lat(report, ttft, 0.5)}   p95 {_lat(report, ttft, 0.95)}",
        f"ITL           p50 {_lat(report, itl, 0.5)}   p95 {_lat(report, itl, 0.95)}",
        f"Queue time    p50 {_lat(report, queue, 0.5)}   p95 {_lat(report, queue, 0.95)}",
        *([f"SLO           {report.slo.text()}"] if report.slo is not None else []),
        *([f"outcomes      {outcome_shares_text(report.outcomes)}"] if report.outcomes is not None else []),
        *_gpu_lines(report),
    ]
    if d.asleep:
        lines.append("ASLEEP        " + ", ".join(f"engine {e} ({SLEEP_LEVELS.get(level, level)})"
                                               for e, level in sorted(d.asleep.items()))
                     + ": serves nothing until woken (POST /wake_up)")
    for e in d.engines:
        lines.append(
            f"engine {e.engine:<6} KV {_fmt(e.kv_cache_usage_perc, ' %', 100)}"
            f"   running {_fmt(e.num_requests_running, digits=0)}   waiting {_fmt(e.num_requests_waiting, digits=0)}"
            f"   generation {_fmt(e.generation_tokens_rate, ' tok/s')}"
        )
    return "\n".join(lines)


def _gpu_lines(report: StatusReport) -> list[str]:
    """Each device's health now (two lines), or why there is no reading; nothing without a GPU source."""
    reading = report.gpus
    if reading is None:
        return []
    source = f" (from {reading.source})" if reading.source else ""
    if not reading.devices:
        return [f"GPU           not available{source}: {reading.unavailable or 'no device in the reading'}"]
    lines = []
    for row in gpu_rows(reading):
        lines.append(f"GPU           {row.device}{source}")
        lines.append(f"              utilisation {row.utilization} (memory busy {row.memory_busy})"
                     f"   temperature {row.temperature}   power {row.power}")
        lines.append(f"              SM clock {row.sm_clock}   memory clock {row.memory_clock}"
                     f"   clock-event reasons: {row.clock_events}"
                     + (f"   THROTTLED ({row.throttled_by}): no vLLM flag fixes this" if row.throttled_by else ""))
    return lines


def render_outcomes(o: Outcomes) -> str:
    """What became of the window's requests, in one line: the evidence behind a quiet verdict."""
    return f"outcomes      {o.says()}"


def render_findings(findings: list[Finding], flags: KnownFlags, outcomes: Outcomes | None = None) -> str:
    """Each finding: severity, title and when; its changes as a `vllm serve` diff; evidence; checks.
    With nothing above info, ``outcomes`` (when given) says what the quiet verdict looked at."""
    quiet = outcomes is not None and all(f.severity == "info" for f in findings)
    if not findings:
        return "No findings: nothing unusual in this window." + (f"\n{render_outcomes(outcomes)}" if quiet and
                                                                 outcomes is not None else "")
    out = []
    for f in findings:
        when = ""
        if f.time_range:
            a, b = (time.strftime("%H:%M:%S", time.localtime(x)) for x in f.time_range)
            when = f"  [{a}–{b}]" if a != b else f"  [{a}]"
        out.append(f"{f.severity.upper():8} {f.title}{when}")
        for i, s in enumerate(f.suggestions):
            value = "" if s.value is None else f" {s.value}"
            lead = "change" if i == 0 else "or"
            out.append(f"         {lead:6} {s.flag}{value} ({s.direction}): {s.why}")
            if i == 0:
                diff = command_diff(flags, [s])
                out.append(f"           - {diff.before}")
                out.append(f"           + {diff.after}")
            if s.prediction_note:
                out.append(f"           predicted: {s.prediction_note}")
        out.append("         evidence: " + "; ".join(f"{label} {value}" for label, value in evidence_rows(f.evidence)))
        if "symptom" in f.evidence:
            named = card_lines(f.evidence).named
            out.append(f"         cause: {named}" if named else "         cause: not identified (no flag is suggested)")
        for c in f.checks:
            out.append(f"         check: {c}")
    if quiet and outcomes is not None:
        out.append(render_outcomes(outcomes))
    return "\n".join(out)


def _metric(name: str, value: float | None) -> str:
    if value is None:
        return "—"
    return whatif.fmt_value(name, value)


def render_whatif(p: whatif.Prediction) -> str:
    """The change, the workload and engine it was replayed on, and each metric recorded, replayed
    under the current flags and predicted under the change."""
    w, c = p.workload, p.calibration
    change = " ".join(f"{k} {v}" for k, v in p.changes.items())
    lines = [f"what if: {change}",
             f"workload  {len(w.requests) or len(w.arrivals)} requests in {w.seconds:.0f} s "
             + (f"(a closed loop of {w.closed_loop_clients} clients)" if w.closed_loop_clients else
                f"({(len(w.requests) or len(w.arrivals)) / max(w.seconds, 1e-9):.2f}/s, open arrivals{_bursts(w)})")
             + f"; prompt {w.prompt.mean:.0f} tokens, output {w.output.mean:.0f} tokens (means), n {w.n:.1f}, "
               f"prefix hits {w.prefix_hit_fraction * 100:.0f} %",
             f"engine    step = {c.cost.base * 1000:.2f} ms + {c.cost.per_seq * 1000:.2f} ms/sequence + "
             f"{c.cost.per_prefill_token * 1e6:.1f} µs/prefill token (fit error {_pct(c.fit_error)} over "
             f"{c.points} intervals{_seq_share_note(c)}); "
             f"{c.num_gpu_blocks:,} KV blocks of {c.block_size}",
             *_api_server_line(p),
             ("baseline  reproduces the window: " if p.reproduces else "baseline  DOES NOT reproduce the window "
              "(no after-value): ") + "; ".join(whatif.check_text(c) for c in p.checks),
             f"{'metric':18} {'recorded':>10} {'replayed':>10} {'predicted (range)':>26}  replay error"]
    for name in whatif.METRICS:
        m = p.metric(name)
        shown = p.ranges.get(name) if p.reproduces else None
        after = shown.text(name) if shown is not None else _metric(name, m["after"])
        lines.append(f"{whatif.LABELS[name]:18} {_metric(name, m['recorded']):>10} {_metric(name, m['before']):>10} "
                     f"{after:>26}  {_pct(p.baseline_error.get(name))}")
    lines.append("predicted: " + whatif.summary(p))
    if p.after.requests_rejected:
        lines.append(f"{p.after.requests_rejected} requests would be rejected (longer than --max-model-len)")
    return "\n".join(lines)


def render_goals(a: GoalAnswer) -> str:
    """The smallest change that meets every goal, its trade-off and the next best two; or why none."""
    every = [*a.goals, *a.keep]
    span = (f"the whole {a.window_seconds:.0f} s window" if a.searched_span[1] - a.searched_span[0] >= a.window_seconds - 1
            else f"its worst {a.searched_span[1] - a.searched_span[0]:.0f} s ({a.searched_span[0]:.0f}–"
                 f"{a.searched_span[1]:.0f} s of {a.window_seconds:.0f} s)")
    lines = ["goals     " + ", ".join(g.text() for g in every),
             f"searched  {a.trials} changes on {span} in {a.seconds:.1f} s"
             + (" (the time budget ran out before every candidate was tried)" if a.cut_short else ""),
             "now       " + ", ".join(f"{whatif.LABELS[g.metric]} {_metric(g.metric, a.before.get(g.metric))}"
                                      for g in every) + " (replayed under the current flags)"]
    if not a.reproduces:
        lines.append("answer    none: " + whatif.not_reproduced(a.checks) + ", so no change can be judged against it")
        return "\n".join(lines)
    if a.already_met:
        lines.append("answer    the current flags already meet every goal on this window")
        return "\n".join(lines)

    def one(t: Trial) -> list[str]:
        p = t.prediction
        got = "; ".join(f"{whatif.LABELS[g.metric]} {p.ranges[g.metric].text(g.metric) if g.metric in p.ranges else '—'}"
                        + ("" if g.met(p.after.metrics.get(g.metric)) else " (misses)") for g in every)
        change = " ".join(f"{k} {v}" for k, v in t.changes.items())
        out = [f"  {change}: {got}"]
        costs = t.tradeoff(every)
        out.append("    trade-off: " + ("; ".join(costs) if costs else "nothing else moves by 5 % or more"))
        return out

    if a.found:
        lines.append("answer    the smallest change that meets every goal:")
        lines += one(a.found[0])
    else:
        lines.append("answer    no modelled change meets every goal; the closest:")
        if a.closest is not None:
            lines += one(a.closest)
    nxt = [*a.found[1:], *a.near]
    if nxt:
        lines.append("next best")
        for t in nxt:
            lines += one(t)
    return "\n".join(lines)


def render_fleet(rows: Sequence[FleetRow], findings: Sequence[FleetFinding]) -> str:
    """One line per instance (the worst finding last), then the fleet's own findings."""
    lines = [f"{'instance':24} {'model':20} {'up':8} {'KV':>6} {'run':>5} {'wait':>5} {'preempt/s':>9} "
             f"{'ITL p95':>9} {'goodput':>9} {'failed':>12} {'4xx':>12} {'gave up':>12}  worst finding"]
    for row in rows:
        v, o = row.values, row.outcomes
        lines.append(
            f"{row.instance[:24]:24} {(row.model or '—')[:20]:20} {row.state_text:8} "
            f"{_fmt(v.get('kv_cache_usage_perc'), '%', 100, 0):>6} {_fmt(v.get('num_requests_running'), digits=0):>5} "
            f"{_fmt(v.get('num_requests_waiting'), digits=0):>5} {_fmt(v.get('preemptions_per_s'), digits=2):>9} "
            f"{_fmt_s(v.get('itl_p95_s')):>9} {row.goodput_text:>9} {_cell(o.failed_share if o else None):>12} "
            f"{_cell(o.rejected_share if o else None):>12} {_cell(o.gave_up_share if o else None):>12}  "
            f"{row.worst_text}"
        )
    for f in findings:
        lines.append(f"{f.severity.upper():8} {f.text}")
    return "\n".join(lines)


def _cell(share: Share | None) -> str:
    return "—" if share is None else fmt_share_cell(share)


def render_probe(summary: ProbeSummary) -> str:
    """What the clients measured, what the server counted over the same window, where they disagree."""

    def q(pcts: Percentiles[float]) -> str:
        return "   ".join(f"{p} {_fmt_s(v)}" for p, v in pcts.items())

    (_, ttft, _), (_, itl, _), (_, e2e, _) = summary.latencies()
    errors = ", ".join(f"{k} {n}" for k, n in summary.errors_by_kind().items()) or "none"
    lines = [
        f"target        {summary.target}{'  (cancelled)' if summary.cancelled else ''}",
        f"requests      {len(summary.ok)} of {len(summary.results)} completed in {summary.duration:.1f} s"
        f"   errors: {errors}",
        f"throughput    {summary.output_tokens_per_second:.1f} output tok/s   {summary.requests_per_second:.2f} req/s",
        f"TTFT          {q(ttft)}",
        f"ITL           {q(itl)}",
        f"e2e           {q(e2e)}",
    ]
    server = summary.server
    if server is not None:
        lines.append(f"server        {_fmt(server.requests_finished, digits=0)} requests finished, "
                     f"{_fmt(server.generation_tokens, digits=0)} tokens generated over the same window")
    for kind, detail in summary.error_details().items():
        lines.append(f"first {kind:8} {detail}")
    if summary.failure:
        lines.append(f"stopped       {summary.failure}")
    for d in disagreements(summary):
        lines.append(f"note          {d.text}")
    return "\n".join(lines)


def _bursts(w: whatif.InferredWorkload) -> str:
    """The intervals whose arrivals the replay sends at once."""
    if not w.bursts:
        return ""
    if len(w.bursts) == 1:
        at, n = w.bursts[0]
        return f"; {n} of them at once, {at:.1f} s in"
    return f"; {len(w.bursts)} bursts sent at once ({', '.join(str(n) for _, n in w.bursts)} requests)"


def _api_server_line(p: whatif.Prediction) -> list[str]:
    """The API server's share of TTFT the replay adds, and what the range does with it."""
    text = whatif.api_server_text(p)
    return [f"frontend  {text}"] if text else []


def _seq_share_note(c: whatif.Calibration) -> str:
    """What the window could not tell about a sequence's cost, and what the replay does about it."""
    if not c.seq_cost_unknown:
        return ""
    why = "the batch never varied" if not c.batch_identified else "the fit found no cost per sequence"
    return (f"; {why}, so a step is taken as flat in the batch, and a change running more sequences than the "
            "window did is also replayed with a step proportional to the batch, for its range")
