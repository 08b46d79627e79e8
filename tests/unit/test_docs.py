"""The README and docs/ say what is true: the CLI's subcommands are the ones they list, every page
of the tour has its picture and every local link resolves (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path

from diagnostics.cli.args import DESCRIPTION, build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(action.choices)  # type: ignore[attr-defined]


def test_the_parser_has_the_subcommands_a_reader_is_told_of() -> None:
    """Each place that lists the subcommands lists exactly the parser's: ``--help``'s first line, the
    README's pointer to the CLI reference, and the reference's own examples (one or more each)."""
    commands = _subcommands()
    assert len(commands) >= 9, commands
    listed_in_help = set(re.search(r"python -m diagnostics ([a-z|-]+)", DESCRIPTION).group(1).split("|"))  # type: ignore[union-attr]
    assert listed_in_help == commands
    listed_in_readme = set(re.search(r"`python -m diagnostics ([a-z|-]+)`", README).group(1).split("|"))  # type: ignore[union-attr]
    assert listed_in_readme == commands
    reference = (ROOT / "docs" / "cli.md").read_text()
    assert set(re.findall(r"^python -m diagnostics ([a-z-]+)", reference, flags=re.M)) == commands


def test_the_first_screen_holds_the_picture_and_both_commands() -> None:
    first = "\n".join(README.splitlines()[:40])
    assert "./scripts/run.sh" in first and "./scripts/test.sh" in first and "VLLM_URL=" in first
    assert re.search(r"!\[[^\]]+\]\(docs/screenshots/[\w-]+\.png\)", first)


def test_every_local_link_and_image_resolves_and_every_image_is_small() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        targets = re.findall(r"\]\(([^)#\s]+)\)", text) + re.findall(r'<img src="([^"]+)"', text)
        for target in targets:
            if "://" in target:
                continue
            path = (doc.parent / target).resolve()
            assert path.exists(), f"{doc.name} links to {target}, which does not exist"
            if path.suffix == ".png":
                assert path.stat().st_size <= 300 * 1024, f"{target} is over 300 KB"


def test_the_tour_has_a_picture_of_every_page() -> None:
    pages = ["overview", "live", "diagnose", "pagedattention", "capacity", "fleet", "probe"]
    for page in pages:
        assert f"docs/screenshots/tour-{page}.png" in README, page
    assert len(list((ROOT / "pages").glob("*.py"))) == 7  # Live, Replay, Diagnose, PagedAttention, Capacity, Fleet, Probe
