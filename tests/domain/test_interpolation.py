"""``${{ ns.name }}`` references read as dstack 0.22.5's ``VariablesInterpolator`` reads them (compared with
dstack's own on the same inputs), and corral's ``keep`` for references resolved later."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corral.domain.interpolation import InterpolationError, interpolate, references, secret_names, valid_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from dstack_client_env import DSTACK_VERSION, ClientInstallError, client_venv

NS = {"secrets": {"token": "s3cr3t", "A_1": "x$y"}, "env": {"USER": "puller"}}

CASES = [
    "plain",
    "${{ secrets.token }}",
    "${{secrets.token}}",
    "Bearer ${{ secrets.token }} and ${{ env.USER }}",
    "$${{ secrets.token }}",
    "a$$b",
    "trailing $",
    "${{ secrets.A_1 }}",
    "${{ secrets.missing }}",
    "${{ secrets.my-token }}",
    "${{ nodot }}",
    "${{ a.b.c }}",
    "${{ secrets.1x }}",
    "${{ secrets.token",
    "${{ other.x }} ${{ secrets.nope }}",
]


_SCRIPT = r"""
import json, sys
from dstack._internal.utils.interpolator import VariablesInterpolator
ns, cases = json.load(sys.stdin)
out = []
for text in cases:
    try:
        out.append(VariablesInterpolator(ns).interpolate_or_error(text))
    except ValueError as e:
        out.append(["error", str(e)])
json.dump(out, sys.stdout)
"""


def test_resolves_and_fails_as_dstack_does() -> None:
    try:
        python = client_venv() / "bin" / "python"
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION} to compare with:\n{e}", pytrace=False)
    proc = subprocess.run(
        [str(python), "-c", _SCRIPT], input=json.dumps([NS, CASES]), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout)
    ours: list[object] = []
    for text in CASES:
        try:
            ours.append(interpolate(text, NS))
        except InterpolationError as e:
            ours.append(["error", str(e)])
    assert ours == theirs


def test_names_and_references() -> None:
    assert valid_name("secrets.HF_TOKEN") and valid_name("env._x9") and not valid_name("env._x.y")
    assert not valid_name("secrets.my-token") and not valid_name("secrets") and not valid_name(".x")
    assert references("a ${{ secrets.a }} $${{ secrets.b }} ${{env.C}}") == ["secrets.a", "env.C"]
    assert secret_names(["${{ secrets.b }}${{ secrets.a }}", "${{ secrets.b }} ${{ env.X }}"]) == ["b", "a"]
    with pytest.raises(InterpolationError, match=r"Illegal reference name: secrets\.my-token"):
        references("${{ secrets.my-token }}")


def test_kept_references_survive_for_a_later_pass() -> None:
    once = interpolate("${{ env.USER }}:${{ secrets.token }} $$5", NS, keep=("secrets",))
    assert once == "puller:${{ secrets.token }} $$5"
    assert interpolate(once, NS) == "puller:s3cr3t $5"
    with pytest.raises(InterpolationError, match=r"missing vars: \['env.NOPE'\]"):
        interpolate("${{ env.NOPE }} ${{ secrets.x }}", NS, keep=("secrets",))
