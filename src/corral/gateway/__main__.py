"""``python -m corral.gateway`` (and the zipapp's entry point): see :mod:`corral.gateway.cli`."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
