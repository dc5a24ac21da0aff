"""Repos, code upload and file archives: what a run's job needs to rebuild the user's working tree.

* ``repos/init`` records a repo (remote: a git URL's name; local: code that travels as an archive;
  virtual: no git at all) and, for remote repos, the calling user's credentials (clone URL, optional
  OAuth token or SSH key), encrypted at rest.
* ``repos/upload_code`` stores the diff against the remote commit (remote repos) or the tar archive
  (local and virtual repos), content-addressed per project by its SHA-256 (the upload's filename).
* ``files/upload_archive`` stores a ``files:`` tar archive, content-addressed per user.

Uploads larger than ``Settings.code_upload_limit`` are refused with a 400 that says how to fix it, and
an upload whose content does not match its hash is refused too. :func:`check_run_code` is what
``runs/apply`` asks before it accepts a run that references any of this.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from corral.context import Context
from corral.domain.events import Target, project_target
from corral.domain.records import ProjectRec, UserRec
from corral.schemas import requests as rq
from corral.services.errors import ResourceNotExists, ServiceError
from corral.store import events
from corral.store import repos as store
from corral.store.encryption import EncryptionError, cipher_for

HASH_RE = re.compile(r"^[0-9a-f]{64}$")
VIRTUAL_REPO_ID = "none"


class RepoDoesNotExist(ServiceError):
    code = "repo_does_not_exist"


def _creds_json(creds: rq.RepoCreds) -> dict[str, Any]:
    return {"clone_url": creds.clone_url, "private_key": creds.private_key, "oauth_token": creds.oauth_token}


def decrypt_creds(ctx: Context, stored: str) -> dict[str, Any]:
    """The credentials as ``repos/init`` received them; a clear error if this server cannot read them."""
    try:
        return dict(json.loads(cipher_for(ctx.settings).decrypt(stored)))
    except EncryptionError as e:
        raise ServiceError(f"Cannot read the stored repo credentials: {e}; run `repos/init` again") from None


async def init(ctx: Context, project: ProjectRec, user: UserRec, body: rq.ReposInitBody) -> None:
    info = body.repo_info.model_dump()
    async with ctx.db.write() as conn:
        before = await store.get_repo(conn, project.id, body.repo_id)
        await store.save_repo(conn, project.id, body.repo_id, info)
        if before != info:  # the CLI initializes the repo on every apply: only a new or changed one is an event
            what = "created" if before is None else "updated"
            await events.emit(conn, f"Repo {what}. Repo ID: {body.repo_id}", user.id, [_target(project)])
        if info["repo_type"] == "remote":
            if body.repo_creds is not None:
                sealed = cipher_for(ctx.settings).encrypt(json.dumps(_creds_json(body.repo_creds)))
                await store.save_creds(conn, project.id, body.repo_id, user.id, sealed)
            else:
                await store.delete_creds(conn, project.id, body.repo_id, user.id)


async def list_repos(ctx: Context, project: ProjectRec) -> list[dict[str, Any]]:
    async with ctx.db.read() as conn:
        return [{"repo_id": rid, "repo_info": info} for rid, info in await store.list_repos(conn, project.id)]


async def get(ctx: Context, project: ProjectRec, user: UserRec, repo_id: str, include_creds: bool) -> dict[str, Any]:
    """``RepoHeadWithCreds``; ``repo_creds`` (the caller's own, never another user's) only if asked for."""
    async with ctx.db.read() as conn:
        info = await store.get_repo(conn, project.id, repo_id)
        stored = await store.get_creds(conn, project.id, repo_id, user.id) if include_creds else None
    if info is None:
        raise ResourceNotExists(f"Repo {repo_id} does not exist")
    creds = decrypt_creds(ctx, stored) if stored is not None else None
    return {"repo_id": repo_id, "repo_info": info, "repo_creds": creds}  # dstack always sends the key


async def delete(ctx: Context, project: ProjectRec, repo_ids: list[str], user: UserRec | None = None) -> None:
    async with ctx.db.write() as conn:
        for repo_id in repo_ids:
            if await store.get_repo(conn, project.id, repo_id) is not None:
                await events.emit(
                    conn, f"Repo deleted. Repo ID: {repo_id}", user.id if user else None, [_target(project)]
                )
        await store.delete_repos(conn, project.id, repo_ids)


def _target(project: ProjectRec) -> Target:
    """Repos are no target type of dstack's: their events target the project (the repo id is in the message)."""
    return project_target(project.id, project.name)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n}B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}GiB"


def check_upload_size(ctx: Context, content_length: str | None, what: str) -> None:
    """dstack's rule: the request's size (its Content-Length) must not exceed the limit (0 = none)."""
    limit = ctx.settings.code_upload_limit
    if content_length is None:
        raise ServiceError(f"The {what} upload needs a Content-Length header")
    try:
        size = int(content_length)
    except ValueError:
        raise ServiceError(f"The {what} upload has an invalid Content-Length header") from None
    if limit > 0 and size > limit:
        hint = (
            "Use .gitignore to exclude large files from the repo"
            if what == "code"
            else "Use .gitignore/.dstackignore to exclude large files"
        )
        raise ServiceError(
            f"The {what} upload is {_size(size)} ({size} bytes), which exceeds the server's limit of "
            f"{_size(limit)} ({limit} bytes). {hint}, or raise the limit with CORRAL_SERVER_CODE_UPLOAD_LIMIT "
            "on the server."
        )


def _checked_hash(filename: str | None, data: bytes, what: str) -> str:
    if not filename:
        raise ServiceError(f"The {what} upload has no filename: it must be the SHA-256 of the content")
    digest = hashlib.sha256(data).hexdigest()
    if filename.lower() != digest:
        raise ServiceError(
            f"The {what} upload's filename {filename[:80]!r} is not the SHA-256 of its content ({digest})"
        )
    return digest


async def upload_code(ctx: Context, project: ProjectRec, repo_id: str, filename: str | None, data: bytes) -> bool:
    """Store the code unless the project has it already; True if it was new."""
    code_hash = _checked_hash(filename, data, "code")
    async with ctx.db.write() as conn:
        if await store.get_repo(conn, project.id, repo_id) is None:
            raise RepoDoesNotExist(f"Repo {repo_id} does not exist")
        return await store.add_code(conn, project.id, code_hash, data, time.time())


async def upload_archive(ctx: Context, user: UserRec, filename: str | None, data: bytes) -> dict[str, Any]:
    archive_hash = _checked_hash(filename, data, "file archive")
    async with ctx.db.write() as conn:
        found = await store.add_archive(conn, str(uuid.uuid4()), user.id, archive_hash, data, time.time())
    return {"id": found.id, "hash": found.blob_hash}


async def archive_by_hash(ctx: Context, user: UserRec, archive_hash: str) -> dict[str, Any]:
    async with ctx.db.read() as conn:
        found = await store.archive_by_hash(conn, user.id, archive_hash.lower())
    if found is None:
        raise ResourceNotExists(f"No file archive with hash {archive_hash}")
    return {"id": found.id, "hash": found.blob_hash}


async def check_run_code(ctx: Context, project: ProjectRec, user: UserRec, spec: Mapping[str, Any]) -> None:
    """Refuse a run whose repo, code or file archives the server does not have (a clear 400 now rather
    than a job that fails on its instance later)."""
    repo_id = str(spec.get("repo_id") or VIRTUAL_REPO_ID)
    repo_data = spec.get("repo_data") or {"repo_type": "virtual"}
    repo_type = repo_data.get("repo_type") if isinstance(repo_data, dict) else None
    if repo_type not in ("remote", "local", "virtual"):
        raise ServiceError(f"run_spec.repo_data.repo_type must be remote, local or virtual, not {repo_type!r}")
    code_hash = spec.get("repo_code_hash")
    if code_hash is not None and not (isinstance(code_hash, str) and HASH_RE.match(code_hash)):
        raise ServiceError("run_spec.repo_code_hash must be the SHA-256 (64 hex digits) of the uploaded code")
    archives = spec.get("file_archives") or []
    for i, a in enumerate(archives):
        if not isinstance(a, dict) or not isinstance(a.get("id"), str) or not isinstance(a.get("path"), str):
            raise ServiceError(f"run_spec.file_archives[{i}] must be an object with `id` and `path`")
    if repo_type == "virtual" and code_hash is None and not archives:
        return  # a run without code: nothing to look up
    async with ctx.db.read() as conn:
        info = await store.get_repo(conn, project.id, repo_id)
        if info is None and (repo_type != "virtual" or code_hash is not None):
            raise RepoDoesNotExist(f"Repo {repo_id} does not exist: call `repos/init` before applying the run")
        if info is not None and info.get("repo_type") != repo_type:
            raise ServiceError(
                f"Repo {repo_id} is a {info.get('repo_type')} repo, but the run's repo_data says {repo_type}"
            )
        if repo_type == "remote" and await store.get_creds(conn, project.id, repo_id, user.id) is None:
            raise ServiceError(
                f"Repo {repo_id} has no credentials of user {user.name} (at least a clone URL): "
                "call `repos/init` with `repo_creds`"
            )
        if code_hash is not None and not await store.has_code(conn, project.id, code_hash):
            raise ServiceError(
                f"The code {code_hash} of repo {repo_id} has not been uploaded: call `repos/upload_code` first"
            )
        found = await store.archives_by_ids(conn, [str(a["id"]) for a in archives])
    for a in archives:
        rec = found.get(str(a["id"]))
        if rec is None or rec.user_id != user.id:
            raise ResourceNotExists(
                f"File archive {a['id']} (for {a['path']}) does not exist: upload it with `files/upload_archive`"
            )
