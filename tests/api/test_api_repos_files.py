"""Repos, code upload and `files` over HTTP, and runs that use them on the local backend's real agent.

A bare git repository on disk is the "remote"; a working copy has a pushed commit, an uncommitted change
and an untracked file. The diff and archives are made as dstack's CLI makes them (corral's CLI code).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from code_fixtures import COMMITTED, UNCOMMITTED, UNTRACKED, remote_and_checkout, tar_of
from corral.cli.repo_code import RepoOptions, file_archive, from_dir, local_repo
from corral.store.tables import codes, file_archives, repo_creds
from server_harness import RunningServer, fleet_body, make_settings, running_server, task_body, wait_for

P = "/api/project/main"
FINISHED = ("done", "failed", "terminated", "aborted")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _upload_code(c: httpx.AsyncClient, repo_id: str, data: bytes, name: str | None = None) -> httpx.Response:
    return await c.post(
        f"{P}/repos/upload_code", params={"repo_id": repo_id}, files={"file": (name or _sha(data), data)}
    )


async def _upload_archive(c: httpx.AsyncClient, data: bytes) -> httpx.Response:
    return await c.post("/api/files/upload_archive", files={"file": (_sha(data), data)})


async def _second_user(server: RunningServer) -> str:
    async with server.client() as admin:
        await admin.post("/api/users/create", json={"username": "bob", "global_role": "user"})
        await admin.post(
            "/api/projects/main/add_members", json={"members": [{"username": "bob", "project_role": "user"}]}
        )
        return str((await admin.post("/api/users/get_user", json={"username": "bob"})).json()["creds"]["token"])


async def _run_to_end(c: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.post(f"{P}/runs/apply", json=body)
    assert r.status_code == 200, r.text
    name = r.json()["run_spec"]["run_name"]

    async def finished() -> dict[str, Any] | None:
        run = (await c.post(f"{P}/runs/get", json={"run_name": name})).json()
        return run if run["status"] in FINISHED else None

    return dict(await wait_for(finished, timeout=60))


async def _logs(c: httpx.AsyncClient, run: dict[str, Any]) -> str:
    sub = run["latest_job_submission"]["id"]
    r = await c.post(
        f"{P}/logs/poll", json={"run_name": run["run_spec"]["run_name"], "job_submission_id": sub, "limit": 1000}
    )
    return b"".join(base64.b64decode(x["message"]) for x in r.json()["logs"]).decode()


def _run_body(commands: list[str], upload: Any, archives: list[dict[str, Any]] = (), **conf: Any) -> dict[str, Any]:  # type: ignore[assignment]
    body = task_body(commands, **conf)
    body["plan"]["run_spec"].update(
        repo_id=upload.repo_id,
        repo_data=upload.repo_data,
        repo_code_hash=upload.code_hash,
        file_archives=list(archives),
    )
    return body


async def _fleet(c: httpx.AsyncClient) -> None:
    r = await c.post(f"{P}/fleets/apply", json=fleet_body(name="code-fleet", nodes="0..1"))
    assert r.status_code == 200, r.text


# ---- repos ---------------------------------------------------------------------------------------------


async def test_repos_init_list_get_delete_with_encrypted_per_user_creds(server: RunningServer) -> None:
    bob = await _second_user(server)
    creds = {"clone_url": "https://git.example/team/project.git", "oauth_token": "tok-SECRET-1234", "private_key": None}
    async with server.client() as c:
        for body in (
            {"repo_id": "none", "repo_info": {"repo_type": "virtual"}},
            {
                "repo_id": "project-abc",
                "repo_info": {"repo_type": "remote", "repo_name": "project"},
                "repo_creds": creds,
            },
            {"repo_id": "dir-xyz", "repo_info": {"repo_type": "local", "repo_dir": "/home/u/dir"}},
        ):
            r = await c.post(f"{P}/repos/init", json=body)
            assert r.status_code == 200 and r.json() is None, r.text
        listed = (await c.post(f"{P}/repos/list")).json()
        assert [x["repo_id"] for x in listed] == ["dir-xyz", "none", "project-abc"]
        assert listed[2]["repo_info"] == {"repo_type": "remote", "repo_name": "project"}
        head = (await c.post(f"{P}/repos/get", json={"repo_id": "project-abc", "include_creds": False})).json()
        assert head == {"repo_id": "project-abc", "repo_info": listed[2]["repo_info"], "repo_creds": None}
        full = (await c.post(f"{P}/repos/get", json={"repo_id": "project-abc", "include_creds": True})).json()
        assert full["repo_creds"] == creds
        bad = await c.post(f"{P}/repos/init", json={"repo_id": "x", "repo_info": {"repo_type": "svn"}})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "repo_info"]
    # At rest the credentials are encrypted with the server key.
    async with server.ctx.db.read() as conn:
        (stored,) = (await conn.execute(sa.select(repo_creds.c.creds))).scalars().all()
    assert stored.startswith("enc:v1:") and "tok-SECRET" not in stored and "git.example" not in stored
    assert server.settings.encryption_key_file.stat().st_mode & 0o077 == 0
    # Credentials are per user: bob sees the repo, not admin's token.
    async with server.client(token=bob) as c:
        theirs = (await c.post(f"{P}/repos/get", json={"repo_id": "project-abc", "include_creds": True})).json()
        assert theirs["repo_creds"] is None
    async with server.client() as c:
        # Re-initialising without creds drops the caller's credentials (as dstack does).
        body = {"repo_id": "project-abc", "repo_info": {"repo_type": "remote", "repo_name": "project"}}
        await c.post(f"{P}/repos/init", json=body)
        full = (await c.post(f"{P}/repos/get", json={"repo_id": "project-abc", "include_creds": True})).json()
        assert full["repo_creds"] is None
        assert (await c.post(f"{P}/repos/delete", json={"repos_ids": ["project-abc", "dir-xyz"]})).status_code == 200
        assert [x["repo_id"] for x in (await c.post(f"{P}/repos/list")).json()] == ["none"]
        gone = await c.post(f"{P}/repos/get", json={"repo_id": "project-abc", "include_creds": False})
        assert gone.status_code == 400 and gone.json()["detail"][0]["code"] == "resource_not_exists"


async def test_upload_code_is_content_addressed_and_checked(server: RunningServer) -> None:
    code = tar_of({"main.py": b"print('hi')\n"})
    async with server.client() as c:
        r = await _upload_code(c, "nope", code)
        assert r.status_code == 400 and r.json()["detail"][0]["code"] == "repo_does_not_exist"
        await c.post(f"{P}/repos/init", json={"repo_id": "d", "repo_info": {"repo_type": "local", "repo_dir": "/d"}})
        assert (await _upload_code(c, "d", code)).status_code == 200
        async with server.ctx.db.read() as conn:
            first = (await conn.execute(sa.select(codes.c.blob_hash, codes.c.created_at))).all()
        assert (await _upload_code(c, "d", code)).status_code == 200  # the same code again: not stored twice
        async with server.ctx.db.read() as conn:
            again = (await conn.execute(sa.select(codes.c.blob_hash, codes.c.created_at))).all()
        assert first == again and [row.blob_hash for row in again] == [_sha(code)]
        wrong = await _upload_code(c, "d", code, name="0" * 64)
        assert wrong.status_code == 400 and "is not the SHA-256 of its content" in wrong.json()["detail"][0]["msg"]
        no_file = await c.post(f"{P}/repos/upload_code", params={"repo_id": "d"}, files={"other": ("x", b"1")})
        assert no_file.status_code == 422 and no_file.json()["detail"][0]["loc"] == ["body", "file"]
        not_multipart = await c.post(f"{P}/repos/upload_code", params={"repo_id": "d"}, content=b"raw")
        assert not_multipart.status_code == 400 and "multipart/form-data" in not_multipart.json()["detail"][0]["msg"]


async def test_oversize_uploads_are_a_clear_400(tmp_path: Path) -> None:
    async with running_server(make_settings(tmp_path, code_upload_limit=16384)) as server, server.client() as c:
        await c.post(f"{P}/repos/init", json={"repo_id": "d", "repo_info": {"repo_type": "local", "repo_dir": "/d"}})
        big = tar_of({"big.bin": bytes(range(256)) * 256})
        for r in (await _upload_code(c, "d", big), await _upload_archive(c, big)):
            assert r.status_code == 400, r.text
            msg = r.json()["detail"][0]["msg"]
            assert "exceeds the server's limit of 16.0KiB (16384 bytes)" in msg, msg
            assert "CORRAL_SERVER_CODE_UPLOAD_LIMIT" in msg
        small = tar_of({"small.txt": b"ok"})
        assert (await _upload_code(c, "d", small)).status_code == 200
        async with server.ctx.db.read() as conn:
            assert (await conn.execute(sa.select(sa.func.count()).select_from(file_archives))).scalar() == 0
            assert (await conn.execute(sa.select(codes.c.blob_hash))).scalars().all() == [_sha(small)]


async def test_file_archives_are_per_user_and_stored_once(server: RunningServer) -> None:
    bob = await _second_user(server)
    data = tar_of({"data/a.txt": b"a"})
    async with server.client() as c:
        first = (await _upload_archive(c, data)).json()
        second = (await _upload_archive(c, data)).json()
        assert first == second and first["hash"] == _sha(data)
        found = (await c.post("/api/files/get_archive_by_hash", json={"hash": _sha(data)})).json()
        assert found == first
        missing = await c.post("/api/files/get_archive_by_hash", json={"hash": "f" * 64})
        assert missing.status_code == 400 and missing.json()["detail"][0]["code"] == "resource_not_exists"
    async with server.client(token=bob) as c:
        other = await c.post("/api/files/get_archive_by_hash", json={"hash": _sha(data)})
        assert other.status_code == 400  # another user's archive is not visible
        theirs = (await _upload_archive(c, data)).json()
        assert theirs["id"] != first["id"]
    async with server.ctx.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(file_archives))).scalar() == 2


async def test_apply_refuses_what_the_server_does_not_have(server: RunningServer) -> None:
    bob = await _second_user(server)
    remote_data = {"repo_type": "remote", "repo_name": "p", "repo_branch": "main", "repo_hash": None}
    async with server.client() as c:
        body = task_body(["true"])
        body["plan"]["run_spec"].update(repo_id="p-1", repo_data=remote_data)
        r = await c.post(f"{P}/runs/apply", json=body)
        assert r.status_code == 400 and r.json()["detail"][0]["code"] == "repo_does_not_exist"
        await c.post(f"{P}/repos/init", json={"repo_id": "p-1", "repo_info": {"repo_type": "remote", "repo_name": "p"}})
        r = await c.post(f"{P}/runs/apply", json=body)
        assert r.status_code == 400 and "has no credentials of user admin" in r.json()["detail"][0]["msg"]
        creds = {"clone_url": "/nowhere/p.git"}
        init = {"repo_id": "p-1", "repo_info": {"repo_type": "remote", "repo_name": "p"}, "repo_creds": creds}
        await c.post(f"{P}/repos/init", json=init)
        body["plan"]["run_spec"]["repo_code_hash"] = "a" * 64
        r = await c.post(f"{P}/runs/apply", json=body)
        assert r.status_code == 400 and "has not been uploaded" in r.json()["detail"][0]["msg"]
        body["plan"]["run_spec"]["repo_code_hash"] = None
        body["plan"]["run_spec"]["file_archives"] = [{"id": "00000000-0000-0000-0000-000000000000", "path": "x"}]
        r = await c.post(f"{P}/runs/apply", json=body)
        assert r.status_code == 400 and "files/upload_archive" in r.json()["detail"][0]["msg"]
    async with server.client(token=bob) as c:
        theirs = (await _upload_archive(c, tar_of({"x": b"x"}))).json()
    async with server.client() as c:
        body["plan"]["run_spec"]["file_archives"] = [{"id": theirs["id"], "path": "x"}]
        r = await c.post(f"{P}/runs/apply", json=body)
        assert r.status_code == 400, "another user's archive must not be usable"


# ---- runs with code on a real agent ----------------------------------------------------------------------


async def test_run_sees_committed_and_uncommitted_work_and_files(server: RunningServer, tmp_path: Path) -> None:
    checkout = remote_and_checkout(tmp_path)
    upload = from_dir(checkout.work, RepoOptions())
    assert upload.repo_data["repo_hash"] == checkout.head and upload.code_hash is not None
    data_dir = tmp_path / "data"
    (data_dir / "nested").mkdir(parents=True)
    (data_dir / "nested" / "x.txt").write_text("from files dir\n")
    (tmp_path / "one.cfg").write_text("from files file\n")
    async with server.client() as c:
        await _fleet(c)
        r = await c.post(
            f"{P}/repos/init",
            json={"repo_id": upload.repo_id, "repo_info": upload.repo_info, "repo_creds": upload.repo_creds},
        )
        assert r.status_code == 200
        assert (await _upload_code(c, upload.repo_id, upload.code)).status_code == 200
        archives = []
        for local, path in ((data_dir, "inputs"), (tmp_path / "one.cfg", "/etc/app/app.cfg")):
            uploaded = (await _upload_archive(c, file_archive(local))).json()
            archives.append({"id": uploaded["id"], "path": path})
        commands = [
            "cat committed.txt second.txt untracked.txt",
            "test ! -e noise.log && echo no-ignored-file",
            "git rev-parse HEAD",
            "cat inputs/nested/x.txt",
            'cat "$DSTACK_WORKING_DIR/etc/app/app.cfg"',
            'echo "repo=$DSTACK_REPO_DIR wd=$DSTACK_WORKING_DIR id=$DSTACK_REPO_ID pwd=$(pwd)"',
        ]
        run = await _run_to_end(c, _run_body(commands, upload, archives, repos=["."]))
        out = await _logs(c, run)
        assert run["status"] == "done", (run["latest_job_submission"], out)
        for text in (COMMITTED, "second", UNCOMMITTED, UNTRACKED, "no-ignored-file", checkout.head):
            assert text in out, out
        assert "from files dir" in out and "from files file" in out
        line = next(x for x in out.splitlines() if x.startswith("repo="))
        fields = dict(part.split("=", 1) for part in line.split())
        assert fields["repo"] == fields["wd"] == fields["pwd"] and fields["id"] == upload.repo_id
        # The repo lives in the job's own directory on the host, never at an absolute container path.
        assert fields["repo"].startswith(str(server.settings.instances_dir))
        job_spec = run["jobs"][0]["job_spec"]
        assert job_spec["repo_dir"] == "." and job_spec["repo_exists_action"] == "error"
        assert job_spec["repo_code_hash"] == upload.code_hash and job_spec["file_archives"] == archives

        (blob,) = server.settings.instances_dir.glob(f"*/blobs/{upload.code_hash}")
        inode = blob.stat().st_ino

        # `repos[].path` relative to the working dir; a relative `working_dir` is relative to the repo dir.
        conf: dict[str, Any] = {"repos": [{"local_path": ".", "path": "src"}], "working_dir": "docs"}
        run = await _run_to_end(c, _run_body(['pwd; cat readme.md; echo "repo=$DSTACK_REPO_DIR"'], upload, **conf))
        out = await _logs(c, run)
        assert run["status"] == "done", (run["latest_job_submission"], out)
        pwd, readme, repo_line = out.splitlines()
        assert readme == "# docs" and pwd == repo_line.removeprefix("repo=") + "/docs" and pwd.endswith("/src/docs")
        assert blob.stat().st_ino == inode  # the instance had the code already: it was not sent again


async def test_a_diff_that_no_longer_applies_fails_the_job_clearly(server: RunningServer, tmp_path: Path) -> None:
    checkout = remote_and_checkout(tmp_path)
    upload = from_dir(checkout.work, RepoOptions())
    upload.repo_data["repo_hash"] = checkout.first  # the diff changes second.txt, which this commit lacks
    async with server.client() as c:
        await _fleet(c)
        await c.post(
            f"{P}/repos/init",
            json={"repo_id": upload.repo_id, "repo_info": upload.repo_info, "repo_creds": upload.repo_creds},
        )
        await _upload_code(c, upload.repo_id, upload.code)
        run = await _run_to_end(c, _run_body(["echo should-not-run"], upload, repos=["."]))
        sub = run["latest_job_submission"]
        assert run["status"] == "failed" and sub["termination_reason"] == "container_exited_with_error", sub
        msg = sub["termination_reason_message"]
        assert "do not apply to commit " + checkout.first in msg and "second.txt" in msg, msg
        assert "should-not-run" not in await _logs(c, run)

        # A clone that fails says so, with git's words.
        upload.repo_data["repo_hash"] = checkout.head
        assert upload.repo_creds is not None
        bad = {**upload.repo_creds, "clone_url": str(tmp_path / "missing.git")}
        await c.post(
            f"{P}/repos/init", json={"repo_id": upload.repo_id, "repo_info": upload.repo_info, "repo_creds": bad}
        )
        run = await _run_to_end(c, _run_body(["true"], upload, repos=["."]))
        msg = run["latest_job_submission"]["termination_reason_message"]
        assert run["status"] == "failed" and f"Cannot clone the repo {tmp_path / 'missing.git'}" in msg, msg
        assert "does not exist" in msg, msg


async def test_local_repo_travels_as_an_archive(server: RunningServer, tmp_path: Path) -> None:
    project = tmp_path / "plain"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "mod.py").write_text("VALUE = 42\n")
    (project / ".dstackignore").write_text("secret.txt\n")
    (project / "secret.txt").write_text("do not send\n")
    upload = local_repo(project)
    assert upload.repo_info == {"repo_type": "local", "repo_dir": str(project)}
    async with server.client() as c:
        await _fleet(c)
        await c.post(f"{P}/repos/init", json={"repo_id": upload.repo_id, "repo_info": upload.repo_info})
        await _upload_code(c, upload.repo_id, upload.code)
        commands = ["cat pkg/mod.py", "test ! -e secret.txt && echo secret-stayed-home"]
        run = await _run_to_end(c, _run_body(commands, upload, repos=["."]))
        out = await _logs(c, run)
        assert run["status"] == "done" and "VALUE = 42" in out and "secret-stayed-home" in out, out
