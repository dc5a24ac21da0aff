"""``${{ ns.name }}`` references read as dstack 0.22.5's ``VariablesInterpolator`` reads them (compared with
dstack's own on the same inputs), and corral's ``keep`` for references resolved later."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.domain.interpolation import (
    InterpolationError,
    interpolate,
    references,
    secret_names,
    valid_groups_ref,
    valid_name,
)

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


#: What dstack's CLI does to ``commands`` (``run.args`` resolved; ``secrets`` and ``groups`` refs left).
COMMANDS = [
    "python train.py ${{ run.args }}",
    "echo ${{secrets.token}} ${{ run.args }}",
    "ping ${{ groups[0].nodes[1].IP_ADDRESS }}",
    "ping ${{ groups[0].bad }}",
    "echo $$HOME $HOME",
    "echo ${{ run.nope }}",
    "echo ${{ unknown.x }}",
]
RUN_ARGS = "--lr '0.1 0.2'"

_SCRIPT = r"""
import json, sys
from dstack._internal.utils.interpolator import VariablesInterpolator
from dstack._internal.utils.nodes_interpolator import is_valid_groups_ip_ref as is_valid_groups_ref
ns, cases, commands, args = json.load(sys.stdin)
def run(interpolator, texts):
    out = []
    for text in texts:
        try:
            out.append(interpolator.interpolate_or_error(text))
        except ValueError as e:
            out.append(["error", str(e)])
    return out
skip = {"secrets": VariablesInterpolator.validate_name, "groups": is_valid_groups_ref}
on_commands = VariablesInterpolator({"run": {"args": args}}, skip=skip)
json.dump([run(VariablesInterpolator(ns), cases), run(on_commands, commands)], sys.stdout)
"""


def test_resolves_and_fails_as_dstack_does() -> None:
    try:
        python = client_venv() / "bin" / "python"
    except ClientInstallError as e:
        pytest.fail(f"could not install dstack=={DSTACK_VERSION} to compare with:\n{e}", pytrace=False)
    stdin = json.dumps([NS, CASES, COMMANDS, RUN_ARGS])
    proc = subprocess.run([str(python), "-c", _SCRIPT], input=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    theirs_values, theirs_commands = json.loads(proc.stdout)

    def ours(texts: list[str], **kw: Any) -> list[object]:
        out: list[object] = []
        for text in texts:
            try:
                out.append(interpolate(text, **kw))
            except InterpolationError as e:
                out.append(["error", str(e)])
        return out

    assert ours(CASES, namespaces=NS) == theirs_values
    keep = {"secrets": valid_name, "groups": valid_groups_ref}
    assert ours(COMMANDS, namespaces={"run": {"args": RUN_ARGS}}, keep=keep, again=False) == theirs_commands


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
