"""``python -m corral.agent serve --work-dir DIR --token-file FILE``: see :mod:`corral.agent.cli`."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
