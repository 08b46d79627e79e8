"""The diagnosis on every labelled real-incident recording (``tests/fixtures/incidents``, recorded
from real ``vllm serve`` by ``record.py``): the label's top finding, severity, knob and direction;
the healthy ones quiet. Deterministic: the recordings are committed."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.fixtures.incidents import record
from tests.fixtures.incidents.corpus import Case, cases, judge, labels, run

CASES = list(cases())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_diagnosis_matches_the_label(case: Case) -> None:
    ok, why = judge(run(case), case.expect, len(case.scrapes))
    assert ok, why


def test_the_corpus_has_two_recordings_per_class_and_several_healthy_ones() -> None:
    per_class = Counter(label["class"] for label in labels().values())
    for incident in ("queue_at_cap", "kv_pressure", "sharing_off", "head_of_line", "slow_decode", "stall", "outage",
                     "hung_rank", "admission", "deferred"):
        assert per_class[incident] >= 2, per_class
    assert per_class["healthy"] >= 3
    assert len({label["shape"] for label in labels().values()}) >= 3


@pytest.mark.parametrize("name", sorted(labels()))
def test_every_labelled_run_showed_its_condition_to_the_clients(name: str) -> None:
    """Judged on what the load generator's own clients saw, independent of the diagnosis: the same
    check the recorder applied before it kept the recording (``Case.shows``)."""
    label = labels()[name]
    assert label["clients"]["requests"] > 0
    if label["class"] == "admission":
        assert label["clients"]["failed"] > 0, label["clients"]  # the 503s are the incident
    elif label["class"] not in ("outage", "stall"):
        assert label["clients"]["failed"] == 0, label["clients"]
    assert record.BY_NAME[name].shows(label), (name, label["clients"])
