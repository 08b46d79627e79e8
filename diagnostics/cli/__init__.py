"""The headless CLI, ``python -m diagnostics`` (the same core as the app): :mod:`.args` the parser,
its ``--help`` text with the exit codes, and the checks argparse cannot express; :mod:`.window`
getting a window of history (a recording, N seconds of a server, or a range from Prometheus);
:mod:`.commands` one function per command; :mod:`.render` the text a person reads; :mod:`.main`
the entry point, turning a command's failure into its exit code."""

from diagnostics.cli.main import main

__all__ = ["main"]
