"""The API server's access log (uvicorn's lines in a `vllm serve` log): how many answers of each HTTP
status each route gave, which is what tells a 404 (a model name not served) or a 401 (a missing API
key) from a 400 — ``http_requests_total`` groups them all as ``4xx``.

A line looks like ``(APIServer pid=7) INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 404
Not Found``. The lines carry no timestamp, so the counts are the pasted log's, not the window's: the
card says so."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r'"(?:GET|POST|PUT|DELETE|PATCH) (?P<path>/\S*) HTTP/[\d.]+" (?P<status>[1-5]\d\d)\b')


@dataclass(frozen=True, slots=True)
class AccessLog:
    """Answers by (route, status) as the log's access lines count them."""

    counts: tuple[tuple[str, int, int], ...]  # (path, status, answers), in first-seen order

    def answers(self, status: int, path_prefix: str = "/v1/") -> int:
        """How many answers of ``status`` the routes under ``path_prefix`` gave."""
        return sum(n for path, code, n in self.counts if code == status and path.startswith(path_prefix))

    def client_errors(self, path_prefix: str = "/v1/") -> dict[int, int]:
        """Every 4xx status the routes under ``path_prefix`` answered, with its count."""
        out: dict[int, int] = {}
        for path, code, n in self.counts:
            if 400 <= code < 500 and path.startswith(path_prefix):
                out[code] = out.get(code, 0) + n
        return out


def parse_access_log(text: str) -> AccessLog | None:
    """The access lines of ``text`` counted (None: the log has none, e.g. --disable-uvicorn-access-log)."""
    counts: dict[tuple[str, int], int] = {}
    for m in _LINE.finditer(text):
        key = (m["path"].split("?", 1)[0], int(m["status"]))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return None
    return AccessLog(tuple((path, code, n) for (path, code), n in counts.items()))
