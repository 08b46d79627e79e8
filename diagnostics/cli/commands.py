"""One function per command: read its window, run the core, print the result; the exit code is
what it returns (a failure raises :class:`CliError`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from diagnostics.cli import window
from diagnostics.cli.exits import EXIT_FILE, EXIT_TARGET, EXIT_UNKNOWN, EXIT_USAGE, CliError
from diagnostics.cli.render import (
    render_findings,
    render_fleet,
    render_goals,
    render_probe,
    render_status,
    render_whatif,
)
from diagnostics.collector import Collector
from diagnostics.core import whatif
from diagnostics.core.diagnosis import Budgets, Thresholds, diagnose, exit_code, prepare
from diagnostics.core.diagnosis.alerts import alert_rules_yaml
from diagnostics.core.diagnosis.outcomes import outcomes, window_outcomes
from diagnostics.core.metrics.derive import derive_state
from diagnostics.core.metrics.derive import window as window_of
from diagnostics.core.metrics.slo import slo_attainment
from diagnostics.core.metrics.status import StatusReport
from diagnostics.errors import TargetError
from diagnostics.recording import RecordingWriter
from diagnostics.sources.vllm_http import api_key_from_env

MAX_PROBE_RETENTION = 900.0  # the longest probe (600 s) and its last requests' timeout, with the scrape before


def cmd_record(args: argparse.Namespace) -> int:
    if args.prometheus or args.from_store:
        target = window.store_window(args, args.since) if args.from_store else window.prometheus_window(args, args.since)
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
        print(f"recorded {len(records)} scrapes of {target.target} to {args.out}", file=sys.stderr)
        return 0
    client = window.client(args)
    window.check_first(client)
    gpus = window.gpu_reader(args)
    try:
        writer = RecordingWriter(args.out)
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc.strerror}", EXIT_FILE) from None
    store = window.open_store(args, write=True) if args.data_dir else None
    try:
        with writer:
            collector = window.collect(client, args.seconds, args.interval, writer, gpus, store)
    finally:
        if store is not None:
            store.close()
    status = collector.status()
    print(
        f"recorded {writer.num_records} scrapes of {client.base_url} to {args.out} ({status.num_failures} failed)",
        file=sys.stderr,
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    source = window.source(args, since=args.since or max(args.window, 60.0) * 2)
    assert source is not None  # the parser asks for exactly one source
    status = source.status()
    history = source.history()
    recent = window_of(history, args.window)
    slo = slo_attainment(recent, args.ttft_budget_ms, args.itl_budget_ms)
    gpus = source.gpu_history()
    seen = window_outcomes(recent, status.info.max_model_len if status.info else None)
    report = StatusReport.of(status, derive_state(history, args.window), slo, seen, gpus[-1][1] if gpus else None)
    if status.info_error:
        print(f"warning: {status.info_error}", file=sys.stderr)
    print(json.dumps(report.to_json(), indent=1) if args.json else render_status(report))
    return 0


def _changes(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        flag, sep, value = pair.partition("=")
        if not sep or not flag.strip("-") or not value:
            raise CliError(f"--set {pair!r}: write it as FLAG=VALUE, e.g. --set max-num-seqs=16", EXIT_USAGE)
        out["--" + flag.strip("-").replace("_", "-")] = value
    return out


def cmd_whatif(args: argparse.Namespace) -> int:
    from diagnostics.core.whatif import goals as seeking

    try:
        wanted = [seeking.parse_goal(g) for g in args.goal]
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    changes = _changes(args.set)
    source = window.source(args, since=args.since or 900.0)
    if source is None:
        raise CliError("whatif needs a window: --replay FILE, --url URL --seconds N, or --prometheus URL", EXIT_USAGE)
    history, info = source.history(), source.status().info
    ctx = prepare(history, info=info, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                  budgets=Budgets(ttft_ms=args.ttft_budget_ms, itl_ms=args.itl_budget_ms))
    if wanted:
        try:
            answer = seeking.seek(history, ctx.flags, wanted, args.keep)
        except ValueError as exc:
            raise CliError(f"cannot replay this window: {exc}", EXIT_UNKNOWN) from None
        print(json.dumps(answer.to_json(), indent=1) if args.json else render_goals(answer))
        return 0
    # Checked on what the window's own finding is about (its throughput when it has none).
    aimed = whatif.aimed_for([f.id for f in diagnose(ctx) if f.severity != "info"])
    try:
        base = whatif.baseline(history, ctx.flags)
        prediction = base.predict(changes, aimed=aimed)
    except whatif.NotModelled as exc:
        raise CliError(f"not modelled: {exc}", EXIT_USAGE) from None
    except ValueError as exc:
        raise CliError(f"cannot replay this window: {exc}", EXIT_UNKNOWN) from None
    if args.json:
        print(json.dumps(prediction.full_json(), indent=1))
        return 0
    print(render_whatif(prediction))
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    log_text = None
    if args.log:
        try:
            log_text = open(args.log, encoding="utf-8", errors="replace").read()
        except OSError as exc:
            raise CliError(f"cannot read {args.log}: {exc.strerror}", EXIT_FILE) from None
    budgets = Budgets(ttft_ms=args.ttft_budget_ms, itl_ms=args.itl_budget_ms)
    source = window.source(args, since=args.since or 900.0)
    history, info = (source.history(), source.status().info) if source is not None else ([], None)
    ctx = prepare(history, info=info, budgets=budgets, log_text=log_text, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens,
                  gpus=source.gpu_history() if source is not None else ())
    findings = diagnose(ctx)
    if args.predict and history:
        predicted, _, _ = whatif.with_predictions(findings, history, ctx.flags)
        findings = list(predicted)
    seen = outcomes(ctx)
    if args.json:
        print(json.dumps({"findings": [f.to_json() for f in findings], "outcomes": seen.to_json()}, indent=1,
                         default=str))
    else:
        print(render_findings(findings, ctx.flags, seen))
    return exit_code(findings)


def cmd_fleet(args: argparse.Namespace) -> int:
    if not args.prometheus:
        return _fleet_direct(args)
    from diagnostics import prometheus_fleet as fleet

    client, scope = window.prometheus(args)
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
    print(render_fleet(report.rows, report.findings))
    return 0


def _fleet_direct(args: argparse.Namespace) -> int:
    """``fleet --url A --url B`` (or the configured targets): every server scraped at once for
    ``--seconds``, one collector each, then the same table as through Prometheus."""
    from diagnostics import direct_fleet
    from diagnostics.core.fleet import direct

    config = direct_fleet.configured()
    try:
        targets = direct_fleet.url_targets(args.url, config) if args.url else direct_fleet.configured_targets(config)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    if not targets:
        raise CliError("fleet needs --url URL (repeatable), --prometheus URL, or configured targets (VLLM_URL, "
                       "[targets] in .streamlit/secrets.toml)", EXIT_USAGE)
    print(f"collecting {len(targets)} servers for {args.seconds:g} s", file=sys.stderr)
    read = direct_fleet.collect(targets, args.seconds, args.interval, args.timeout or 2.0)
    budgets = Budgets(ttft_ms=args.ttft_budget_ms, itl_ms=args.itl_budget_ms)
    # Each target's whole collection is the window (ending at its own newest scrape).
    report = direct.report(read, range_s=args.seconds + args.interval, interval_s=args.interval, budgets=budgets)
    if args.json:
        print(json.dumps({
            "source": "direct",
            "window_seconds": report.range_s,
            "instances": [{"name": report.names.get(row.instance), **row.to_json()} for row in report.rows],
            "fleet_findings": [f.to_json() for f in report.findings],
            "outliers": [{"instance": o.instance, "key": o.key, "why": o.why} for o in report.outliers],
        }, indent=1))
        return 0
    print(render_fleet(report.rows, report.findings))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from diagnostics.core.probe import SETTLE_SECONDS, ProbeSpec, with_server
    from diagnostics.sources.probe_http import Probe, ProbeRefused

    spec = ProbeSpec(
        concurrency=args.concurrency, requests=args.requests, seconds=args.seconds,
        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, ignore_eos=not args.no_ignore_eos,
        shared_prefix_tokens=args.shared_prefix_tokens, n=args.n, model=args.model, seed=args.seed,
    )
    if spec.problems():
        raise CliError("refused: " + "; ".join(spec.problems()), EXIT_USAGE)
    client = window.client(args)
    what = spec.describe(client.base_url)
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"this adds load — {what}. Add --yes to confirm.", EXIT_USAGE)
        answer = input(f"Send {what}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not sent", file=sys.stderr)
            return 0
    window.check_first(client)
    collector = Collector(client, interval_seconds=0.5, retention_seconds=MAX_PROBE_RETENTION).start()
    try:
        time.sleep(0.6)  # a scrape before the first request: the server side starts from it
        try:
            probe = Probe(client.base_url, spec, api_key_from_env(args.api_key_env)).start()
        except ProbeRefused as exc:
            raise CliError(f"refused: {exc}", EXIT_USAGE) from None
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
    print(json.dumps(summary.to_json(), indent=1) if args.json else render_probe(summary))
    return 1 if summary.num_errors else 0


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
        raise CliError(str(exc), EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", EXIT_USAGE) from None
    print(f"simulated vLLM ({args.scenario}) at {server.url} — not a real server; Ctrl-C stops it", file=sys.stderr,
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "record": cmd_record,
    "status": cmd_status,
    "diagnose": cmd_diagnose,
    "whatif": cmd_whatif,
    "simulate": cmd_simulate,
    "fleet": cmd_fleet,
    "probe": cmd_probe,
    "alert-rules": cmd_alert_rules,
}
