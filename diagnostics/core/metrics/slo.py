"""SLO attainment (goodput) over a window, from vLLM's histogram buckets, with the honesty the
buckets allow.

A histogram counts observations at or below each bucket bound; where inside a bucket an observation
fell it cannot say. So the share of requests within a budget is known exactly only when the budget
is a bucket bound; otherwise it lies between the share at or below the largest bound under the
budget (a lower bound: "≥ 93 % within 250 ms, the bucket bound under the 300 ms budget") and the
share at or below the smallest bound above it (an upper bound). Nothing is interpolated.

TTFT is per request (``time_to_first_token_seconds``). ITL is judged per request on vLLM's
``request_time_per_output_token_seconds`` (each finished request's mean gap, which vLLM's docs
recommend for request-level TPOT) and, on servers without it, per token gap on
``inter_token_latency_seconds`` (then said so). The failed, rejected and given-up shares shown
beside it are the outcome rules' own (:class:`~diagnostics.core.diagnosis.outcomes.Outcomes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diagnostics.core.metrics.catalog import Histogram
from diagnostics.core.metrics.derive import Scrape, histogram_delta
from diagnostics.core.text import fmt_seconds_as_ms


@dataclass(frozen=True, slots=True)
class Attainment:
    """The share of a window's observations within a budget, bounded by the buckets around it."""

    budget_seconds: float
    per: str  # what one observation is: "request" or "token gap"
    total: float
    lower_bound_seconds: float | None  # the largest bucket bound ≤ the budget (None: the first is above it)
    within_lower: float  # observations ≤ that bound: certainly within the budget
    upper_bound_seconds: float | None  # the smallest bucket bound ≥ the budget (None: beyond the last)
    within_upper: float  # observations ≤ that bound: at most this many within the budget

    @property
    def exact(self) -> bool:
        return self.lower_bound_seconds is not None and math.isclose(self.lower_bound_seconds, self.budget_seconds)

    @property
    def share_at_least(self) -> float | None:
        return self.within_lower / self.total if self.total > 0 else None

    @property
    def share_at_most(self) -> float | None:
        return self.within_upper / self.total if self.total > 0 else None

    def text(self) -> str:
        """How a report may state it: exact at a bucket bound, else "≥ x % within the bound b ≤ budget"."""
        budget = fmt_seconds_as_ms(self.budget_seconds)
        low, high = self.share_at_least, self.share_at_most
        if low is None or high is None:
            return f"no {self.per}s in the window"
        if self.exact:
            return f"{_pct(low)} of {self.per}s within {budget}"
        if self.lower_bound_seconds is None:
            return (f"≤ {_pct(high, up=True)} of {self.per}s within {budget} (the first bucket, ≤ "
                    f"{fmt_seconds_as_ms(self.upper_bound_seconds or self.budget_seconds)}, is above the budget)")
        return (f"≥ {_pct(low)} of {self.per}s within {fmt_seconds_as_ms(self.lower_bound_seconds)}, the bucket bound ≤ the "
                f"{budget} budget (≤ {_pct(high, up=True)} within it)")

    def to_json(self) -> dict[str, Any]:
        return {"budget_seconds": self.budget_seconds, "per": self.per, "total": self.total,
                "share_at_least": self.share_at_least, "share_at_most": self.share_at_most,
                "lower_bound_seconds": self.lower_bound_seconds, "upper_bound_seconds": self.upper_bound_seconds,
                "exact": self.exact, "text": self.text()}


def attainment(hist: Histogram | None, budget_seconds: float, per: str) -> Attainment | None:
    """The share of ``hist``'s observations within ``budget_seconds`` (None without a histogram)."""
    if hist is None or not hist.cumulative:
        return None
    total = hist.cumulative[-1]
    finite = [(b, c) for b, c in zip(hist.bounds, hist.cumulative) if math.isfinite(b)]
    below = [(b, c) for b, c in finite if b <= budget_seconds or math.isclose(b, budget_seconds)]
    above = [(b, c) for b, c in finite if b >= budget_seconds or math.isclose(b, budget_seconds)]
    low_bound, low_count = below[-1] if below else (None, 0.0)
    high_bound, high_count = above[0] if above else (None, total)
    return Attainment(budget_seconds, per, total, low_bound, low_count, high_bound, high_count)


@dataclass(frozen=True, slots=True)
class SloAttainment:
    """Goodput over a window: the shares within the TTFT and ITL budgets."""

    ttft: Attainment | None
    itl: Attainment | None

    @property
    def goodput_at_least(self) -> float | None:
        """The share of requests certainly within every budget set: with one, its share; with two, at
        least a + b − 1 (two histograms cannot be joined request by request). None when a budget is
        judged per token gap (no per-request histogram) or nothing was observed."""
        judged = [a for a in (self.ttft, self.itl) if a is not None]
        shares = [a.share_at_least for a in judged if a.per == "request"]
        if not judged or len(shares) != len(judged) or any(s is None for s in shares):
            return None
        return max(0.0, sum(s or 0.0 for s in shares) - (len(shares) - 1))

    def text(self) -> str:
        """One line: goodput first, then each budget's share."""
        bits = []
        good = self.goodput_at_least
        if good is not None:
            bits.append(f"goodput ≥ {_pct(good)} of requests within " +
                        " and ".join(n for n, a in (("TTFT", self.ttft), ("ITL", self.itl)) if a is not None))
        elif self.itl is not None and self.itl.per != "request":
            bits.append("goodput not stated: ITL is judged per token gap here (no per-request "
                        "request_time_per_output_token_seconds), which says nothing of whole requests")
        for name, a in (("TTFT", self.ttft), ("ITL", self.itl)):
            if a is not None:
                bits.append(f"{name}: {a.text()}")
        return " · ".join(bits) if bits else "no budget set"

    def to_json(self) -> dict[str, Any]:
        return {"ttft": self.ttft.to_json() if self.ttft else None, "itl": self.itl.to_json() if self.itl else None,
                "goodput_at_least": self.goodput_at_least, "text": self.text()}


def slo_attainment(scrapes: Sequence[Scrape], ttft_budget_ms: float | None,
                   itl_budget_ms: float | None) -> SloAttainment | None:
    """The window's SLO attainment; None when no budget is set."""
    if ttft_budget_ms is None and itl_budget_ms is None:
        return None
    ttft = itl = None
    if ttft_budget_ms is not None:
        ttft = attainment(histogram_delta(scrapes, "time_to_first_token_seconds"), ttft_budget_ms / 1000, "request")
    if itl_budget_ms is not None:
        itl = attainment(histogram_delta(scrapes, "request_time_per_output_token_seconds"), itl_budget_ms / 1000,
                         "request")
        if itl is None:
            itl = attainment(histogram_delta(scrapes, "inter_token_latency_seconds"), itl_budget_ms / 1000,
                             "token gap")
    return SloAttainment(ttft, itl)


def _pct(share: float | None, up: bool = False) -> str:
    """A share to 0.1 %, rounded the safe way for its claim: down for "at least", up for "at most"."""
    if share is None:
        return "—"
    tenths = math.ceil(share * 1000 - 1e-9) if up else math.floor(share * 1000 + 1e-9)
    return f"{tenths / 10:.1f} %"
