"""Which real incidents the what-if's baseline reproduces: every corpus recording (and held-out one)
of the four classes with a modelled flag change, diagnosed, replayed under its unchanged flags and
checked on its finding's aimed metric (``diagnostics/core/whatif/gate.py``: within ±50 % or the
histogram floor). Prints a table; asserts nothing.

    .venv/bin/python bench/whatif_baseline.py [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diagnostics.core import whatif  # noqa: E402
from diagnostics.core.diagnosis import Budgets, diagnose, prepare  # noqa: E402
from diagnostics.recording import read_recording  # noqa: E402

INCIDENTS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "incidents"
CLASSES = ("head_of_line", "queue_at_cap", "kv_pressure", "slow_decode")


def cases() -> list[tuple[str, Path, dict[str, float]]]:
    out = []
    for folder, prefix in ((INCIDENTS, ""), (INCIDENTS / "heldout", "heldout/")):
        for name, label in json.loads((folder / "labels.json").read_text()).items():
            if label.get("class") in CLASSES:
                out.append((prefix + name, folder / label.get("file", f"{name}.jsonl.gz"), label.get("budgets") or {}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--markdown", action="store_true")
    parser.parse_args()
    rows = []
    for name, path, budgets in cases():
        scrapes = read_recording(path).scrapes()
        ctx = prepare(scrapes, budgets=Budgets(itl_ms=budgets.get("itl_ms"), ttft_ms=budgets.get("ttft_ms")))
        findings = [f for f in diagnose(ctx) if f.severity != "info"]
        top = findings[0].id if findings else "—"
        aimed = whatif.aimed_for([f.id for f in findings])
        start = time.perf_counter()
        try:
            checks = whatif.baseline(scrapes, ctx.flags).checks(aimed)
        except ValueError as exc:
            rows.append((name, top, "—", "—", "—", "—", f"no baseline: {exc}", 0.0))
            continue
        took = time.perf_counter() - start
        for c in checks:
            err = c.error
            rows.append((name, top, whatif.LABELS[c.metric], "—" if c.replayed is None else whatif.fmt_value(c.metric, c.replayed),
                         "—" if c.recorded is None else whatif.fmt_value(c.metric, c.recorded),
                         "—" if err is None else f"{err * 100:+.0f} %", "yes" if c.reproduces else "NO", took))
    print("| recording | top finding | aimed metric | replayed | recorded | error | reproduces | baseline s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r[:-1]) + f" | {r[-1]:.2f} |")
    ok = sum(1 for r in rows if r[6] == "yes")
    print(f"\nreproduced within the stated error (±{whatif.REPRODUCTION.max_relative_error * 100:.0f} %): {ok}/{len(rows)}")


if __name__ == "__main__":
    main()
