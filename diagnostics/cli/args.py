"""The CLI's parser: every command's flags, the ``--help`` text with the exit codes, and the checks
argparse cannot express (which sources go together). Bad usage exits 2; ``diagnose`` 3."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NoReturn

from diagnostics.cli.exits import EXIT_UNKNOWN
from diagnostics.core import whatif
from diagnostics.core.fleet.promql import parse_duration
from diagnostics.core.simulator.scenarios import SCENARIOS
from diagnostics.sources.vllm_http import DEFAULT_API_KEY_ENV

DESCRIPTION = """The headless CLI: ``python -m diagnostics record|status|diagnose|whatif|simulate|serve|fleet|probe|alert-rules`` (same core as the app).

Every command that takes ``--url`` also takes ``--prometheus URL [--selector S] [--instance I]
[--since 2h]``: the same views read from the history Prometheus keeps.

Exit codes: 0 ok (``probe``: every request completed; 1 some failed); 2 bad usage or a probe over its caps; 3 target unreachable, timing out or answering errors; 4 not a vLLM
server; 5 unreadable recording, log or output file. ``diagnose`` follows the monitoring-plugin
convention instead (so cron, pipelines and Nagios-style checks can act on it): 0 nothing above info,
1 a warning, 2 a critical finding, 3 unknown (bad usage, target unreachable or not vLLM,
unreadable recording, log or output file).
"""


class Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage; ``diagnose`` answers 3 (unknown) instead, since its 2 means
    a critical finding."""

    usage_exit = 2

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_exit, f"{self.prog}: error: {message}\n")


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


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> Parser:
    """Every command's flags (``serve`` passes the rest of its line to ``streamlit run``)."""
    parser = Parser(prog="python -m diagnostics", description=DESCRIPTION,
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
                       help="with --prometheus or the history store: how far back, e.g. 15m, 2h, 7d" + (f" (default {since})" if since else ""))
        p.add_argument("--until", type=_when, metavar="TIME",
                       help="with --prometheus or the history store: the window ends here (Unix seconds or ISO 8601; default now)")

    def store_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", metavar="DIR", help="the history store's directory (default: "
                       "$VLLM_TRIAGE_DATA_DIR, else $XDG_STATE_HOME/vllm-triage or ~/.local/state/vllm-triage)")
        p.add_argument("--from-store", action="store_true",
                       help="read the window from the history store (--since/--until; --url names the target "
                       "when it holds several); --data-dir with --since implies it")

    def target_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", help="base URL of the vLLM server, e.g. http://127.0.0.1:8000")
        prometheus_args(p, None)
        store_args(p)
        p.add_argument(
            "--api-key-env",
            default=DEFAULT_API_KEY_ENV,
            metavar="VAR",
            help=f"environment variable holding the API key (default {DEFAULT_API_KEY_ENV})",
        )
        p.add_argument("--gpu-metrics-url", metavar="URL",
                       help="with --url: NVIDIA dcgm-exporter's /metrics for the server's GPUs (utilisation, "
                       "temperature, power, clocks, throttle reasons, memory), when NVML is not on this host")
        p.add_argument("--interval", type=_positive, default=1.0, help="seconds between scrapes (min 0.25)")
        p.add_argument("--timeout", type=_positive, help="seconds a whole request may take (default 2; 15 for Prometheus)")

    record = sub.add_parser("record", help="scrape a server for N seconds into a recording (.jsonl or .jsonl.gz); "
                            "with --data-dir the scrapes also go to the history store")
    target_args(record)
    record.add_argument("--seconds", type=_positive, help="with --url: how long to record")
    record.add_argument("--out", "-o", required=True, help="output file; .gz compresses")

    status = sub.add_parser("status", help="the current derived state of a server or a recording")
    target_args(status)
    status.add_argument("--replay", help="a recording: the state at its end")
    status.add_argument("--seconds", type=_positive, default=2.0, help="with --url: seconds to collect first")
    status.add_argument("--window", type=_positive, default=60.0, help="window for rates and quantiles, seconds")
    status.add_argument("--json", action="store_true", help="one JSON object")
    budget_args(status)  # with a budget: the share of requests within it (goodput)
    diag = sub.add_parser("diagnose", help="findings and flag changes for a server, a recording or a startup log")
    if isinstance(diag, Parser):  # always: the subparsers take the parent's class
        diag.usage_exit = EXIT_UNKNOWN
    target_args(diag)
    diag.add_argument("--replay", help="a recording: the whole recording is the window")
    diag.add_argument("--seconds", type=_positive, default=30.0, help="with --url: seconds to collect (the window)")
    diag.add_argument("--log", help="the server's startup log (alone: diagnose a failed start)")
    budget_args(diag)
    diag.add_argument("--max-num-seqs", type=int, help="the server's --max-num-seqs, when known")
    diag.add_argument("--max-num-batched-tokens", type=int, help="the server's --max-num-batched-tokens, when known")
    diag.add_argument("--json", action="store_true", help='{"findings": [...]}')
    diag.add_argument("--no-predict", dest="predict", action="store_false",
                      help="skip the predicted effect of each suggested change (the simulated engine's replay)")

    what = sub.add_parser("whatif", help="the predicted effect of a flag change: the window replayed on the simulated "
                          "engine under the current flags and under the change")
    target_args(what)
    what.add_argument("--replay", help="a recording: the whole recording is the window")
    what.add_argument("--seconds", type=_positive, default=30.0, help="with --url: seconds to collect (the window)")
    what.add_argument("--set", action="append", default=[], metavar="FLAG=VALUE",
                      help=f"a change to predict, e.g. --set max-num-seqs=16 (repeatable); modelled: "
                      f"{', '.join(sorted(whatif.MODELLED))}")
    what.add_argument("--goal", action="append", default=[], metavar="NAME=VALUE",
                      help="instead of --set: find the smallest modelled change that meets every goal, e.g. "
                      "--goal itl-p99=100ms --goal ttft-p95=2s (repeatable; names: itl-p50/p95/p99/p99.9, "
                      "ttft-p50/p95, throughput, preemptions, waiting)")
    what.add_argument("--keep", action="append", default=[], metavar="METRIC",
                      help="with --goal: a metric the change may not make more than 5 %% worse, e.g. --keep throughput")
    what.add_argument("--max-num-seqs", type=int, help="the server's --max-num-seqs, when known")
    what.add_argument("--max-num-batched-tokens", type=int, help="the server's --max-num-batched-tokens, when known")
    budget_args(what)  # the window's finding (what the baseline is checked on) may need a budget
    what.add_argument("--json", action="store_true", help="the prediction, the inferred workload and the calibration")

    simulate = sub.add_parser("simulate", help="run the simulated vLLM engine's HTTP surface on loopback")
    simulate.add_argument("--scenario", default="healthy", help=", ".join(SCENARIOS))
    simulate.add_argument("--port", type=int, default=8000)
    simulate.add_argument("--host", default="127.0.0.1")
    simulate.add_argument("--speed", type=_positive, default=1.0, help="simulated seconds per wall second")

    serve = sub.add_parser("serve", help="the dashboard, collecting configured targets from start (a flight recorder) "
                           "into the history store (--data-dir DIR, --no-history)")
    serve.add_argument("streamlit_args", nargs="*", help="passed to `streamlit run` (e.g. --server.port 8600)")

    fleet = sub.add_parser("fleet", help="several vLLM servers side by side (scraped directly, or every instance "
                           "behind a Prometheus): state, outliers, worst finding")
    fleet.add_argument("--url", action="append", default=[], metavar="URL",
                       help="a vLLM server to scrape directly (repeatable; each gets only the API key configured for "
                       "that URL in VLLM_URL/VLLM_API_KEY or [targets]); with neither --url nor --prometheus: every "
                       "configured target")
    fleet.add_argument("--seconds", type=_positive, default=30.0,
                       help="direct targets: seconds to collect (the window; default 30)")
    fleet.add_argument("--interval", type=_positive, default=1.0, help="direct targets: seconds between scrapes")
    fleet.add_argument("--prometheus", metavar="URL", help="read every instance from this Prometheus HTTP API instead")
    fleet.add_argument("--selector", default="", help='with --prometheus: series selector for the vLLM targets, '
                       'e.g. \'{job="vllm"}\'')
    fleet.add_argument("--since", type=_duration, metavar="DURATION",
                       help="with --prometheus: the window for rates, quantiles and the diagnosis (default 15m)")
    fleet.add_argument("--until", type=_when, metavar="TIME",
                       help="with --prometheus: the window ends here (Unix seconds or ISO 8601; default now)")
    fleet.add_argument("--timeout", type=_positive, help="seconds a whole query or scrape may take (default 15 for "
                       "Prometheus, 2 for a server)")
    budget_args(fleet)
    fleet.add_argument("--json", action="store_true", help="one object per instance: instance, model, up, …")

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

    alerts = sub.add_parser("alert-rules", help="a Prometheus rule file with the same thresholds")
    alerts.add_argument("--out", help="write to this file (default: stdout)")
    alerts.add_argument("--job", default="vllm", help="the Prometheus job that scrapes vLLM (for the down alert)")
    alerts.add_argument("--itl-budget-ms", type=_positive, help="add an ITL p95 budget alert")
    alerts.add_argument("--ttft-budget-ms", type=_positive, help="add a TTFT p95 budget alert")
    return parser


def parse(words: Sequence[str]) -> argparse.Namespace:
    """The command line's namespace (``args.command`` names the command), or exit 2 (``diagnose``:
    3) with the usage and the reason."""
    parser = build_parser()
    if words[:1] == ["diagnose"]:  # unrecognized arguments are reported by the top-level parser
        parser.usage_exit = EXIT_UNKNOWN
    args = parser.parse_args(words)
    if getattr(args, "data_dir", None) and (args.since or args.until) and args.command != "record":
        args.from_store = True
    store = bool(getattr(args, "from_store", False))
    if store and (args.prometheus or getattr(args, "replay", None)):
        parser.error("--from-store reads the history store: not with --prometheus or --replay")
    # With the store, --url names which of its targets to read.
    sources = [bool(getattr(args, k, None)) for k in ("url", "replay", "prometheus")] + [store]
    if store and args.url:
        sources = sources[1:]
    if args.command == "status" and sum(sources) != 1:
        parser.error("status needs exactly one of --url, --prometheus or --replay")
    if args.command == "record" and sum(sources) != 1:
        parser.error("record needs exactly one of --url, --prometheus or --from-store")
    if args.command == "diagnose" and sum(sources) > 1:
        parser.error("diagnose takes one of --url, --prometheus or --replay")
    if args.command == "diagnose" and not (any(sources) or args.log):
        parser.error("diagnose needs --url, --prometheus, --replay or --log")
    if args.command in ("record", "status", "diagnose") and not args.prometheus:
        for flag in ("selector", "instance") if store else ("selector", "instance", "since", "until"):
            if getattr(args, flag, None):
                parser.error(f"--{flag} goes with --prometheus")
    if args.command == "whatif" and bool(args.set) == bool(args.goal):
        parser.error("whatif needs either --set FLAG=VALUE (predict a change) or --goal NAME=VALUE (find one)")
    if args.command == "whatif" and args.keep and not args.goal:
        parser.error("--keep goes with --goal")
    if args.command == "fleet" and args.prometheus and args.url:
        parser.error("fleet takes --prometheus or --url, not both")
    if args.command == "fleet" and not args.prometheus:
        for flag in ("selector", "since", "until"):
            if getattr(args, flag, None):
                parser.error(f"--{flag} goes with --prometheus (direct targets are collected for --seconds)")
    if args.command == "fleet" and args.prometheus and not args.since:
        args.since = 900.0
    if args.command == "record" and (args.prometheus or store) and not args.since:
        args.since = 3600.0
    if args.command == "record" and args.url and not store and not args.seconds:
        parser.error("record --url needs --seconds")
    if getattr(args, "interval", 1.0) < 0.25:
        parser.error("--interval must be at least 0.25 s")
    return args
