"""``diagnostics/ui`` imports run one way: state ← targets ← resources ← the widgets (page shell,
cards, charts and each page's pieces) ← pages. Read from the source (imports under
``TYPE_CHECKING`` count: that is where the last cycle hid), so no Streamlit runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

UI = Path(__file__).resolve().parents[2] / "diagnostics" / "ui"

# A module may import ui modules of a lower layer, or of its own layer when that makes no cycle.
LAYERS = {
    "state": 0,  # session-state keys: imports no other ui module
    "targets": 1,  # the target model
    "resources": 2,  # cached collectors, clients, recordings
    "shell": 3,
    "cards": 3,
    "charts": 3,
    "findings": 3,
    "fleet_view": 3,
    "probe_view": 3,
    "serve": 3,  # `python -m diagnostics serve`: the flight recorders, then Streamlit
}


def ui_imports(source: str) -> set[str]:
    """The ``diagnostics.ui`` modules a module's source imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["diagnostics", "ui"] and len(parts) > 2:
                found.add(parts[2])
    return found


def graph() -> dict[str, set[str]]:
    modules = {p.stem for p in UI.glob("*.py") if p.stem != "__init__"}
    return {m: ui_imports((UI / f"{m}.py").read_text(encoding="utf-8")) & modules for m in modules}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(edges):
        found = visit(start, [])
        if found:
            return found
    return None


def test_every_ui_module_has_a_layer() -> None:
    assert set(graph()) == set(LAYERS)


def test_no_ui_module_imports_upward() -> None:
    upward = [(m, dep) for m, deps in graph().items() for dep in deps if LAYERS[dep] > LAYERS[m]]
    assert upward == []


def test_state_imports_no_other_ui_module() -> None:
    assert graph()["state"] == set()


def test_the_ui_imports_have_no_cycle() -> None:
    assert cycle(graph()) is None


@pytest.mark.parametrize(("source", "imported"), [
    ("from diagnostics.ui import resources, state\n", {"resources", "state"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from diagnostics.ui.shell import page\n", {"shell"}),
    ("def f():\n    import diagnostics.ui.cards\n", {"cards"}),
    ("from diagnostics.core import figures\nimport streamlit\n", set()),
])
def test_imports_are_read_wherever_they_are(source: str, imported: set[str]) -> None:
    assert ui_imports(source) == imported


def test_a_cycle_is_found() -> None:
    assert cycle({"resources": {"shell"}, "shell": {"cards"}, "cards": {"resources"}}) == [
        "cards", "resources", "shell", "cards"]
    assert cycle({"shell": {"cards", "resources"}, "cards": {"resources"}, "resources": set()}) is None
