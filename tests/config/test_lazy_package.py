"""``corral.config`` loads lazily: every public name resolves, from the module the table says, and
importing the package builds no model."""

from __future__ import annotations

import subprocess
import sys

import corral.config as config


def test_every_public_name_resolves_from_its_module() -> None:
    assert set(config.__all__) == set(config._WHERE)
    for name, module in config._WHERE.items():
        value = getattr(config, name)
        assert getattr(sys.modules[f"corral.config.{module}"], name) is value


def test_importing_the_package_loads_no_model() -> None:
    code = "import sys, corral.config; print(sorted(m for m in sys.modules if m.startswith('corral.config.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
