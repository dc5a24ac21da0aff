"""The official dstack 0.22.5 CLI, unchanged, sending code to a ``corral server`` subprocess.

Inside a git working copy (a pushed commit, an uncommitted change, an untracked file) with ``repos: [.]``
and ``files:``, and inside a plain directory with ``files:`` only: the job must see the working tree with
the uncommitted change, and the listed files.

The "remote" is a bare repository on disk. dstack's CLI only accepts https/ssh/scp-style remote URLs (it
parses them to name the repo, and refuses a path), so the working copy's ``origin`` is an https URL that
git rewrites to the bare repository's path (``url.<path>.insteadOf``, given through git's environment
configuration, which dstack's credential check does not switch off). The server and its agents get the
same rewrite, so the agent's clone reaches the repository by path too.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dstack_client_env import CorralServer, DstackCli, corral_server

from code_fixtures import COMMITTED, UNCOMMITTED, UNTRACKED, git, remote_and_checkout
from corral.cli.repo_code import RepoOptions, file_archive, from_dir

TOKEN = "e2e-repos-token-0123456789"
URL = "https://git.corral.test/team/project.git"
RESOURCES = "resources:\n  cpu: 1..\n  memory: 0.1GB..\n  disk: 1GB..\n"
FINISHED = ("done", "failed", "terminated")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dstack-repos")


@pytest.fixture(scope="module")
def git_env(tmp: Path) -> dict[str, str]:
    remote = tmp / "project.git"
    return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.{remote}.insteadOf", "GIT_CONFIG_VALUE_0": URL}


@pytest.fixture(scope="module")
def server(tmp: Path, git_env: dict[str, str]) -> Iterator[CorralServer]:
    with corral_server(tmp, TOKEN, **git_env) as s:
        yield s


@pytest.fixture(scope="module")
def plain(dstack_venv: Path, server: CorralServer, tmp: Path, git_env: dict[str, str]) -> DstackCli:
    """The CLI in a plain directory (not a git repo); it adds the project and applies a fleet."""
    home, workdir = tmp / "home", tmp / "plain"
    home.mkdir()
    workdir.mkdir()
    cli = DstackCli(dstack_venv, home, workdir, server, env=git_env)
    cli.ok("project", "add", "--name", "main", "--url", server.url, "--token", TOKEN, "-y")
    cli.write("fleet.dstack.yml", f"type: fleet\nname: repos-fleet\nnodes: 0..1\n{RESOURCES}")
    cli.ok("apply", "-f", "fleet.dstack.yml", "-y")
    return cli


def _finished(cli: DstackCli, name: str, timeout: float = 90) -> dict[str, Any]:
    """Wait on the server's API (cheaper than a CLI call a poll), then read the run through the CLI."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = cli.server.api("/api/project/main/runs/get", {"run_name": name}).json()
        if run.get("status") in FINISHED:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"run {name} did not finish\n{cli.server.log_tail()}")
    runs = {r["run_spec"]["run_name"]: r for r in json.loads(cli.ok("ps", "-a", "--json").stdout)["runs"]}
    return dict(runs[name])


def test_git_working_copy_with_uncommitted_change_and_files(plain: DstackCli, tmp: Path) -> None:
    checkout = remote_and_checkout(tmp)
    git(checkout.work, "remote", "set-url", "origin", URL)
    shared = tmp / "table-inputs"
    shared.mkdir()
    (shared / "table.csv").write_text("a,b\n1,2\n")
    cli = DstackCli(plain.venv, plain.home, checkout.work, plain.server, env=plain.env)
    cli.write(
        ".dstack.yml",
        "type: task\nname: repo-task\nrepos:\n  - .\nfiles:\n  - ../table-inputs:inputs\ncommands:\n"
        "  - cat committed.txt second.txt untracked.txt\n"
        "  - cat inputs/table.csv\n"
        "  - git rev-parse HEAD\n"
        '  - echo "repo_id=$DSTACK_REPO_ID"\n'
        f"{RESOURCES}",
    )
    res = cli.ok("apply", "-y", "-d")
    assert "Run repo-task submitted, detaching" in res.output, cli.explain(res)
    run = _finished(cli, "repo-task")
    sub = run["latest_job_submission"]
    assert run["status"] == "done", (sub, cli.server.log_tail())
    assert run["run_spec"]["repo_data"]["repo_type"] == "remote"
    assert run["run_spec"]["repo_data"]["repo_hash"] == checkout.head
    assert run["run_spec"]["repo_code_hash"] and run["run_spec"]["file_archives"]
    # corral's CLI computes the same repo id, diff and archive as dstack's (so the server stores them once).
    ours = from_dir(checkout.work, RepoOptions())
    assert (ours.repo_id, ours.code_hash) == (run["run_spec"]["repo_id"], run["run_spec"]["repo_code_hash"])
    digest = hashlib.sha256(file_archive(shared)).hexdigest()
    found = plain.server.api("/api/files/get_archive_by_hash", {"hash": digest}).json()
    assert [found["id"]] == [a["id"] for a in run["run_spec"]["file_archives"]], found
    out = cli.ok("logs", "repo-task").stdout
    for text in (COMMITTED, UNCOMMITTED, UNTRACKED, "a,b", checkout.head, f"repo_id={run['run_spec']['repo_id']}"):
        assert text in out, cli.explain(cli.calls[-1])
    # The repo is known to the server with the user's credentials (as dstack's CLI expects on the next apply).
    repos = plain.server.api("/api/project/main/repos/list", {}).json()
    assert [r["repo_info"] for r in repos if r["repo_id"] == run["run_spec"]["repo_id"]] == [
        {"repo_type": "remote", "repo_name": "project"}
    ]
    # Applying again: the CLI finds the repo initialised with this user's credentials (repos/get) and reuses them.
    res = cli.ok("apply", "-y", "-d", "-n", "repo-task-2")
    assert _finished(cli, "repo-task-2")["status"] == "done", cli.explain(res)


def test_plain_directory_with_files(plain: DstackCli) -> None:
    plain.write("notes.txt", "plain notes\n")
    plain.write(
        "files.dstack.yml",
        f"type: task\nname: files-task\nfiles:\n  - notes.txt\ncommands:\n  - cat notes.txt\n{RESOURCES}",
    )
    res = plain.ok("apply", "-f", "files.dstack.yml", "-y", "-d")
    assert "Run files-task submitted" in res.output, plain.explain(res)
    run = _finished(plain, "files-task")
    assert run["status"] == "done", run["latest_job_submission"]
    assert run["run_spec"]["repo_id"] == "none"
    assert "plain notes" in plain.ok("logs", "files-task").stdout


def test_server_log_has_no_errors(plain: DstackCli) -> None:
    log = plain.server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "ERROR" not in log, plain.server.log_tail(200)
