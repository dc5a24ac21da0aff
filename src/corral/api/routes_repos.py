"""Routers: repos (``/api/project/{p}/repos/*``) and file archives (``/api/files/*``), as dstack has them.

Uploads are ``multipart/form-data`` with one ``file`` field whose filename is the SHA-256 of the content.
The size check reads only the Content-Length header, so an oversize upload is refused before its body is
parsed.
"""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request

from corral.api.deps import FastJSON, ctx_of, current_user, member
from corral.api.routes_accounts import parse
from corral.api.routing import RequestValidationError, RouteTable
from corral.schemas import requests as rq
from corral.services import repos
from corral.services.errors import ServiceError

router = RouteTable()
P = "/api/project/{project_name}/repos"


async def _uploaded(request: Request, what: str) -> tuple[str | None, bytes]:
    """The ``file`` field of a size-checked multipart upload: (filename, content)."""
    repos.check_upload_size(ctx_of(request), request.headers.get("content-length"), what)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ServiceError(f"The {what} upload must be multipart/form-data with a `file` field")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as e:  # starlette's parser errors: a malformed body is the client's fault
        raise ServiceError(f"The {what} upload is not valid multipart/form-data: {e}") from None
    try:
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise RequestValidationError(
                [{"type": "missing", "loc": ["body", "file"], "msg": "Field required", "input": None}]
            )
        return file.filename, await file.read()
    finally:
        await form.close()


@router.post(P + "/init", body=rq.ReposInitBody, response="Null")
async def repos_init(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.ReposInitBody, request)
    await repos.init(ctx_of(request), project, user, b)
    return FastJSON(None)


@router.post(P + "/list", body=rq.NoBody, response="RepoHeadList")
async def repos_list(request: Request, project_name: str) -> FastJSON:
    _u, project = await member(request, project_name)
    return FastJSON(await repos.list_repos(ctx_of(request), project))


@router.post(P + "/get", body=rq.GetRepoBody, response="RepoHeadWithCreds")
async def repos_get(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.GetRepoBody, request)
    return FastJSON(await repos.get(ctx_of(request), project, user, b.repo_id, b.include_creds))


@router.post(P + "/delete", body=rq.DeleteReposBody, response="Null")
async def repos_delete(request: Request, project_name: str) -> FastJSON:
    user, project = await member(request, project_name)
    b = await parse(rq.DeleteReposBody, request)
    await repos.delete(ctx_of(request), project, b.repos_ids, user)
    return FastJSON(None)


@router.post(P + "/upload_code", upload=True, response="Null", limit="upload")
async def repos_upload_code(request: Request, project_name: str, repo_id: str) -> FastJSON:
    _u, project = await member(request, project_name)
    filename, data = await _uploaded(request, "code")
    await repos.upload_code(ctx_of(request), project, repo_id, filename, data)
    return FastJSON(None)


@router.post("/api/files/upload_archive", upload=True, response="FileArchive", limit="upload")
async def files_upload_archive(request: Request) -> FastJSON:
    user = await current_user(request)
    filename, data = await _uploaded(request, "file archive")
    return FastJSON(await repos.upload_archive(ctx_of(request), user, filename, data))


@router.post("/api/files/get_archive_by_hash", body=rq.ArchiveByHashBody, response="FileArchive")
async def files_get_archive_by_hash(request: Request) -> FastJSON:
    user = await current_user(request)
    b = await parse(rq.ArchiveByHashBody, request)
    return FastJSON(await repos.archive_by_hash(ctx_of(request), user, b.hash))
