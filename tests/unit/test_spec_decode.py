"""Speculative decoding: acceptance from vLLM's counters (hand-computed windows), the rule that says
"fewer draft tokens" or "off", and the simulated engine's two scenarios."""

from __future__ import annotations

from collections.abc import Sequence

from diagnostics.core.diagnosis import diagnose, prepare
from diagnostics.core.figures.live import spec_decode_figure
from diagnostics.core.metrics.catalog import parse_snapshot
from diagnostics.core.metrics.derive import Scrape, spec_decode
from diagnostics.core.simulator.scenarios import SCENARIOS
from diagnostics.sim.driver import Simulation


def window(rows: Sequence[tuple[float, float, float, Sequence[float]]]) -> list[Scrape]:
    """One scrape a second: (drafts, draft tokens, accepted, accepted per position) cumulative."""
    out = []
    for t, (drafts, tokens, accepted, per_pos) in enumerate(rows):
        lab = 'engine="0",model_name="m"'
        text = (f"vllm:generation_tokens_total{{{lab}}} {100 * t}\n"
                f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}\n"
                f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {tokens}\n"
                f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}\n"
                + "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}\n'
                          for i, v in enumerate(per_pos)))
        out.append(Scrape(float(t), parse_snapshot(text)))
    return out


def steady(drafts_per_s: float, per_pos_rate: Sequence[float], seconds: int = 10) -> list[Scrape]:
    """``drafts_per_s`` drafts of ``len(per_pos_rate)`` tokens a second; position i accepted in
    that share of drafts."""
    k = len(per_pos_rate)
    return window([(drafts_per_s * t, drafts_per_s * k * t, drafts_per_s * t * sum(per_pos_rate),
                    [drafts_per_s * t * r for r in per_pos_rate]) for t in range(seconds)])


def test_acceptance_mean_length_and_positions_from_the_counters() -> None:
    spec = spec_decode(steady(100, (0.8, 0.5, 0.2)))
    assert spec is not None
    # 9 s of 100 drafts of 3 tokens: 2,700 drafted, 900 × 1.5 = 1,350 accepted.
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (900, 2700, 1350)
    assert spec.acceptance_rate == 0.5 and spec.mean_accepted_length == 2.5 and spec.num_speculative_tokens == 3
    assert spec.per_position_rate == (0.8, 0.5, 0.2)


def test_no_speculation_no_stats() -> None:
    scrapes = [Scrape(float(t), parse_snapshot(f'vllm:generation_tokens_total{{model_name="m"}} {t}\n'))
               for t in range(3)]
    assert spec_decode(scrapes) is None and spec_decode_figure(scrapes, 30) is None


def test_good_acceptance_is_quiet() -> None:
    assert "spec_low_acceptance" not in [f.id for f in diagnose(prepare(steady(100, (0.9, 0.7, 0.5, 0.3))))]


def test_low_acceptance_keeps_the_positions_that_pay() -> None:
    # 26 % accepted overall; position 0 is accepted 60 % of the time, the later ones rarely.
    findings = [f for f in diagnose(prepare(steady(100, (0.6, 0.3, 0.1, 0.05)))) if f.id == "spec_low_acceptance"]
    assert len(findings) == 1
    s = findings[0].suggestions[0]
    assert (s.flag, s.direction) == ("--speculative-config", "decrease") and '"num_speculative_tokens": 1' in str(s.value)
    assert findings[0].evidence["num_speculative_tokens"] == 4


def test_speculation_that_costs_more_than_it_gains_says_off() -> None:
    findings = [f for f in diagnose(prepare(steady(100, (0.2, 0.05, 0.01)))) if f.id == "spec_low_acceptance"]
    assert len(findings) == 1 and "costs more than it gains" in findings[0].title
    assert findings[0].suggestions[0].value is None and "Drop --speculative-config" in findings[0].suggestions[0].why


def test_too_few_draft_tokens_are_not_judged() -> None:
    assert "spec_low_acceptance" not in [f.id for f in diagnose(prepare(steady(2, (0.1, 0.0), seconds=5)))]


def test_the_simulated_engine_speculates_as_configured() -> None:
    for name, low, high in (("spec_decode_good", 0.5, 0.7), ("spec_decode_low", 0.0, 0.1)):
        sim = Simulation(name)
        scrapes = [Scrape(ts, parse_snapshot(t)) for ts, t in sim.run_for(40)]
        sim.engine.kv.check_invariants()
        spec = spec_decode(scrapes)
        assert spec is not None and spec.acceptance_rate is not None and low <= spec.acceptance_rate <= high, name
        # Position 0 is accepted with the configured chance; each later one only after it.
        assert abs(spec.per_position_rate[0] - SCENARIOS[name].config.spec_acceptance) < 0.05
        assert list(spec.per_position_rate) == sorted(spec.per_position_rate, reverse=True)
        fig = spec_decode_figure(scrapes, 30)
        assert fig is not None and [t.name for t in fig.data][:2] == ["all draft tokens", "position 0"]


def test_a_first_position_under_half_that_still_pays_keeps_one_draft_token() -> None:
    # Overall 26 % accepted; position 0 at 45 %, yet 1 + 1.05 = 2.05 tokens per verify step.
    found = [f for f in diagnose(prepare(steady(100, (0.45, 0.3, 0.2, 0.1)))) if f.id == "spec_low_acceptance"]
    assert len(found) == 1 and "costs more" not in found[0].title
    s = found[0].suggestions[0]
    assert '"num_speculative_tokens": 1' in str(s.value) and "Even the first draft token" in s.why
