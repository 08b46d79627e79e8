"""One URL normaliser for every target (vLLM servers, the probe, the Prometheus the Fleet page reads)."""

from __future__ import annotations

import re

import pytest

from diagnostics.core.targets import normalize_url, same_url


@pytest.mark.parametrize(("given", "expected"), [
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),  # no scheme: http
    ("  http://h:1/ ", "http://h:1"),  # spaces and the trailing slash go
    ("https://h", "https://h"),  # https stays
    ("http://h:1/prefix//", "http://h:1/prefix"),  # a path prefix (behind a proxy) stays, without its slashes
    ("http://[::1]:8000", "http://[::1]:8000"),
])
def test_a_url_is_written_one_way(given: str, expected: str) -> None:
    assert normalize_url(given) == expected


@pytest.mark.parametrize(("bad", "says"), [
    ("", "empty URL"),
    ("   ", "empty URL"),
    ("ftp://h", "not an http(s) URL"),
    ("http://", "not an http(s) URL"),
    ("http://a b:1", "not an http(s) URL"),
    ("http://h:port", "not a valid URL"),
    ("http://h:70000", "not a valid URL"),
    ("http://user:pw@h:1", "credentials"),
])
def test_a_url_that_cannot_be_a_target_is_refused_saying_why(bad: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        normalize_url(bad)


def test_the_message_names_what_the_url_is_for() -> None:
    with pytest.raises(ValueError, match="empty Prometheus URL"):
        normalize_url("", "Prometheus URL")


@pytest.mark.parametrize(("a", "b", "same"), [
    ("HTTP://h:1/", "h:1", True),
    ("http://H:1", "http://h:1", True),
    ("http://h:1", "https://h:1", False),
    ("http://h:1", "http://h:2", False),
    ("http://user:pw@h:1", "http://user:pw@h:1", False),  # never a refused URL, not even to itself
])
def test_same_url_compares_the_normalised_spelling(a: str, b: str, same: bool) -> None:
    assert same_url(a, b) is same
