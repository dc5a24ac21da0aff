"""The agent's side of code: blobs over HTTP, the job's layout, repo checkout and `files` with a real
agent process and the host's git, and the failures a user must understand."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from agent_harness import AgentProc

from code_fixtures import UNCOMMITTED, git, remote_and_checkout, tar_of
from corral.agent import workdir
from corral.agent.protocol import FileArchiveRef, JobSubmission, ProtocolError, RepoCheckout

ROOT = "/jobs/j/workdir"


def _sub(**kw: Any) -> JobSubmission:
    return JobSubmission("j", "r", ["true"], **kw)


def _put(agent: AgentProc, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    r = agent.http.put(f"/blobs/{digest}", content=data)
    assert r.status_code == 200, r.text
    return digest


# ---- layout (pure) -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("working_dir", "repo_dir", "expect_repo", "expect_wd"),
    [
        (None, ".", ROOT, ROOT),  # the container's default working dir is the job's directory
        (None, "/workflow", f"{ROOT}/workflow", ROOT),  # dstack's legacy repo dir, inside the job's directory
        ("/w", ".", f"{ROOT}/w", f"{ROOT}/w"),  # repos[].path is relative to an absolute working_dir
        ("/w", "src", f"{ROOT}/w/src", f"{ROOT}/w"),
        ("sub", "code", f"{ROOT}/code", f"{ROOT}/code/sub"),  # a relative working_dir: relative to the repo dir
        (None, "~/repo", f"{ROOT}/root/repo", ROOT),  # ~ is the job spec's home_dir, inside the job's directory
    ],
)
def test_layout(working_dir: str | None, repo_dir: str, expect_repo: str, expect_wd: str) -> None:
    lay = workdir.layout(ROOT, _sub(working_dir=working_dir, repo=RepoCheckout("virtual", repo_dir=repo_dir)))
    assert (lay.repo_dir, lay.working_dir) == (expect_repo, expect_wd)


def test_layout_never_leaves_the_job_directory() -> None:
    with pytest.raises(workdir.SetupError, match="outside the job's directory"):
        workdir.layout(ROOT, _sub(repo=RepoCheckout("virtual", repo_dir="../../elsewhere")))
    with pytest.raises(workdir.SetupError, match="outside"):
        workdir.layout(ROOT, _sub(working_dir="/../../etc"))


def test_protocol_round_trip_and_redaction() -> None:
    repo = RepoCheckout("remote", clone_url="https://h/x.git", oauth_token="tok", private_key="KEY", commit="abc")
    sub = _sub(repo=repo, file_archives=[FileArchiveRef("a" * 64, "data")], home_dir="/home/u")
    assert JobSubmission.from_dict(sub.to_dict()) == sub
    red = sub.redacted().to_dict()
    assert red["repo"]["oauth_token"] is None and red["repo"]["private_key"] is None
    assert red["repo"]["clone_url"] == "https://h/x.git" and sub.repo is not None and sub.repo.oauth_token == "tok"
    with pytest.raises(ProtocolError, match="clone_url"):
        RepoCheckout.from_dict({"repo_type": "remote", "repo_dir": "."})
    with pytest.raises(ProtocolError, match=r"file_archives\[\]\.hash"):
        FileArchiveRef.from_dict({"hash": "xyz", "path": "p"})


# ---- blobs over HTTP --------------------------------------------------------------------------------------


def test_blob_put_get_and_hash_check(agent: AgentProc) -> None:
    data = b"blob contents" * 1000
    digest = hashlib.sha256(data).hexdigest()
    assert agent.http.get(f"/blobs/{digest}").status_code == 404
    bad = agent.http.put(f"/blobs/{'0' * 64}", content=data)
    assert bad.status_code == 400 and "hashes to" in bad.json()["error"]
    assert agent.http.put("/blobs/not-a-hash", content=b"x").status_code == 400
    assert _put(agent, data) == digest
    assert agent.http.get(f"/blobs/{digest}").json() == {"hash": digest, "size": len(data)}
    assert (agent.work_dir / "blobs" / digest).read_bytes() == data
    assert not [p for p in (agent.work_dir / "blobs").iterdir() if p.name.startswith(".incoming")]
    unauthorized = agent.http.put(f"/blobs/{digest}", content=data, headers={"Authorization": "Bearer nope"})
    assert unauthorized.status_code == 403


# ---- jobs with code on a real agent -------------------------------------------------------------------------


def test_remote_repo_diff_and_files(agent: AgentProc, tmp_path: Path) -> None:
    from corral.cli.repo_code import RepoOptions, file_archive, from_dir

    checkout = remote_and_checkout(tmp_path)
    upload = from_dir(checkout.work, RepoOptions())
    code = _put(agent, upload.code)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "settings.toml").write_text("x = 1\n")
    archive = _put(agent, file_archive(tmp_path / "cfg"))
    repo = {
        "repo_type": "remote",
        "repo_dir": "repo",
        "code_hash": code,
        "clone_url": str(checkout.remote),
        "branch": "main",
        "commit": checkout.head,
        "git_user_name": "Job User",
        "git_user_email": "job@example.invalid",
    }
    agent.submit(
        "code-1",
        ["cat repo/second.txt", "cat conf/settings.toml", "git -C repo config user.name", "git -C repo status --short"],
        repo=repo,
        file_archives=[{"hash": archive, "path": "conf"}],
    )
    st = agent.wait_finished("code-1")
    out = agent.output("code-1").decode()
    assert st["state"] == "done", (st, out)
    assert UNCOMMITTED in out and "x = 1" in out and "Job User" in out
    assert " M second.txt" in out and "?? untracked.txt" in out  # the diff applied as the user's uncommitted work
    saved = (agent.job_dir("code-1") / "submission.json").read_text()
    assert str(checkout.remote) in saved


def test_missing_blob_and_unsafe_archives_fail_clearly(agent: AgentProc) -> None:
    missing = "b" * 64
    agent.submit("code-missing", ["echo ran"], repo={"repo_type": "local", "repo_dir": ".", "code_hash": missing})
    st = agent.wait_finished("code-missing")
    assert st["state"] == "failed" and st["termination_reason"] == "setup_failed"
    assert f"blob {missing}) is missing on this host" in st["message"]
    assert agent.output("code-missing") == b""
    evil = _put(agent, tar_of({"../../escape.txt": b"x"}))
    agent.submit("code-evil", ["true"], repo={"repo_type": "local", "repo_dir": ".", "code_hash": evil})
    st = agent.wait_finished("code-evil")
    assert st["state"] == "failed" and "a path outside its directory" in st["message"], st
    link = _put(agent, tar_of({}, links={"data/passwd": "/etc/passwd"}))
    agent.submit("code-link", ["true"], file_archives=[{"hash": link, "path": "data"}])
    st = agent.wait_finished("code-link")
    assert st["state"] == "failed" and "symlink" in st["message"], st


def test_repo_dir_if_exists(tmp_path: Path) -> None:
    blobs = workdir.BlobStore(str(tmp_path))
    data = tar_of({"a.txt": b"from the repo"})
    digest = hashlib.sha256(data).hexdigest()
    blobs.put(digest, io.BytesIO(data), len(data))
    root = tmp_path / "root"
    (root / "code").mkdir(parents=True)
    (root / "code" / "old.txt").write_text("already here")

    def sub(action: str | None) -> JobSubmission:
        return _sub(repo=RepoCheckout("local", repo_dir="code", code_hash=digest, if_exists=action))

    with pytest.raises(workdir.SetupError, match="already exists and is not empty"):
        workdir.prepare(str(root), str(tmp_path), sub("error"), blobs, lambda p: None)
    for action in ("skip", None):  # dstack's runner skips when the spec says nothing
        workdir.prepare(str(root), str(tmp_path), sub(action), blobs, lambda p: None)
        assert sorted(os.listdir(root / "code")) == ["old.txt"]
    (root / "code" / "old.txt").unlink()
    workdir.prepare(str(root), str(tmp_path), sub("error"), blobs, lambda p: None)  # empty: checked out
    assert (root / "code" / "a.txt").read_text() == "from the repo"


def test_git_missing_is_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    sub = _sub(repo=RepoCheckout("remote", clone_url="https://git.example/x.git"))
    with pytest.raises(workdir.SetupError, match="git is not installed on this host"):
        workdir.prepare(str(tmp_path / "root"), str(tmp_path), sub, workdir.BlobStore(str(tmp_path)), lambda p: None)


def test_stop_during_a_slow_clone_kills_git(agent_factory: Any, tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "git-started"
    script = fake / "git"
    script.write_text(f"#!/bin/sh\necho $$ > {marker}\nexec sleep 300\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    agent = agent_factory("slowgit", env={"PATH": f"{fake}:{os.environ['PATH']}"})
    agent.submit("slow", ["echo never"], repo={"repo_type": "remote", "repo_dir": ".", "clone_url": "/x.git"})
    deadline = time.monotonic() + 10
    while not marker.exists():
        assert time.monotonic() < deadline, "the fake git never started"
        time.sleep(0.02)
    pid = int(marker.read_text())
    started = time.monotonic()
    assert agent.http.post("/jobs/slow/stop", json={"abort": False}).status_code == 200
    st = agent.wait_finished("slow")
    assert st["state"] == "terminated" and st["termination_reason"] == "stopped", st
    assert time.monotonic() - started < 5
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert agent.output("slow") == b""


def test_checkout_of_a_branch_head_without_commit(agent: AgentProc, tmp_path: Path) -> None:
    checkout = remote_and_checkout(tmp_path)
    git(checkout.work, "checkout", "-q", "-b", "feature")
    (checkout.work / "feature.txt").write_text("feature\n")
    git(checkout.work, "add", "feature.txt")
    git(checkout.work, "commit", "-q", "-m", "feature")
    git(checkout.work, "push", "-q", "origin", "feature")
    repo = {"repo_type": "remote", "repo_dir": ".", "clone_url": str(checkout.remote), "branch": "feature"}
    agent.submit("branch-head", ["cat feature.txt", "git rev-parse --abbrev-ref HEAD"], repo=repo)
    st = agent.wait_finished("branch-head")
    assert st["state"] == "done" and agent.output("branch-head") == b"feature\nfeature\n", st


def test_clone_credentials_travel_in_the_environment_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The OAuth token goes to git as an extra HTTP header through env config (after any the host sets),
    the SSH key as a private file for GIT_SSH_COMMAND that is gone afterwards; neither is in git's argv."""
    log = tmp_path / "log"
    log.mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    script = fake / "git"
    script.write_text(
        "#!/bin/sh\n"
        f'LOG={log}; n=$(ls "$LOG" | wc -l)\n'
        'printf "%s\\n" "$@" > "$LOG/args.$n"; env | grep "^GIT_" > "$LOG/env.$n"\n'
        'key=$(echo "$GIT_SSH_COMMAND" | sed -n "s/.*-i \'\\([^\']*\\)\'.*/\\1/p")\n'
        '[ -n "$key" ] && cp "$key" "$LOG/key"\n'
        'if [ "$1" = clone ]; then for a in "$@"; do last="$a"; done; mkdir -p "$last"; fi\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "url./srv/x.git.insteadOf")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "https://git.example/x.git")
    repo = RepoCheckout(
        "remote", clone_url="https://git.example/x.git", branch="main", oauth_token="tok-123", private_key="KEYDATA"
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    workdir.prepare(
        str(tmp_path / "root"), str(scratch), _sub(repo=repo), workdir.BlobStore(str(tmp_path)), lambda p: None
    )
    args = (log / "args.0").read_text()
    env = dict(line.split("=", 1) for line in (log / "env.0").read_text().splitlines())
    assert "tok-123" not in args and args.splitlines()[:4] == ["clone", "--quiet", "--branch", "main"]
    assert env["GIT_CONFIG_COUNT"] == "2" and env["GIT_CONFIG_KEY_0"] == "url./srv/x.git.insteadOf"
    assert env["GIT_CONFIG_KEY_1"] == "http.extraHeader"
    basic = base64.b64encode(b"anything:tok-123").decode()
    assert env["GIT_CONFIG_VALUE_1"] == f"Authorization: Basic {basic}"
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert (log / "key").read_text() == "KEYDATA\n" and not list(scratch.iterdir())
