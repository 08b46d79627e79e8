from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnostics.core.metrics.parse import parse_line, parse_vllm_samples
from diagnostics.errors import BadMetricsPayload
from tests.conftest import REAL_PAYLOADS, fixture_text


def _reference(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:") and not s.name.endswith("_created"):
                out.append((s.name, tuple(sorted(s.labels.items())), s.value))
    return sorted(out, key=repr)


@pytest.mark.parametrize("name", [*REAL_PAYLOADS, "metrics-0.8-renamed.txt"])
def test_identical_to_prometheus_client_on_real_payloads(name: str) -> None:
    text = fixture_text(name)
    ours = sorted(
        ((s.name, tuple(sorted(s.labels.items())), s.value) for s in parse_vllm_samples(text) if s.name.startswith("vllm:")),
        key=repr,
    )
    assert ours == _reference(text)
    assert len(ours) > 200


def test_created_samples_are_ignored(burst_text: str) -> None:
    assert not [s for s in parse_vllm_samples(burst_text) if s.name.endswith("_created")]


def test_process_start_time_is_kept(burst_text: str) -> None:
    starts = [s for s in parse_vllm_samples(burst_text) if s.name == "process_start_time_seconds"]
    assert len(starts) == 1 and starts[0].value > 1e9


def test_nan_and_infinities_parse_as_floats() -> None:
    text = 'vllm:a{engine="0"} NaN\nvllm:b +Inf\nvllm:c -Inf\nvllm:d 1e3 1700000000000\n'
    values = {s.name: s.value for s in parse_vllm_samples(text)}
    assert math.isnan(values["vllm:a"])
    assert values["vllm:b"] == math.inf and values["vllm:c"] == -math.inf
    assert values["vllm:d"] == 1000.0


def test_escaped_label_values_match_prometheus_client() -> None:
    text = 'vllm:x{model_name="a\\"b\\\\c\\nd,}",engine="0"} 1\n'
    assert parse_line(text.strip()).labels == {"model_name": 'a"b\\c\nd,}', "engine": "0"}
    assert _reference(text)[0][1] == (("engine", "0"), ("model_name", 'a"b\\c\nd,}'))


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{engine="0",model_na',
        'vllm:num_requests_running{engine="0"}',
        "vllm:num_requests_running",
        'vllm:num_requests_running{engine="0"} twelve',
        'vllm:num_requests_running{engine=0} 1',
    ],
)
def test_truncated_or_malformed_lines_raise_with_line_number(line: str) -> None:
    with pytest.raises(BadMetricsPayload, match="line 2"):
        parse_vllm_samples("# HELP x\n" + line + "\n")


def test_other_families_are_not_inspected() -> None:
    assert parse_vllm_samples("garbage here {{\nvllm:ok 1\n")[0].value == 1.0
