"""What `corral apply` sends of the user's code: repo ids as dstack's, the diff, archives, ignore rules, and
the order of the API calls (against the fake client)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_fakes import FakeClient, Result, make_run
from test_commands import run_plan

from code_fixtures import git, remote_and_checkout
from corral.cli.errors import CLIError
from corral.cli.ignore import parse_rule, walk
from corral.cli.repo_code import RepoOptions, file_archive, for_run, from_dir, repo_location, slugify

CLI = Callable[..., Result]


@pytest.mark.parametrize(
    ("url", "repo_id"),
    [  # computed with dstack 0.22.5's RemoteRepo.from_url(url).repo_id
        ("https://github.com/dstackai/dstack-examples", "dstack-examples-2aut8wsk"),
        ("https://github.com/dstackai/dstack.git", "dstack-nizdmsg0"),
        ("git@github.com:dstackai/dstack.git", "dstack-nizdmsg0"),
        ("ssh://git@gitlab.example.com:2222/team/sub/proj.git", "proj-bzvr56yl"),
        ("https://git.corral.test/team/project.git", "project-m01fksgb"),
    ],
)
def test_repo_ids_are_dstacks(url: str, repo_id: str) -> None:
    assert slugify(*repo_location(url)) == repo_id


@pytest.mark.parametrize(
    ("pattern", "base", "path", "is_dir", "matches"),
    [
        ("*.log", "", "a/b.log", False, True),
        ("/build", "", "build", True, True),
        ("/build", "", "x/build", True, False),
        ("build/", "", "build", False, False),
        ("build/", "", "a/build", True, True),
        ("doc/**/*.md", "", "doc/a/b/c.md", False, True),
        ("doc/**/*.md", "", "doc/c.md", False, True),
        ("a/**", "", "a/x/y", False, True),
        ("*.py", "sub", "sub/x/a.py", False, True),
        ("*.py", "sub", "other/a.py", False, False),
        ("[ab].txt", "", "b.txt", False, True),
        ("[!ab].txt", "", "b.txt", False, False),
        ("\\#hash", "", "#hash", False, True),
    ],
)
def test_gitignore_patterns(pattern: str, base: str, path: str, is_dir: bool, matches: bool) -> None:
    rule = parse_rule(pattern, base)
    assert rule is not None and rule.matches(path, is_dir) is matches


def test_walk_honours_ignore_files_and_skips_git(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    for rel in (
        "keep.py",
        "x.log",
        "important.log",
        "venv/lib.py",
        ".git/HEAD",
        "sub/a.tmp",
        "sub/b.txt",
        "sub/.hidden",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text("*.log\n!important.log\nvenv/\n")
    (root / "sub" / ".dstackignore").write_text("*.tmp\n")
    names = [p.relative_to(root).as_posix() for p in walk(root)]
    assert names == [
        ".",
        ".gitignore",
        "important.log",
        "keep.py",
        "sub",
        "sub/.dstackignore",
        "sub/.hidden",
        "sub/b.txt",
    ]


def test_file_archive_names_and_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "nested").mkdir(parents=True)
    (root / "nested" / "f.txt").write_text("f")
    (tmp_path / "outside.txt").write_text("outside")
    os.symlink(root / "nested" / "f.txt", root / "inside-link")
    os.symlink(tmp_path / "outside.txt", root / "outside-link")
    with tarfile.open(fileobj=io.BytesIO(file_archive(root))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["data", "data/inside-link", "data/nested", "data/nested/f.txt", "data/outside-link"]
        assert members["data/inside-link"].issym() and members["data/inside-link"].linkname == "nested/f.txt"
        outside = tar.extractfile(members["data/outside-link"])
        assert outside is not None and outside.read() == b"outside"  # a link out of the archive becomes the file
    assert file_archive(root) == file_archive(root)  # reproducible: the same content, the same hash


def test_repo_of_a_run(tmp_path: Path) -> None:
    checkout = remote_and_checkout(tmp_path)
    assert for_run({}, tmp_path, RepoOptions()).repo_id == "none"
    raw = {"repos": ["."]}
    assert for_run(raw, tmp_path, RepoOptions(no_repo=True)).repo_id == "none" and "repos" not in raw
    with pytest.raises(CLIError, match="Either --repo or --no-repo"):
        for_run({}, tmp_path, RepoOptions(repo=".", no_repo=True))
    up = for_run({"repos": [{"local_path": "project", "path": "src"}]}, tmp_path, RepoOptions())
    assert up.repo_data["repo_hash"] == checkout.head and up.repo_data["repo_branch"] == "main"
    assert up.repo_creds == {"clone_url": str(checkout.remote), "private_key": None, "oauth_token": None}
    assert up.code_hash == hashlib.sha256(up.code).hexdigest() and b"untracked.txt" in up.code
    assert b"noise.log" not in up.code  # ignored files stay home
    by_url = for_run(
        {"repos": [{"url": "https://github.com/dstackai/dstack.git", "branch": "master", "hash": "abc"}]},
        tmp_path,
        RepoOptions(oauth_token="tok"),
    )
    assert by_url.repo_id == "dstack-nizdmsg0" and by_url.code_hash is None
    assert by_url.repo_data["repo_branch"] == "master" and by_url.repo_data["repo_hash"] == "abc"
    assert by_url.repo_creds is not None and by_url.repo_creds["oauth_token"] == "tok"
    with pytest.raises(CLIError, match="Invalid repo path"):
        for_run({"repos": ["missing"]}, tmp_path, RepoOptions())


def test_checkouts_without_a_remote_branch(tmp_path: Path) -> None:
    checkout = remote_and_checkout(tmp_path)
    git(checkout.work, "checkout", "-q", "--detach")
    with pytest.raises(CLIError, match="detached HEAD"):
        from_dir(checkout.work, RepoOptions())
    git(checkout.work, "checkout", "-q", "-b", "local-only")  # no upstream: the files travel as an archive
    local = from_dir(checkout.work, RepoOptions())
    assert local.repo_info == {"repo_type": "local", "repo_dir": str(checkout.work)}
    with tarfile.open(fileobj=io.BytesIO(local.code)) as tar:
        names = tar.getnames()
    assert "untracked.txt" in names and "noise.log" not in names and not [n for n in names if n.startswith(".git/")]


def test_apply_sends_repo_files_and_code_in_dstacks_order(fake: FakeClient, cli: CLI, env: Path) -> None:
    checkout = remote_and_checkout(env)
    (env / "inputs").mkdir()
    (env / "inputs" / "a.txt").write_text("a")
    (checkout.work / "task.yml").write_text(
        "type: task\nname: hello\nrepos: [.]\nfiles: ['../inputs:data']\ncommands: [ls]\n"
    )
    os.chdir(checkout.work)
    fake.run_plan = run_plan()
    fake.runs["hello"] = [make_run("hello", "submitted")]
    result = cli("apply", "-f", "task.yml", "-y", "-d")
    assert result.code == 0, result.err
    assert fake.names() == [
        "repos_init",
        "files_get_archive_by_hash",
        "files_upload_archive",
        "runs_get_plan",
        "fleets_list",
        "repos_upload_code",
        "runs_apply",
    ]
    run_spec = fake.calls[3][1][1]
    assert run_spec["repo_data"]["repo_hash"] == checkout.head and run_spec["repo_dir"] == "."
    assert run_spec["file_archives"] == [{"id": "archive-1", "path": "data"}]
    assert run_spec["configuration"]["files"] == [{"local_path": str(env / "inputs"), "path": "data"}]
    _, (_, repo_id, code_hash, code), _ = fake.calls[5]
    assert (
        repo_id == run_spec["repo_id"] and code_hash == run_spec["repo_code_hash"] == hashlib.sha256(code).hexdigest()
    )
    # The same files again: found by hash, not uploaded twice.
    fake.calls.clear()
    assert cli("apply", "-f", "task.yml", "-y", "-d").code == 0
    assert "files_upload_archive" not in fake.names() and "files_get_archive_by_hash" in fake.names()
