"""The code side of a job submission: which repo to check out and which ``files:`` archives to unpack,
and getting their blobs onto the instance.

The server talks to the agent, never the other way round (the agent only listens on its host, reached
through the existing channel), so before ``POST /jobs`` the server pushes each blob the job needs with
``PUT /blobs/{sha256}`` -- after asking whether the agent holds it already, so a blob travels to a host
once. Blobs come from the database (any replica can serve them) and are read only when the agent lacks
them. Anything missing on the server side (a deleted repo's credentials, an archive gone) is a
:class:`JobCodeError` with a message for the user, which fails the job.

May import: corral.store (repos, encryption), corral.context, the agent client and protocol.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from corral.agent.protocol import FileArchiveRef, RepoCheckout
from corral.backends.agent_client import AgentClient
from corral.context import Context
from corral.domain.records import JobRec, RunRec
from corral.store import repos as store
from corral.store.encryption import EncryptionError, cipher_for


class JobCodeError(Exception):
    """The server cannot give the job its repo or files; the message says why."""


@dataclass
class JobCode:
    #: None when there is nothing to check out (the virtual repo without code): the repo dir is the working dir.
    repo: RepoCheckout | None
    file_archives: list[FileArchiveRef] = field(default_factory=list)
    #: hash -> where the blob is: ("code", project id) or ("archive", archive id)
    blobs: dict[str, tuple[str, str]] = field(default_factory=dict)


async def job_code(ctx: Context, run: RunRec, job: JobRec) -> JobCode:
    spec, js = run.run_spec, job.job_spec
    repo_id = str(spec.get("repo_id") or "none")
    repo_data = spec.get("repo_data") or {"repo_type": "virtual"}
    repo_type = str(repo_data.get("repo_type") or "virtual")
    code_hash = js.get("repo_code_hash") or spec.get("repo_code_hash")
    wanted = [a for a in js.get("file_archives") or [] if isinstance(a, dict)]
    user_id = stored = None
    found: dict[str, Any] = {}
    if repo_type == "remote" or wanted:  # the run's user's credentials and archives (none to read otherwise)
        async with ctx.db.read() as conn:
            user_id = await store.run_user_id(conn, run.id)
            if repo_type == "remote" and user_id is not None:
                stored = await store.get_creds(conn, run.project_id, repo_id, user_id)
            found = await store.archives_by_ids(conn, [str(a.get("id")) for a in wanted])
    creds: dict[str, Any] = {}
    if repo_type == "remote":
        if stored is None:
            raise JobCodeError(
                f"The repo {repo_id} has no credentials of the run's user any more (was the repo deleted?): "
                "run `repos/init` again and resubmit"
            )
        try:
            creds = json.loads(cipher_for(ctx.settings).decrypt(stored))
        except EncryptionError as e:
            raise JobCodeError(f"Cannot read the credentials of repo {repo_id}: {e}") from None
    code = JobCode(repo=None)
    if repo_type != "virtual" or code_hash:
        code.repo = RepoCheckout(
            repo_type=repo_type,
            repo_dir=str(js.get("repo_dir") or "."),
            code_hash=code_hash,
            clone_url=creds.get("clone_url"),
            branch=repo_data.get("repo_branch"),
            commit=repo_data.get("repo_hash"),
            oauth_token=creds.get("oauth_token"),
            private_key=creds.get("private_key"),
            git_user_name=repo_data.get("repo_config_name"),
            git_user_email=repo_data.get("repo_config_email"),
            single_branch=js.get("single_branch") is not False,
            if_exists=js.get("repo_exists_action"),
        )
    if code_hash:
        code.blobs[code_hash] = ("code", run.project_id)
    for a in wanted:
        rec = found.get(str(a.get("id")))
        if rec is None or rec.user_id != user_id:
            raise JobCodeError(f"The file archive {a.get('id')} for {a.get('path')} no longer exists on the server")
        code.file_archives.append(FileArchiveRef(hash=rec.blob_hash, path=str(a.get("path"))))
        code.blobs[rec.blob_hash] = ("archive", rec.id)
    return code


async def push_blobs(ctx: Context, client: AgentClient, code: JobCode) -> None:
    """Send the agent every blob of ``code`` it does not hold yet (AgentUnreachable/AgentError pass up)."""
    for blob_hash, (kind, key) in code.blobs.items():
        if await client.has_blob(blob_hash):
            continue
        async with ctx.db.read() as conn:
            if kind == "code":
                data = await store.get_code(conn, key, blob_hash)
            else:
                data = await store.get_archive_blob(conn, key)
        if data is None:
            what = "repo code" if kind == "code" else "file archive"
            raise JobCodeError(f"The {what} {blob_hash} is missing on the server")
        await client.put_blob(blob_hash, data)
