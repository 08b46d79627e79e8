"""The server not serving: unreachable or dead, restarted, answering late, or running requests
while no token moves (a stall, or a pause not yet long enough to be one), and an engine the log
says died while serving."""

from __future__ import annotations

from diagnostics.core.diagnosis.context import Context, episodes
from diagnostics.core.diagnosis.logs import log_time
from diagnostics.core.diagnosis.rules.common import absent, before, exposes
from diagnostics.core.diagnosis.types import Finding
from diagnostics.core.metrics.derive import Scrape
from diagnostics.core.metrics.failure import ErrorKind
from diagnostics.core.text import fmt_duration


def outage(ctx: Context) -> list[Finding]:
    """Failed scrapes: the server was unreachable, timed out, answered errors, or its engine died."""
    history = ctx.history
    findings = []
    slow: list[tuple[float, float]] = []
    for start, end in episodes([(s.ts, s.snapshot is None) for s in history]):
        failed = [s for s in history if s.snapshot is None and start <= s.ts <= end]
        errors = sorted({s.error or "failed" for s in failed})
        ongoing = history[-1].snapshot is None and history[-1].ts == end
        engine_dead = any(s.error_kind is ErrorKind.ENGINE_UNAVAILABLE for s in failed)
        if not ongoing and end - start < ctx.thresholds.slow_scrape_max_seconds \
                and all(s.error_kind is ErrorKind.TIMEOUT for s in failed):
            slow.append((start, end))
            continue
        title = _what_failed(failed, engine_dead) + (
            f" since {fmt_duration(end - start)} ago" if ongoing
            else f" for {fmt_duration(end - start)}, then recovered"
        )
        findings.append(
            Finding(
                id="server_down",
                severity="critical",
                title=title,
                evidence={"failed_scrapes": len(failed), "errors": errors[:5], "ongoing": ongoing,
                          **before(ctx, start)},
                checks=(
                    "Is the process alive? Read the last lines of its log: an OOM, EngineDeadError or a traceback "
                    "names the cause (python -m diagnostics diagnose --log FILE parses it).",
                    "After a restart, compare the flags with the last good run before changing anything.",
                ),
                time_range=(start, end),
            )
        )
    if slow:
        findings.append(_slow_scrapes(ctx, slow))
    for iv, (_, snap) in zip(ctx.intervals, ctx.ok[1:]):
        if iv.restarted:
            findings.append(
                Finding(
                    id="server_restarted",
                    severity="warning",
                    title="The server restarted inside the window: requests in flight were lost",
                    evidence={"started_at": snap.process_start_time_seconds, "seen_at": iv.end,
                              **before(ctx, iv.start + 1e-6)},
                    checks=(
                        "Was it restarted on purpose (a deploy, an autoscaler)? If not, read the log of the run that "
                        "ended: an OOM, EngineDeadError or a traceback names the cause (diagnose --log FILE).",
                        "The 'before' values are the last minute of the run that ended.",
                    ),
                    time_range=(iv.start, iv.end),
                )
            )
    return findings


def _what_failed(failed: list[Scrape], engine_dead: bool) -> str:
    """What the failed scrapes say, by kind: a dead engine, an answer that is not vLLM's metrics
    (another service on the port, a proxy's page) or cannot be read, else unreachable. Timeouts
    among the answers do not change what the answers said: a login page that is slow to answer
    under load is still not vLLM."""
    kinds = {s.error_kind for s in failed} - {ErrorKind.TIMEOUT}
    if engine_dead:
        return "Engine dead (/health 503)"
    if kinds == {ErrorKind.NOT_VLLM}:
        return "Answers, but not as a vLLM server"
    if kinds == {ErrorKind.BAD_PAYLOAD}:
        return "/metrics answers what cannot be read"
    return "Server unreachable"


def _slow_scrapes(ctx: Context, episodes_: list[tuple[float, float]]) -> Finding:
    """Scrapes that timed out and were answered again within seconds: a busy API process, not an
    outage (a server whose frontend shares two cores with its engines answers late under load)."""
    failed = sum(1 for s in ctx.history if s.snapshot is None and any(a <= s.ts <= b for a, b in episodes_))
    return Finding(
        id="scrapes_slow",
        # One or two late answers as a burst lands are worth knowing, not worth a warning.
        severity="warning" if failed >= ctx.thresholds.slow_scrape_warning_count else "info",
        title=f"/metrics answered late: {failed} scrape{'s' if failed > 1 else ''} timed out"
        f"{f' in {len(episodes_)} episodes' if len(episodes_) > 1 else ''}; the next scrape answered"
        + (" each time" if len(episodes_) > 1 else ""),
        evidence={"failed_scrapes": failed, "episodes": len(episodes_),
                  "first_timeout_at": episodes_[0][0], "last_timeout_at": episodes_[-1][1]},
        checks=(
            "The API process was too busy to answer in time: watch it (CPU, event-loop lag) under this load; a "
            "frontend that falls behind delays tokens too (--api-server-count, or fewer clients per server).",
            "If timeouts keep coming, raise the scrape timeout or interval rather than read them as an outage.",
        ),
        time_range=(episodes_[0][0], episodes_[-1][1]),
    )


def stall(ctx: Context) -> list[Finding]:
    """Requests running, no token produced for several intervals, while the server still answers."""
    if not exposes(ctx, "generation_tokens"):
        return [absent("vllm:generation_tokens_total", "silent_stall", "Token production cannot be followed.")]
    findings = []
    for episode in ctx.stalls:
        seconds = episode.end - episode.start
        ongoing = ctx.ok[-1][0].ts == episode.end
        findings.append(
            Finding(
                id="silent_stall",
                severity="critical",
                title=f"Silent stall: {episode.num_requests_running:.0f} requests running, no token for "
                f"{fmt_duration(seconds)}" + (" (ongoing)" if ongoing else ", then tokens resumed"),
                evidence={"num_requests_running": episode.num_requests_running,
                          "seconds_without_tokens": round(seconds, 3), "scrapes": episode.num_scrapes,
                          "ongoing": ongoing},
                checks=(
                    "The frontend still answers /metrics (and /health), but the engine produces nothing: dump the "
                    "EngineCore stacks (py-spy dump --pid <EngineCore pid>) before restarting.",
                    "Look for a stopped or swapping process, a hung GPU (nvidia-smi), or a stuck collective (TP/PP).",
                ),
                time_range=(episode.start, episode.end),
            )
        )
    return findings


def tokens_stopped(ctx: Context) -> list[Finding]:
    """Requests running and no token for a few seconds at the end of the window, not yet a stall:
    say so, and (the table's ``while_tokens_stopped``) give no queue or capacity advice meanwhile."""
    stopped = ctx.tokens_stopped
    if stopped is None or any(s.end >= stopped.since + stopped.seconds for s in ctx.stalls):
        return []
    at_least = "at least " if stopped.began_before_window else ""
    t = ctx.thresholds
    if stopped.long_step_seconds is not None and stopped.seconds >= t.stall_min_seconds:
        # Not a stall yet because this window's long prefill steps silenced tokens as long (see _stalls).
        called = (f"this window's long prefills each stopped tokens for up to {fmt_duration(stopped.long_step_seconds)}"
                  f"; a stall is called past {fmt_duration(t.long_step_rate_factor * stopped.long_step_seconds)}")
    else:
        called = f"a stall is called after {fmt_duration(t.stall_min_seconds)}"
    return [Finding(
        id="tokens_stopped", severity="info",
        title=f"No token for {at_least}{fmt_duration(stopped.seconds)} with {stopped.num_requests_running:.0f} "
        f"running: watching ({called}); no queue or capacity advice until tokens move",
        evidence={"seconds_without_tokens": round(stopped.seconds, 3), "num_requests_running":
                  stopped.num_requests_running, "began_before_window": stopped.began_before_window,
                  "longest_prefill_silence_seconds": stopped.long_step_seconds},
        time_range=(stopped.since, stopped.since + stopped.seconds),
    )]


DEATH_CAUSES: dict[str, tuple[str, str]] = {
    # kind: (what it says in a title, what to check first)
    "host_oom_killed": ("killed by the host's out-of-memory killer",
                        "Host memory: the kernel killed the engine (dmesg / journalctl -k: 'Out of memory: Killed "
                        "process'). Lower --max-num-seqs or the CPU-side caches (--swap-space, --max-cpu-loras), or "
                        "give the container more memory."),
    "native_crash": ("a native crash in the engine process",
                     "A kernel died of a signal (the 'Fatal Python error' line names it, the stack below it the "
                     "kernel): 'Illegal instruction' is an instruction this CPU or VM does not allow — on CPU "
                     "vLLM, AMX kernels on a host that lists amx_tile but never granted it "
                     "(arch_prctl ARCH_REQ_XCOMP_PERM); a segmentation fault, a kernel bug: look for a vLLM issue "
                     "naming that kernel and that build."),
    "cuda_oom": ("out of device memory while serving",
                 "Activation memory ran out at runtime: lower --gpu-memory-utilization a little (headroom for "
                 "activations) or --max-num-seqs / --max-num-batched-tokens."),
    "nccl": ("a collective (NCCL) error or timeout between ranks",
             "A rank hung or the interconnect failed: check every TP/PP/DP rank's log for the first error, run with "
             "NCCL_DEBUG=INFO, and look for a stopped or slow worker."),
    "rpc_timeout": ("a worker that stopped answering (RPC timeout)",
                    "A worker hung: dump its stacks (py-spy dump) if it is still there, check the device (nvidia-smi) "
                    "and the host for a stopped process."),
    "engine_exception": ("an exception inside the engine",
                         "The engine's own traceback (the EngineCore lines above EngineDeadError) names the failing "
                         "code: look for a known vLLM issue with that message, or a request that triggers it."),
    "engine_exited": ("its process exiting without an error of its own (killed by a signal?)",
                      "No traceback from the engine: something killed it — the OOM killer (dmesg), an operator, a "
                      "container memory limit or a node drain."),
}


def engine_died(ctx: Context) -> list[Finding]:
    """An engine that died after the server had come up (EngineDeadError in the log): when, the log
    lines that say why, the last minute before it from the recorded history, and what to check."""
    log = ctx.log
    dead = log.died_serving() if log is not None else None
    if log is None or dead is None:
        return []
    lines = log.death_lines()
    kinds = [c.kind for c in lines]
    cause = next((k for k in DEATH_CAUSES if k in kinds), None)
    when = log_time(dead.text)
    # The death is where the server stopped answering, not where it was slow to: on a busy host the
    # scrapes under load timed out for 7 s, then answered again (6 running) before the kill's
    # refusals began; the minute before those is the one that matters.
    failed = [s for s in ctx.history if s.snapshot is None]
    down = next((s.ts for s in failed if s.error_kind is not ErrorKind.TIMEOUT), failed[0].ts if failed else None)
    state = before(ctx, down if down is not None else (ctx.history[-1].ts + 1 if ctx.history else 0.0))
    what, check = DEATH_CAUSES[cause] if cause else ("no cause the log names", DEATH_CAUSES["engine_exited"][1])
    signal = next((c.words["signal"] for c in lines if c.kind == "native_crash" and "signal" in c.words), None)
    if signal is not None and cause == "native_crash":
        what = f"{what} ({signal})"
    return [Finding(
        id="engine_died",
        severity="critical",
        title=f"Engine core died while serving{f' at {when}' if when else ''}: {what}",
        evidence={"died_at_log_time": when, "log_lines": [f"line {c.line_no}: {c.text[-240:]}" for c in lines][:6],
                  **state},
        checks=(
            check,
            "The requests in flight got HTTP 500 and the server shut down: restart it, and keep this log "
            "(and a recording of the minute before) with the incident.",
        ),
        time_range=(down, down) if down is not None else None,
    )]


def server_stopped(ctx: Context) -> list[Finding]:
    """A server that had come up and was asked to stop (SIGTERM or SIGINT: a deploy, an autoscaler, a
    node drain, ``docker stop``, Ctrl-C) before any sign of a death: said, as information, so a clean
    shutdown is not read as a crash, nor a log that ends in one as "nothing unusual"."""
    log = ctx.log
    stop = log.stopped_on_request() if log is not None else None
    if log is None or stop is None:
        return []
    # The EngineCore names the signal it got: the user's own when it was sent to the whole process
    # group, else the SIGTERM the API server's process manager relays to it (vllm/v1/utils.py).
    signals = sorted({c.words["signal"] for c in log.stop_lines if "signal" in c.words})
    after = [c for c in log.stop_lines if c.line_no >= stop.line_no]
    engine_count = next((c for c in after if c.kind == "in_flight"), None)
    streams_cut = sum(1 for c in after if c.kind == "stream_cut")
    when = log_time(stop.text)
    in_flight = int(engine_count.numbers["count"]) if engine_count is not None else streams_cut
    how = "drained" if engine_count is not None and engine_count.words.get("how") == "draining" else "cut"
    return [Finding(
        id="server_stopped",
        severity="info",
        title=f"Stopped on request{f' at {when}' if when else ''}: a clean shutdown, not a death"
              + (f" ({in_flight} request{'s' if in_flight != 1 else ''} in flight {how})" if in_flight else ""),
        evidence={"stopped_at_log_time": when, "engine_core_signals": signals, "num_requests_in_flight": in_flight,
                  "num_streams_cut": streams_cut,
                  "log_lines": [f"line {c.line_no}: {c.text[-240:]}" for c in after if c.kind != "stream_cut"][:4]},
        checks=(
            "If nobody meant to stop it, find who sent the signal: a deploy or rollout, an autoscaler scaling in, a "
            "node drain or eviction, `docker stop` / `kubectl delete pod`, systemd, or Ctrl-C in its terminal.",
            "vLLM aborts the requests in flight on a stop unless it was started with --shutdown-timeout N (a grace "
            "period in seconds for running requests to finish; 0, the default, aborts them).",
        ),
    )]
