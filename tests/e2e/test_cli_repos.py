"""`corral apply` with code, as a user: a ``corral server`` process, a git working copy whose remote is a
bare repository on disk (reached by path), ``repos: [.]`` and ``files:``; ``--no-repo``; a directory that
is not a git repo (a local repo: its files travel as an archive)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dstack_client_env import CorralServer, corral_server

from code_fixtures import COMMITTED, UNCOMMITTED, UNTRACKED, remote_and_checkout

TOKEN = "cli-repos-token"
RESOURCES = "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}\n"


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-repos")


@pytest.fixture(scope="module")
def server(tmp: Path) -> Iterator[CorralServer]:
    with corral_server(tmp, TOKEN) as s:
        yield s


def corral(tmp: Path, cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_CONFIG_DIR=str(tmp / "corral-config"), COLUMNS="200")
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in out.stderr, out.stderr
    if check:
        assert out.returncode == 0, f"corral {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def fleet(server: CorralServer, tmp: Path) -> str:
    (tmp / "fleet.dstack.yml").write_text(f"type: fleet\nname: cli-repos-fleet\nnodes: 0..1\n{RESOURCES}")
    corral(tmp, tmp, "apply", "-f", "fleet.dstack.yml", "-y")
    return "cli-repos-fleet"


TASK = """type: task
name: {name}
repos:
  - .
files:
  - ../inputs:inputs
  - ../single.txt:/etc/single.txt
commands:
  - cat committed.txt second.txt untracked.txt || echo NO-REPO
  - cat inputs/x.txt /etc/single.txt
  - echo "id=$DSTACK_REPO_ID"
{resources}"""


def test_apply_in_a_git_working_copy(fleet: str, tmp: Path) -> None:
    checkout = remote_and_checkout(tmp)
    (tmp / "inputs").mkdir()
    (tmp / "inputs" / "x.txt").write_text("input x\n")
    (tmp / "single.txt").write_text("single file\n")
    (checkout.work / ".dstack.yml").write_text(TASK.format(name="cli-repo", resources=RESOURCES))
    out = corral(tmp, checkout.work, "apply", "-y").stdout  # follows the logs to the end
    for text in (COMMITTED, UNCOMMITTED, UNTRACKED, "input x", "single file"):
        assert text in out, out
    assert "NO-REPO" not in out and "id=project-" in out, out

    # --no-repo: the same configuration without the repo (the files still travel).
    (checkout.work / "norepo.dstack.yml").write_text(TASK.format(name="cli-norepo", resources=RESOURCES))
    out = corral(tmp, checkout.work, "apply", "-f", "norepo.dstack.yml", "-y", "--no-repo").stdout
    assert "NO-REPO" in out and "input x" in out and "id=none" in out, out


def test_repo_by_url_clones_the_branch_head(fleet: str, tmp: Path) -> None:
    remote = tmp / "project.git"  # pushed by the previous test
    d = tmp / "by-url"
    d.mkdir()
    (d / ".dstack.yml").write_text(
        f"type: task\nname: cli-url\nrepos:\n  - url: file://{remote}\n    branch: main\n    path: code\n"
        "commands:\n  - cat code/committed.txt code/second.txt\n  - test ! -e code/untracked.txt && echo clean\n"
        + RESOURCES
    )
    out = corral(tmp, d, "apply", "-y").stdout
    assert COMMITTED in out and "second" in out and "clean" in out and UNCOMMITTED not in out, out


def test_apply_in_a_plain_directory_sends_it_as_an_archive(fleet: str, tmp: Path) -> None:
    plain = tmp / "plain-project"
    plain.mkdir()
    (plain / "script.sh").write_text("echo from-script\n")
    (plain / "big.bin").write_text("x")
    (plain / ".dstackignore").write_text("*.bin\n")
    (plain / ".dstack.yml").write_text(
        "type: task\nname: cli-local\nrepos: [.]\ncommands:\n  - sh script.sh\n  - test ! -e big.bin && echo no-bin\n"
        + RESOURCES
    )
    out = corral(tmp, plain, "apply", "-y").stdout
    assert "from-script" in out and "no-bin" in out, out


def test_oversize_code_is_refused_with_the_servers_words(fleet: str, tmp: Path) -> None:
    big = tmp / "big-project"
    big.mkdir()
    (big / "blob.dat").write_bytes(os.urandom(3 * 2**20))  # over the default 2 MiB limit
    (big / ".dstack.yml").write_text("type: task\nname: cli-big\nrepos: [.]\ncommands: [ls]\n" + RESOURCES)
    out = corral(tmp, big, "apply", "-y", check=False)
    assert out.returncode == 1, out.stdout
    text = out.stdout + out.stderr
    assert "exceeds the server's limit of 2.0MiB" in text and "CORRAL_SERVER_CODE_UPLOAD_LIMIT" in text, text
