"""``python -m diagnostics``: the CLI (:mod:`diagnostics.cli`)."""

import sys

from diagnostics.cli import main

if __name__ == "__main__":
    sys.exit(main())
