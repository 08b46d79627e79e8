"""The headless CLI: ``python -m diagnostics record|status|diagnose|fleet|probe|alert-rules`` (same core as the app).

Every command that takes ``--url`` also takes ``--prometheus URL [--selector S] [--instance I]
[--since 2h]``: the same views read from the history Prometheus keeps.

Exit codes: 0 ok (``probe``: every request completed; 1 some failed); 2 bad usage or a probe over its caps; 3 target unreachable, timing out or answering errors; 4 not a vLLM
server; 5 unreadable recording, log or output file. ``diagnose`` follows the monitoring-plugin
convention instead (so cron, pipelines and Nagios-style checks can act on it): 0 nothing above info,
1 a warning, 2 a critical finding, 3 unknown (bad usage, target unreachable or not vLLM,
unreadable recording, log or output file).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NoReturn

from diagnostics.collector import Collector
from diagnostics.core import whatif
from diagnostics.core.diagnosis import (
    Budgets,
    Finding,
    KnownFlags,
    Thresholds,
    command_diff,
    diagnose,
    exit_code,
    prepare,
)
from diagnostics.core.diagnosis.alerts import alert_rules_yaml
from diagnostics.core.fleet.promql import Scope, parse_duration, parse_selector
from diagnostics.core.metrics.derive import DerivedState, Scrape, derive_state
from diagnostics.core.metrics.info import ServerInfo
from diagnostics.core.simulator.scenarios import SCENARIOS
from diagnostics.core.text import SLEEP_LEVELS, evidence_rows, fmt_seconds_as_ms, prompt_sources_text, roofline_text
from diagnostics.errors import BadRecording, NotVllm, TargetError
from diagnostics.recording import Recording, RecordingWriter, read_recording
from diagnostics.sources.vllm_http import DEFAULT_API_KEY_ENV, VllmClient, api_key_from_env

EXIT_TARGET = 3
EXIT_NOT_VLLM = 4
EXIT_FILE = 5
EXIT_UNKNOWN = 3  # diagnose: the monitoring-plugin "UNKNOWN"


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage; ``diagnose`` answers 3 (unknown) instead, since its 2 means
    a critical finding."""

    usage_exit = 2

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_exit, f"{self.prog}: error: {message}\n")


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _client(args: argparse.Namespace) -> VllmClient:
    try:
        return VllmClient(args.url, api_key_from_env(args.api_key_env), timeout_seconds=args.timeout or 2.0)
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _when(text: str) -> float:
    """Unix seconds or an ISO 8601 time (``2026-11-30T03:00:00Z``; no zone = UTC)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not Unix seconds or an ISO 8601 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _prometheus(args: argparse.Namespace) -> tuple[Any, Scope]:
    from diagnostics.sources.prometheus import PrometheusClient

    try:
        client = PrometheusClient(args.prometheus, timeout_seconds=args.timeout or 15.0)
        return client, Scope(parse_selector(args.selector))
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


def _prometheus_window(args: argparse.Namespace, since: float) -> tuple[list[Scrape], ServerInfo | None, str, Any]:
    """One instance's history over the last ``since`` seconds, read from Prometheus."""
    from diagnostics import prometheus_fleet as fleet

    client, scope = _prometheus(args)
    try:
        found = fleet.discover(client, scope, args.until)
    except TargetError as exc:
        raise CliError(str(exc), EXIT_TARGET) from None
    names = [d.instance for d in found]
    if args.instance is None:
        if len(found) != 1:
            listed = ", ".join(names) or "none"
            raise CliError(f"--instance is needed: Prometheus has {len(found)} vLLM instances ({listed})", 2)
        instance = found[0]
    else:
        match = next((d for d in found if d.instance == args.instance), None)
        if match is None:
            listed = ", ".join(names) or "none"
            raise CliError(f"no vLLM instance {args.instance!r} in Prometheus (it has: {listed})", EXIT_TARGET)
        instance = match
    target = fleet.PrometheusTarget(client, replace(scope, instance=instance.instance), range_s=since,
                                    model=instance.model, end=args.until)
    history = target.refresh()
    status = target.status()
    if status.error and not history:
        raise CliError(status.error, EXIT_TARGET)
    return history, status.info, target.target, target


def _check_first(client: VllmClient) -> None:
    """Fail fast, with one line, when the target is not there or not vLLM."""
    try:
        client.metrics_text()
    except NotVllm as exc:
        raise CliError(str(exc), EXIT_NOT_VLLM) from None
    except TargetError as exc:
        raise CliError(str(exc), EXIT_TARGET) from None


def _collect(client: VllmClient, seconds: float, interval: float, writer: RecordingWriter | None) -> Collector:
    collector = Collector(client, interval_seconds=interval, retention_seconds=max(seconds, interval) + 60)
    if writer is not None:
        collector.add_sink(writer.write)
    deadline = time.monotonic() + seconds
    while True:
        collector.scrape_once()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval, remaining))
    return collector


def cmd_record(args: argparse.Namespace) -> int:
    if args.prometheus:
        _, _, name, target = _prometheus_window(args, args.since)
        try:
            records = target.recent_records()
        except TargetError as exc:
            raise CliError(str(exc), EXIT_TARGET) from None
        try:
            with RecordingWriter(args.out) as out:
                for record in records:
                    out.write(record)
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc.strerror}", EXIT_FILE) from None
        print(f"recorded {len(records)} scrapes of {name} to {args.out}", file=sys.stderr)
        return 0
    client = _client(args)
    _check_first(client)
    try:
        writer = RecordingWriter(args.out)
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc.strerror}", EXIT_FILE) from None
    with writer:
        collector = _collect(client, args.seconds, args.interval, writer)
    status = collector.status()
    print(
        f"recorded {writer.num_records} scrapes of {client.base_url} to {args.out} ({status.num_failures} failed)",
        file=sys.stderr,
    )
    return 0


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def status_object(
    state: DerivedState, info: ServerInfo | None, *, target: str | None, up: bool, target_state: str, error: str | None
) -> dict[str, Any]:
    """The ``status --json`` object: absent values are null, never 0."""
    config = state.cache_config
    obj: dict[str, Any] = {
        "target": target,
        "state": target_state,
        "up": up,
        "error": error,
        "ts": state.ts,
        "window_seconds": state.window_seconds,
        "version": info.version if info else None,
        "model": info.model if info else None,
        "max_model_len": info.max_model_len if info else None,
        "kv_cache_usage_perc": state.kv_cache_usage_perc,
        "kv_cache_used_blocks": state.kv_cache_used_blocks,
        "kv_cache_used_tokens": state.kv_cache_used_tokens,
        "num_requests_running": state.num_requests_running,
        "num_requests_waiting": state.num_requests_waiting,
        "num_requests_waiting_by_reason": state.num_requests_waiting_by_reason,
        "num_requests_swapped": state.num_requests_swapped,
        "prefix_cache_hit_rate": state.prefix_cache_hit_rate,
        "prefix_cache_queries_rate": state.prefix_cache_queries_rate,
        "prefix_cache_hits_rate": state.prefix_cache_hits_rate,
        "num_preemptions_rate": state.num_preemptions_rate,
        "num_preemptions_in_window": state.num_preemptions_in_window,
        "prompt_tokens_rate": state.prompt_tokens_rate,
        "generation_tokens_rate": state.generation_tokens_rate,
        "request_success_rate": state.request_success_rate,
        "asleep": state.asleep,
        "prompt_tokens_by_source": state.prompt_sources.by_source if state.prompt_sources else None,
        "prompt_tokens_cached_by_tier": state.prompt_sources.cached_by_tier if state.prompt_sources else None,
        "prompt_sources_text": prompt_sources_text(state.prompt_sources),
        "roofline_text": roofline_text(state.roofline, None),
        "spec_decode_acceptance_rate": state.spec_decode.acceptance_rate if state.spec_decode else None,
        "spec_decode_mean_accepted_length": state.spec_decode.mean_accepted_length if state.spec_decode else None,
        "engines": [{"engine": e.engine, "model_name": e.model_name, "kv_cache_usage_perc": e.kv_cache_usage_perc,
                     "num_requests_running": e.num_requests_running, "num_requests_waiting": e.num_requests_waiting,
                     "generation_tokens_rate": e.generation_tokens_rate, "prompt_tokens_rate": e.prompt_tokens_rate}
                    for e in state.engines],
    }
    for concept, short in (
        ("time_to_first_token_seconds", "ttft"),
        ("inter_token_latency_seconds", "itl"),
        ("e2e_request_latency_seconds", "e2e"),
        ("request_queue_time_seconds", "queue"),
    ):
        for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            # A quantile in the first bucket is a bound ("<" its upper edge), not a number.
            est = state.quantile(concept, q)
            value, bound = est.reported() if est is not None else (None, None)
            obj[f"{short}_{name}_seconds"] = _finite(value)
            obj[f"{short}_{name}_bound"] = bound
    for key in (
        "block_size",
        "num_gpu_blocks",
        "gpu_memory_utilization",
        "cache_dtype",
        "enable_prefix_caching",
        "kv_cache_memory_bytes",
        "kv_cache_size_tokens",
        "kv_cache_max_concurrency",
    ):
        obj[key] = getattr(config, key) if config is not None else None
    return obj


def _fmt(value: Any, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value * scale:.{digits}f}{unit}"
    return f"{value}{unit}"


def _lat(obj: dict[str, Any], key: str) -> str:
    value, bound = obj[f"{key}_seconds"], obj[f"{key}_bound"]
    if value is None:
        return "—"
    return (f"{bound} " if bound else "") + fmt_seconds_as_ms(value)


def render_status(obj: dict[str, Any]) -> str:
    """The human-readable status: one fact a line, absent values as a dash."""
    state = obj["state"] + (f" ({obj['error']})" if obj.get("error") else "")
    lines = [
        f"target        {obj['target']}  [{state}]",
        f"vLLM          {_fmt(obj['version'])}   model {_fmt(obj['model'])}   max_model_len {_fmt(obj['max_model_len'])}",
        f"KV cache      {_fmt(obj['kv_cache_usage_perc'], ' %', 100)} used"
        f"   {_fmt(obj['kv_cache_used_blocks'], digits=0)} of {_fmt(obj['num_gpu_blocks'])} blocks"
        f" × {_fmt(obj['block_size'])} tokens",
        f"requests      running {_fmt(obj['num_requests_running'], digits=0)}"
        f"   waiting {_fmt(obj['num_requests_waiting'], digits=0)}",
        f"prefix cache  hit rate {_fmt(obj['prefix_cache_hit_rate'], ' %', 100)} over {obj['window_seconds']:g} s"
        f"   (caching {'on' if obj['enable_prefix_caching'] else 'off' if obj['enable_prefix_caching'] is False else '—'})",
        *([f"prompt from   {obj['prompt_sources_text']}"] if obj.get("prompt_sources_text") else []),
        f"preemptions   {_fmt(obj['num_preemptions_rate'], '/s', digits=2)}",
        *([f"speculation   {_fmt(obj['spec_decode_acceptance_rate'], ' %', 100)} of draft tokens accepted, "
           f"{_fmt(obj['spec_decode_mean_accepted_length'], digits=2)} tokens per verify step"]
          if obj.get("spec_decode_acceptance_rate") is not None else []),
        *([f"roofline      {obj['roofline_text']}"] if obj.get("roofline_text") else []),
        f"throughput    prompt {_fmt(obj['prompt_tokens_rate'], ' tok/s')}"
        f"   generation {_fmt(obj['generation_tokens_rate'], ' tok/s')}",
        f"TTFT          p50 {_lat(obj, 'ttft_p50')}   p95 {_lat(obj, 'ttft_p95')}",
        f"ITL           p50 {_lat(obj, 'itl_p50')}   p95 {_lat(obj, 'itl_p95')}",
        f"Queue time    p50 {_lat(obj, 'queue_p50')}   p95 {_lat(obj, 'queue_p95')}",
    ]
    if obj.get("asleep"):
        lines.append("ASLEEP        " + ", ".join(f"engine {e} ({SLEEP_LEVELS.get(level, level)})"
                                               for e, level in sorted(obj["asleep"].items()))
                     + ": serves nothing until woken (POST /wake_up)")
    for e in obj.get("engines") or ():
        lines.append(
            f"engine {e['engine']:<6} KV {_fmt(e['kv_cache_usage_perc'], ' %', 100)}"
            f"   running {_fmt(e['num_requests_running'], digits=0)}   waiting {_fmt(e['num_requests_waiting'], digits=0)}"
            f"   generation {_fmt(e['generation_tokens_rate'], ' tok/s')}"
        )
    return "\n".join(lines)


def _read_recording(path: str) -> Recording:
    """A recording, with one warning line per skipped line; exit 5 when nothing is usable."""
    try:
        recording = read_recording(path)
    except BadRecording as exc:
        raise CliError(f"{path}: {exc}", EXIT_FILE) from None
    for problem in recording.problems:
        print(f"warning: {path}: {problem}", file=sys.stderr)
    return recording


def cmd_status(args: argparse.Namespace) -> int:
    if args.replay:
        recording = _read_recording(args.replay)
        scrapes = recording.scrapes()
        last = scrapes[-1]
        state = derive_state(scrapes, args.window)
        obj = status_object(
            state,
            recording.info(),
            target=recording.target,
            up=last.snapshot is not None,
            target_state="up" if last.snapshot is not None else "down",
            error=last.error,
        )
    elif args.prometheus:
        history, info, name, target = _prometheus_window(args, args.since or max(args.window, 60.0) * 2)
        status = target.status()
        obj = status_object(
            derive_state(history, args.window),
            info,
            target=name,
            up=status.state == "up",
            target_state=status.state,
            error=status.error,
        )
    else:
        client = _client(args)
        _check_first(client)
        collector = _collect(client, args.seconds, args.interval, None)
        status = collector.status()
        obj = status_object(
            derive_state(collector.history(), args.window),
            status.info,
            target=client.base_url,
            up=status.state == "up",
            target_state=status.state,
            error=status.error,
        )
        if status.info_error:
            print(f"warning: {status.info_error}", file=sys.stderr)
    print(json.dumps(obj, indent=1) if args.json else render_status(obj))
    return 0


def _render_findings(findings: list[Finding], flags: KnownFlags) -> str:
    if not findings:
        return "No findings: nothing unusual in this window."
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
        for c in f.checks:
            out.append(f"         check: {c}")
    return "\n".join(out)


def _window(args: argparse.Namespace) -> tuple[list[Scrape], ServerInfo | None]:
    """The scrapes a diagnosis or a what-if reads: a recording, N seconds of a server, or a range
    from Prometheus (none given: no scrapes)."""
    if args.replay:
        recording = _read_recording(args.replay)
        return recording.scrapes(), recording.info()
    if args.url:
        client = _client(args)
        _check_first(client)
        collector = _collect(client, args.seconds, args.interval, None)
        return collector.history(), collector.status().info
    if args.prometheus:
        history, info, _, _ = _prometheus_window(args, args.since or 900.0)
        return history, info
    return [], None


def _changes(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        flag, sep, value = pair.partition("=")
        if not sep or not flag.strip("-") or not value:
            raise CliError(f"--set {pair!r}: write it as FLAG=VALUE, e.g. --set max-num-seqs=16", 2)
        out["--" + flag.strip("-").replace("_", "-")] = value
    return out


def cmd_whatif(args: argparse.Namespace) -> int:
    changes = _changes(args.set)
    if not (args.replay or args.url or args.prometheus):
        raise CliError("whatif needs a window: --replay FILE, --url URL --seconds N, or --prometheus URL", 2)
    history, info = _window(args)
    ctx = prepare(history, info=info, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    try:
        base = whatif.baseline(history, ctx.flags)
        prediction = base.predict(changes)
    except whatif.NotModelled as exc:
        raise CliError(f"not modelled: {exc}", 2) from None
    except ValueError as exc:
        raise CliError(f"cannot replay this window: {exc}", EXIT_UNKNOWN) from None
    if args.json:
        print(json.dumps(prediction.full_json(), indent=1))
        return 0
    print(_render_whatif(prediction))
    return 0


def _render_whatif(p: whatif.Prediction) -> str:
    w, c = p.workload, p.calibration
    change = " ".join(f"{k} {v}" for k, v in p.changes.items())
    lines = [f"what if: {change}",
             f"workload  {len(w.requests) or len(w.arrivals)} requests in {w.seconds:.0f} s "
             + (f"(a closed loop of {w.closed_loop_clients} clients)" if w.closed_loop_clients else
                f"({(len(w.requests) or len(w.arrivals)) / max(w.seconds, 1e-9):.2f}/s, open arrivals)")
             + f"; prompt {w.prompt.mean:.0f} tokens, output {w.output.mean:.0f} tokens (means), n {w.n:.1f}, "
               f"prefix hits {w.prefix_hit_fraction * 100:.0f} %",
             f"engine    step = {c.cost.base * 1000:.2f} ms + {c.cost.per_seq * 1000:.2f} ms/sequence + "
             f"{c.cost.per_prefill_token * 1e6:.1f} µs/prefill token (fit error {_pct(c.fit_error)} over "
             f"{c.points} intervals{'' if c.batch_identified else '; the batch never varied, so its cost is assumed flat'}); "
             f"{c.num_gpu_blocks:,} KV blocks of {c.block_size}",
             f"{'metric':18} {'recorded':>10} {'replayed':>10} {'predicted':>10}  replay error"]
    for name in whatif.METRICS:
        m = p.metric(name)
        lines.append(f"{whatif.LABELS[name]:18} {_metric(name, m['recorded']):>10} {_metric(name, m['before']):>10} "
                     f"{_metric(name, m['after']):>10}  {_pct(p.baseline_error.get(name))}")
    lines.append("predicted: " + whatif.summary(p))
    if p.after.requests_rejected:
        lines.append(f"{p.after.requests_rejected} requests would be rejected (longer than --max-model-len)")
    return "\n".join(lines)


def _metric(name: str, value: float | None) -> str:
    if value is None:
        return "—"
    return whatif.fmt_value(name, value)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f} %"


def cmd_diagnose(args: argparse.Namespace) -> int:
    log_text = None
    if args.log:
        try:
            log_text = open(args.log, encoding="utf-8", errors="replace").read()
        except OSError as exc:
            raise CliError(f"cannot read {args.log}: {exc.strerror}", EXIT_FILE) from None
    budgets = Budgets(ttft_ms=args.ttft_budget_ms, itl_ms=args.itl_budget_ms)
    history, info = _window(args)
    ctx = prepare(history, info=info, budgets=budgets, log_text=log_text, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens)
    findings = diagnose(ctx)
    if args.predict and history:
        predicted, _, _ = whatif.with_predictions(findings, history, ctx.flags)
        findings = list(predicted)
    if args.json:
        print(json.dumps({"findings": [f.to_json() for f in findings]}, indent=1, default=str))
    else:
        print(_render_findings(findings, ctx.flags))
    return exit_code(findings)


def cmd_fleet(args: argparse.Namespace) -> int:
    from diagnostics import prometheus_fleet as fleet

    client, scope = _prometheus(args)
    budgets = Budgets(ttft_ms=args.ttft_budget_ms, itl_ms=args.itl_budget_ms)
    try:
        report = fleet.fleet_report(client, scope, range_s=args.since, end=args.until, budgets=budgets)
    except TargetError as exc:
        raise CliError(str(exc), EXIT_TARGET) from None
    if args.json:
        print(json.dumps({
            "prometheus": client.url,
            "window_seconds": report.window.seconds,
            "instances": [row.to_json() for row in report.rows],
            "fleet_findings": [f.to_json() for f in report.findings],
            "outliers": [{"instance": o.instance, "key": o.key, "why": o.why} for o in report.outliers],
            "queries": report.num_queries,
        }, indent=1))
        return 0
    if not report.rows:
        print(f"no vLLM instances in Prometheus at {client.url} for {{{scope.selector}}}")
        return 0
    print(render_fleet(report))
    return 0


def render_fleet(report: Any) -> str:
    lines = [f"{'instance':24} {'model':20} {'up':4} {'KV':>6} {'run':>5} {'wait':>5} {'preempt/s':>9} "
             f"{'ITL p95':>9}  worst finding"]
    for row in report.rows:
        v = row.values
        worst = row.worst
        lines.append(
            f"{row.instance[:24]:24} {(row.model or '—')[:20]:20} {_fmt({True: 'up', False: 'DOWN'}.get(row.up)):4} "
            f"{_fmt(v.get('kv_cache_usage_perc'), '%', 100, 0):>6} {_fmt(v.get('num_requests_running'), digits=0):>5} "
            f"{_fmt(v.get('num_requests_waiting'), digits=0):>5} {_fmt(v.get('preemptions_per_s'), digits=2):>9} "
            f"{_fmt_s(v.get('itl_p95_s')):>9}  {worst.severity.upper() + ' ' + worst.title if worst else '—'}"
        )
    for f in report.findings:
        lines.append(f"{f.severity.upper():8} {f.text}")
    return "\n".join(lines)


def _fmt_s(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else fmt_seconds_as_ms(value)


def cmd_probe(args: argparse.Namespace) -> int:
    from diagnostics.core.probe import SETTLE_SECONDS, ProbeSpec, with_server
    from diagnostics.sources.probe_http import Probe, ProbeRefused

    spec = ProbeSpec(
        concurrency=args.concurrency, requests=args.requests, seconds=args.seconds,
        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, ignore_eos=not args.no_ignore_eos,
        shared_prefix_tokens=args.shared_prefix_tokens, n=args.n, model=args.model, seed=args.seed,
    )
    if spec.problems():
        raise CliError("refused: " + "; ".join(spec.problems()), 2)
    client = _client(args)
    what = spec.describe(client.base_url)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"this adds load — {what}. Add --yes to confirm.", 2)
        answer = input(f"Send {what}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not sent", file=sys.stderr)
            return 0
    _check_first(client)
    collector = Collector(client, interval_seconds=0.5, retention_seconds=MAX_PROBE_RETENTION).start()
    try:
        time.sleep(0.6)  # a scrape before the first request: the server side starts from it
        try:
            probe = Probe(client.base_url, spec, api_key_from_env(args.api_key_env)).start()
        except ProbeRefused as exc:
            raise CliError(f"refused: {exc}", 2) from None
        print(f"probing: {what}", file=sys.stderr)
        try:
            while not probe.done:
                probe.wait(1.0)
                if not args.json and not probe.done:
                    sent, finished, failed = probe.progress()
                    print(f"  {finished} finished, {failed} failed, {sent - finished} in flight", file=sys.stderr)
        except KeyboardInterrupt:
            probe.cancel()
            probe.wait(30)
        # And a scrape sent after the last answer (stamped SETTLE_SECONDS later), up to 5 s.
        wait_until = time.monotonic() + 5
        while time.monotonic() < wait_until and not any(
            s.ts >= (probe.ended or 0) + SETTLE_SECONDS and s.snapshot is not None for s in collector.history()[-4:]
        ):
            time.sleep(0.1)
    finally:
        collector.stop()
    if probe.failure and not probe.summary().results:
        raise CliError(probe.failure, EXIT_TARGET)
    summary = with_server(probe.summary(), collector.history())
    obj = summary.to_json()
    obj["failure"] = probe.failure
    if args.json:
        print(json.dumps(obj, indent=1))
    else:
        print(render_probe(obj))
    return 1 if obj["errors"] else 0


MAX_PROBE_RETENTION = 900.0  # the longest probe (600 s) and its last requests' timeout, with the scrape before


def render_probe(obj: dict[str, Any]) -> str:
    from diagnostics.core.probe import disagreements

    def q(key: str) -> str:
        v = obj[key]
        return "   ".join(f"{p} {_fmt_s(v[p])}" for p in ("p50", "p95", "p99"))

    errors = ", ".join(f"{k} {n}" for k, n in obj["errors_by_kind"].items()) or "none"
    lines = [
        f"target        {obj['target']}{'  (cancelled)' if obj['cancelled'] else ''}",
        f"requests      {obj['completed']} of {obj['requests']} completed in {obj['duration_seconds']:.1f} s"
        f"   errors: {errors}",
        f"throughput    {obj['output_tokens_per_second']:.1f} output tok/s   {obj['requests_per_second']:.2f} req/s",
        f"TTFT          {q('ttft_seconds')}",
        f"ITL           {q('itl_seconds')}",
        f"e2e           {q('e2e_seconds')}",
    ]
    server = obj.get("server", {})
    if "requests_finished" in server:
        lines.append(f"server        {_fmt(server['requests_finished'], digits=0)} requests finished, "
                     f"{_fmt(server['generation_tokens'], digits=0)} tokens generated over the same window")
    for kind, detail in obj.get("error_details", {}).items():
        lines.append(f"first {kind:8} {detail}")
    if obj.get("failure"):
        lines.append(f"stopped       {obj['failure']}")
    for d in disagreements(obj):
        lines.append(f"note          {d.text}")
    return "\n".join(lines)


def cmd_alert_rules(args: argparse.Namespace) -> int:
    text = alert_rules_yaml(
        Thresholds(), job=args.job, itl_budget_ms=args.itl_budget_ms, ttft_budget_ms=args.ttft_budget_ms
    )
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc.strerror}", EXIT_FILE) from None
    else:
        sys.stdout.write(text)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from diagnostics.sim.server import SimServer

    try:
        server = SimServer(args.scenario, port=args.port, host=args.host, speed=args.speed).start()
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", 2) from None
    print(f"simulated vLLM ({args.scenario}) at {server.url} — not a real server; Ctrl-C stops it", file=sys.stderr,
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> _Parser:
    parser = _Parser(prog="python -m diagnostics", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def budget_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--itl-budget-ms", type=_positive, help="inter-token latency budget (p95), ms")
        p.add_argument("--ttft-budget-ms", type=_positive, help="time-to-first-token budget (p95), ms")

    def prometheus_args(p: argparse.ArgumentParser, since: str | None) -> None:
        p.add_argument("--prometheus", metavar="URL", help="read from this Prometheus (or Thanos, Mimir…) instead")
        p.add_argument("--selector", default="", help='series selector for the vLLM targets, e.g. \'{job="vllm"}\'')
        p.add_argument("--instance", help="with --prometheus: the instance label of the server (needed in a fleet)")
        p.add_argument("--since", type=_duration, default=since, metavar="DURATION",
                       help="with --prometheus: how far back, e.g. 15m, 2h, 7d" + (f" (default {since})" if since else ""))
        p.add_argument("--until", type=_when, metavar="TIME",
                       help="with --prometheus: the window ends here (Unix seconds or ISO 8601; default now)")

    def target_args(p: argparse.ArgumentParser, required: bool) -> None:
        p.add_argument("--url", help="base URL of the vLLM server, e.g. http://127.0.0.1:8000")
        prometheus_args(p, None)
        p.add_argument(
            "--api-key-env",
            default=DEFAULT_API_KEY_ENV,
            metavar="VAR",
            help=f"environment variable holding the API key (default {DEFAULT_API_KEY_ENV})",
        )
        p.add_argument("--interval", type=_positive, default=1.0, help="seconds between scrapes (min 0.25)")
        p.add_argument("--timeout", type=_positive, help="seconds a whole request may take (default 2; 15 for Prometheus)")

    record = sub.add_parser("record", help="scrape a server for N seconds into a recording (.jsonl or .jsonl.gz)")
    target_args(record, required=True)
    record.add_argument("--seconds", type=_positive, help="with --url: how long to record")
    record.add_argument("--out", required=True, help="output file; .gz compresses")
    record.set_defaults(func=cmd_record)

    status = sub.add_parser("status", help="the current derived state of a server or a recording")
    target_args(status, required=False)
    status.add_argument("--replay", help="a recording: the state at its end")
    status.add_argument("--seconds", type=_positive, default=2.0, help="with --url: seconds to collect first")
    status.add_argument("--window", type=_positive, default=60.0, help="window for rates and quantiles, seconds")
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.set_defaults(func=cmd_status)
    diag = sub.add_parser("diagnose", help="findings and flag changes for a server, a recording or a startup log")
    if isinstance(diag, _Parser):  # always: the subparsers take the parent's class
        diag.usage_exit = EXIT_UNKNOWN
    target_args(diag, required=False)
    diag.add_argument("--replay", help="a recording: the whole recording is the window")
    diag.add_argument("--seconds", type=_positive, default=30.0, help="with --url: seconds to collect (the window)")
    diag.add_argument("--log", help="the server's startup log (alone: diagnose a failed start)")
    budget_args(diag)
    diag.add_argument("--max-num-seqs", type=int, help="the server's --max-num-seqs, when known")
    diag.add_argument("--max-num-batched-tokens", type=int, help="the server's --max-num-batched-tokens, when known")
    diag.add_argument("--json", action="store_true", help='{"findings": [...]}')
    diag.add_argument("--no-predict", dest="predict", action="store_false",
                      help="skip the predicted effect of each suggested change (the simulated engine's replay)")
    diag.set_defaults(func=cmd_diagnose)

    what = sub.add_parser("whatif", help="the predicted effect of a flag change: the window replayed on the simulated "
                          "engine under the current flags and under the change")
    target_args(what, required=False)
    what.add_argument("--replay", help="a recording: the whole recording is the window")
    what.add_argument("--seconds", type=_positive, default=30.0, help="with --url: seconds to collect (the window)")
    what.add_argument("--set", action="append", default=[], metavar="FLAG=VALUE", required=True,
                      help=f"a change to predict, e.g. --set max-num-seqs=16 (repeatable); modelled: "
                      f"{', '.join(sorted(whatif.MODELLED))}")
    what.add_argument("--max-num-seqs", type=int, help="the server's --max-num-seqs, when known")
    what.add_argument("--max-num-batched-tokens", type=int, help="the server's --max-num-batched-tokens, when known")
    what.add_argument("--json", action="store_true", help="the prediction, the inferred workload and the calibration")
    what.set_defaults(func=cmd_whatif)

    simulate = sub.add_parser("simulate", help="run the simulated vLLM engine's HTTP surface on loopback")
    simulate.add_argument("--scenario", default="healthy", help=", ".join(SCENARIOS))
    simulate.add_argument("--port", type=int, default=8000)
    simulate.add_argument("--host", default="127.0.0.1")
    simulate.add_argument("--speed", type=_positive, default=1.0, help="simulated seconds per wall second")
    simulate.set_defaults(func=cmd_simulate)

    serve = sub.add_parser("serve", help="the dashboard, collecting configured targets from start (a flight recorder)")
    serve.add_argument("streamlit_args", nargs="*", help="passed to `streamlit run` (e.g. --server.port 8600)")

    fleet = sub.add_parser("fleet", help="every vLLM instance behind a Prometheus: state, outliers, worst finding")
    fleet.add_argument("--prometheus", metavar="URL", required=True, help="the Prometheus HTTP API base URL")
    fleet.add_argument("--selector", default="", help='series selector for the vLLM targets, e.g. \'{job="vllm"}\'')
    fleet.add_argument("--since", type=_duration, default=_duration("15m"), metavar="DURATION",
                       help="the window for rates, quantiles and the diagnosis (default 15m)")
    fleet.add_argument("--until", type=_when, metavar="TIME",
                       help="the window ends here (Unix seconds or ISO 8601; default now)")
    fleet.add_argument("--timeout", type=_positive, help="seconds a whole query may take (default 15)")
    budget_args(fleet)
    fleet.add_argument("--json", action="store_true", help="one object per instance: instance, model, up, …")
    fleet.set_defaults(func=cmd_fleet)

    probe = sub.add_parser("probe", help="verify under load: a bounded burst of streaming requests, timed by the client")
    probe.add_argument("--url", required=True, help="base URL of the vLLM server")
    probe.add_argument("--api-key-env", default=DEFAULT_API_KEY_ENV, metavar="VAR",
                       help=f"environment variable holding the API key (default {DEFAULT_API_KEY_ENV})")
    probe.add_argument("--timeout", type=_positive, help="seconds the first /metrics check may take (default 2)")
    probe.add_argument("--interval", type=_positive, default=0.5, help=argparse.SUPPRESS)
    probe.add_argument("--concurrency", type=int, required=True, help="clients sending at once")
    amount = probe.add_mutually_exclusive_group(required=True)
    amount.add_argument("--requests", type=int, help="how many requests in all")
    amount.add_argument("--seconds", type=_positive, help="send for this long (requests in flight then finish)")
    probe.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (default 128)")
    probe.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    probe.add_argument("--shared-prefix-tokens", type=int, default=0, help="tokens every prompt starts with")
    probe.add_argument("--n", type=int, default=1, help="samples per request")
    probe.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (default: exactly "
                       "--max-tokens each)")
    probe.add_argument("--model", help="the served model name (default: the server's first)")
    probe.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    probe.add_argument("--yes", action="store_true", help="confirm the load without asking")
    probe.add_argument("--json", action="store_true", help="one JSON object")
    probe.set_defaults(func=cmd_probe)

    alerts = sub.add_parser("alert-rules", help="a Prometheus rule file with the same thresholds")
    alerts.add_argument("--out", help="write to this file (default: stdout)")
    alerts.add_argument("--job", default="vllm", help="the Prometheus job that scrapes vLLM (for the down alert)")
    alerts.add_argument("--itl-budget-ms", type=_positive, help="add an ITL p95 budget alert")
    alerts.add_argument("--ttft-budget-ms", type=_positive, help="add a TTFT p95 budget alert")
    alerts.set_defaults(func=cmd_alert_rules)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve"] and not {"-h", "--help"} & set(words[1:2]):
        # Everything after `serve` belongs to `streamlit run` (argparse cannot pass on --options).
        from diagnostics.ui.serve import serve

        return serve(words[1:])
    diagnosing = bool(words) and words[0] == "diagnose"
    if diagnosing:  # unrecognized arguments are reported by the top-level parser
        parser.usage_exit = EXIT_UNKNOWN
    args = parser.parse_args(words)
    sources = [bool(getattr(args, k, None)) for k in ("url", "replay", "prometheus")]
    if args.command == "status" and sum(sources) != 1:
        parser.error("status needs exactly one of --url, --prometheus or --replay")
    if args.command == "record" and sum(sources) != 1:
        parser.error("record needs exactly one of --url or --prometheus")
    if args.command == "diagnose" and sum(sources) > 1:
        parser.error("diagnose takes one of --url, --prometheus or --replay")
    if args.command == "diagnose" and not (any(sources) or args.log):
        parser.error("diagnose needs --url, --prometheus, --replay or --log")
    if args.command in ("record", "status", "diagnose") and not args.prometheus:
        for flag in ("selector", "instance", "since", "until"):
            if getattr(args, flag, None):
                parser.error(f"--{flag} goes with --prometheus")
    if args.command == "record" and args.prometheus and not args.since:
        args.since = 3600.0
    if args.command == "record" and args.url and not args.seconds:
        parser.error("record --url needs --seconds")
    if getattr(args, "interval", 1.0) < 0.25:
        parser.error("--interval must be at least 0.25 s")
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN if diagnosing else exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception:
        if not diagnosing:
            raise
        # A bug must not read as a finding: for a monitoring check it is UNKNOWN, with the traceback.
        import traceback

        traceback.print_exc()
        return EXIT_UNKNOWN


if __name__ == "__main__":
    sys.exit(main())
