"""Serve GeoPilot: `python serve.py --model DIR [...]` is `geopilot serve --model DIR [...]` (docs/serving.md).

Exit codes: 0 stopped cleanly, 2 bad input or usage (one line on stderr), 1 anything else.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from geopilot.cli import main as geopilot_main

    return geopilot_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
