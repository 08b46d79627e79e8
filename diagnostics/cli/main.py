"""The entry point: parse, run the command, and turn its failure into the documented exit code."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from diagnostics.cli.args import parse
from diagnostics.cli.commands import COMMANDS
from diagnostics.cli.exits import EXIT_UNKNOWN, CliError


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m diagnostics`` (and the ``vllm-triage`` command): the exit code of the command."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve"] and not {"-h", "--help"} & set(words[1:2]):
        # Everything after `serve` belongs to `streamlit run` (argparse cannot pass on --options).
        from diagnostics.ui.serve import serve

        return serve(words[1:])
    diagnosing = words[:1] == ["diagnose"]
    args = parse(words)
    try:
        return int(COMMANDS[args.command](args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN if diagnosing else exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception:
        if not diagnosing:
            raise
        # A bug must not read as a finding: for a monitoring check it is UNKNOWN, with the traceback.
        import traceback

        traceback.print_exc()
        return EXIT_UNKNOWN
