"""A synchronous client of corral's REST API, which is dstack's (0.22.5) REST API.

Every call is a ``POST`` with a JSON body and a bearer token, and returns the parsed JSON
(dicts and lists in dstack's field names). HTTP errors become the exceptions of
:mod:`corral.sdk.errors`, each with a message fit to show a user as one line.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from corral.sdk.errors import (
    AuthError,
    ClientError,
    NotFoundError,
    ResourceNotExistsError,
    ServerError,
    ServerUnreachable,
    ValidationError,
)

API_VERSION = "0.22.5"
"""The dstack API version corral speaks; sent as ``X-API-VERSION``."""

JSONObject = dict[str, Any]


class CorralClient:
    """Talks to one corral (or dstack) server as one user.

    ``transport`` exists for tests (``httpx.MockTransport``); leave it unset otherwise.
    """

    def __init__(
        self,
        url: str,
        token: str,
        timeout: float = 30,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            transport=transport,
            headers={"Authorization": f"Bearer {token}", "X-API-VERSION": API_VERSION},
        )

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def __enter__(self) -> CorralClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- transport ----------------------------------------------------------------------

    def _post(
        self, path: str, body: Any = None, files: dict[str, Any] | None = None, params: dict[str, str] | None = None
    ) -> Any:
        try:
            if files is not None:
                response = self._http.post(path, files=files, params=params)
            elif body is None:
                response = self._http.post(path)
            else:
                response = self._http.post(path, json=body)
        except httpx.TimeoutException as e:
            raise ServerUnreachable(
                f"The corral server at {self.url} did not answer {path} in time ({type(e).__name__})."
            ) from e
        except httpx.TransportError as e:
            raise ServerUnreachable(
                f"Cannot reach the corral server at {self.url}. Start it with `corral server`."
            ) from e
        if response.status_code >= 400:
            raise _error_from_response(self.url, path, response)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as e:
            raise ServerError(
                f"The server at {self.url} answered {path} with something that is not JSON",
                response.status_code,
            ) from e

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            response = self._http.get(path, params=params)
        except httpx.TimeoutException as e:
            raise ServerUnreachable(
                f"The corral server at {self.url} did not answer {path} in time ({type(e).__name__})."
            ) from e
        except httpx.TransportError as e:
            raise ServerUnreachable(
                f"Cannot reach the corral server at {self.url}. Start it with `corral server`."
            ) from e
        if response.status_code >= 400:
            raise _error_from_response(self.url, path, response)
        try:
            return response.json()
        except ValueError as e:
            raise ServerError(
                f"The server at {self.url} answered {path} with something that is not JSON",
                response.status_code,
            ) from e

    def _obj(self, path: str, body: Any = None, files: dict[str, Any] | None = None) -> JSONObject:
        data = self._post(path, body, files=files)
        if not isinstance(data, dict):
            raise ServerError(f"Expected a JSON object from {path}, got {type(data).__name__}")
        return data

    def _list(self, path: str, body: Any = None) -> list[JSONObject]:
        data = self._post(path, body)
        if not isinstance(data, list):
            raise ServerError(f"Expected a JSON list from {path}, got {type(data).__name__}")
        return data

    # ---- server and users ---------------------------------------------------------------

    def get_info(self) -> JSONObject:
        """``server/get_info``: ``{"server_version": ...}`` (no token needed)."""
        return self._obj("/api/server/get_info")

    def get_my_user(self) -> JSONObject:
        """``users/get_my_user``: the token's user, with ``creds``."""
        return self._obj("/api/users/get_my_user")

    # ---- projects -----------------------------------------------------------------------

    def projects_list(self) -> list[JSONObject]:
        """``projects/list``: the projects the user can see."""
        return self._list("/api/projects/list", {})

    def projects_get(self, project: str) -> JSONObject:
        """``projects/{project}/get`` (sent with no body, as dstack's CLI does)."""
        return self._obj(f"/api/projects/{project}/get")

    def projects_create(self, project: str, is_public: bool = False) -> JSONObject:
        """``projects/create``."""
        return self._obj("/api/projects/create", {"project_name": project, "is_public": is_public})

    def projects_delete(self, projects: list[str]) -> None:
        """``projects/delete``."""
        self._post("/api/projects/delete", {"projects_names": projects})

    # ---- fleets -------------------------------------------------------------------------

    def fleets_get_plan(self, project: str, spec: JSONObject) -> JSONObject:
        """``fleets/get_plan`` for a FleetSpec ``{configuration, configuration_path, profile}``."""
        return self._obj(f"/api/project/{project}/fleets/get_plan", {"spec": spec})

    def fleets_apply(self, project: str, plan: JSONObject, force: bool = False) -> JSONObject:
        """``fleets/apply`` with ``plan = {spec, current_resource}``; returns the Fleet."""
        return self._obj(f"/api/project/{project}/fleets/apply", {"plan": plan, "force": force})

    def fleets_list(self, project: str, include_imported: bool = True) -> list[JSONObject]:
        """``project/{p}/fleets/list``."""
        return self._list(f"/api/project/{project}/fleets/list", {"include_imported": include_imported})

    def fleets_get(self, project: str, name: str) -> JSONObject:
        """``fleets/get`` by name; raises :class:`ResourceNotExistsError` if there is none."""
        return self._obj(f"/api/project/{project}/fleets/get", {"name": name})

    def fleets_get_by_id(self, project: str, fleet_id: str) -> JSONObject:
        """``fleets/get`` by id; raises :class:`ResourceNotExistsError` if there is none."""
        return self._obj(f"/api/project/{project}/fleets/get", {"id": fleet_id})

    def gpus_list(self, project: str, run_spec: JSONObject, group_by: list[str]) -> JSONObject:
        """``gpus/list``: the offers' GPUs grouped by name and memory, and by ``group_by`` (``backend``,
        ``region``, ``count``); ``{gpus: [...]}``."""
        return self._obj(f"/api/project/{project}/gpus/list", {"run_spec": run_spec, "group_by": group_by})

    # ---- exports and imports ----------------------------------------------------------------

    def exports_list(self, project: str) -> JSONObject:
        """``exports/list`` as ``{exports: [...], warnings: [...]}`` (a plain list of exports is read as one
        with no warnings)."""
        return self._listing(f"/api/project/{project}/exports/list", "exports")

    def exports_create(self, project: str, body: JSONObject) -> JSONObject:
        """``exports/create`` (``name``, ``is_global``, ``importer_projects``, ``exported_fleets``...)."""
        return self._obj(f"/api/project/{project}/exports/create", body)

    def exports_update(self, project: str, body: JSONObject) -> JSONObject:
        """``exports/update`` (``name``, ``add_importer_projects``, ``remove_exported_fleets``...)."""
        return self._obj(f"/api/project/{project}/exports/update", body)

    def exports_delete(self, project: str, name: str) -> None:
        """``exports/delete``."""
        self._post(f"/api/project/{project}/exports/delete", {"name": name})

    def imports_list(self, project: str) -> JSONObject:
        """``imports/list`` as ``{imports: [...], warnings: [...]}`` (as ``exports_list``)."""
        return self._listing(f"/api/project/{project}/imports/list", "imports")

    def _listing(self, path: str, key: str) -> JSONObject:
        data = self._post(path, None)
        if isinstance(data, list):
            return {key: data, "warnings": []}
        if not isinstance(data, dict):
            raise ServerError(f"Expected a JSON object or list from {path}, got {type(data).__name__}")
        return data

    def imports_delete(self, project: str, export_project: str, export_name: str) -> None:
        """``imports/delete`` of the import of ``export_project/export_name``."""
        body = {"export_project_name": export_project, "export_name": export_name}
        self._post(f"/api/project/{project}/imports/delete", body)

    def fleets_delete(self, project: str, names: list[str]) -> None:
        """``fleets/delete`` (a missing name is not an error)."""
        self._post(f"/api/project/{project}/fleets/delete", {"names": names})

    def fleets_delete_instances(self, project: str, name: str, instance_nums: list[int]) -> None:
        """``fleets/delete_instances``."""
        self._post(
            f"/api/project/{project}/fleets/delete_instances",
            {"name": name, "instance_nums": instance_nums},
        )

    # ---- secrets ------------------------------------------------------------------------

    def quotas_usage(self, project: str) -> JSONObject:
        """``projects/{p}/quotas/usage``: the project's nominal, max, used, borrowed and entitlement."""
        return self._obj(f"/api/projects/{project}/quotas/usage", {})

    def secrets_list(self, project: str) -> list[JSONObject]:
        """``secrets/list``: ``[{id, name, value: null}]``, newest first."""
        return self._list(f"/api/project/{project}/secrets/list")

    def secrets_get(self, project: str, name: str) -> JSONObject:
        """``secrets/get``: ``{id, name, value}``; :class:`ResourceNotExistsError` if there is none."""
        return self._obj(f"/api/project/{project}/secrets/get", {"name": name})

    def secrets_create_or_update(self, project: str, name: str, value: str) -> JSONObject:
        """``secrets/create_or_update``."""
        return self._obj(f"/api/project/{project}/secrets/create_or_update", {"name": name, "value": value})

    def secrets_delete(self, project: str, names: list[str]) -> None:
        """``secrets/delete`` (every name must exist)."""
        self._post(f"/api/project/{project}/secrets/delete", {"secrets_names": names})

    def volumes_list(self, project: str) -> list[JSONObject]:
        """``volumes/list``: the project's volumes (dstack's ``Volume``), newest first."""
        return self._list(f"/api/project/{project}/volumes/list")

    def volumes_get(self, project: str, name: str) -> JSONObject:
        """``volumes/get``; raises :class:`ResourceNotExistsError` if there is none."""
        return self._obj(f"/api/project/{project}/volumes/get", {"name": name})

    def volumes_create(self, project: str, configuration: JSONObject) -> JSONObject:
        """``volumes/create`` of a volume configuration; returns the Volume."""
        return self._obj(f"/api/project/{project}/volumes/create", {"configuration": configuration})

    def volumes_delete(self, project: str, names: list[str]) -> None:
        """``volumes/delete`` (a 400 naming a volume in use)."""
        self._post(f"/api/project/{project}/volumes/delete", {"names": names})

    # ---- gateways -----------------------------------------------------------------------

    def gateways_list(self, project: str) -> list[JSONObject]:
        """``gateways/list``: the project's gateways (dstack's ``Gateway``)."""
        return self._list(f"/api/project/{project}/gateways/list", {"include_imported": True})

    def gateways_get(self, project: str, name: str) -> JSONObject:
        """``gateways/get``; raises :class:`ResourceNotExistsError` if there is none."""
        return self._obj(f"/api/project/{project}/gateways/get", {"name": name})

    def gateways_get_plan(self, project: str, configuration: JSONObject, path: str | None) -> JSONObject:
        """``gateways/get_plan``: dstack's ``GatewayPlan`` (``action`` create or update)."""
        spec = {"configuration": configuration, "configuration_path": path}
        return self._obj(f"/api/project/{project}/gateways/get_plan", {"spec": spec})

    def gateways_apply(self, project: str, plan: JSONObject, force: bool) -> JSONObject:
        """``gateways/apply`` of a plan (its ``spec`` and ``current_resource``); returns the Gateway."""
        body = {"plan": {"spec": plan["spec"], "current_resource": plan.get("current_resource")}, "force": force}
        return self._obj(f"/api/project/{project}/gateways/apply", body)

    def gateways_delete(self, project: str, names: list[str]) -> None:
        """``gateways/delete``: marks them; the server tears them down and removes them."""
        self._post(f"/api/project/{project}/gateways/delete", {"names": names})

    def gateways_set_default(self, project: str, name: str) -> None:
        self._post(f"/api/project/{project}/gateways/set_default", {"name": name})

    def gateways_set_wildcard_domain(self, project: str, name: str, domain: str) -> JSONObject:
        body = {"name": name, "wildcard_domain": domain}
        return self._obj(f"/api/project/{project}/gateways/set_wildcard_domain", body)

    # ---- instances ----------------------------------------------------------------------

    def instances_list(
        self,
        project_names: list[str] | None = None,
        only_active: bool = False,
        limit: int = 1000,
    ) -> list[JSONObject]:
        """``instances/list``."""
        body: JSONObject = {"only_active": only_active, "limit": limit}
        if project_names is not None:
            body["project_names"] = project_names
        return self._list("/api/instances/list", body)

    # ---- repos --------------------------------------------------------------------------

    def repos_init_virtual(self, project: str) -> None:
        """``repos/init`` of the virtual repo ``none`` that runs without code use."""
        self.repos_init(project, "none", {"repo_type": "virtual"})

    def repos_init(
        self, project: str, repo_id: str, repo_info: JSONObject, repo_creds: JSONObject | None = None
    ) -> None:
        """``repos/init``: record the repo and (remote repos) this user's ``{clone_url, oauth_token?,
        private_key?}``."""
        body = {"repo_id": repo_id, "repo_info": repo_info, "repo_creds": repo_creds}
        self._post(f"/api/project/{project}/repos/init", body)

    def repos_list(self, project: str) -> list[JSONObject]:
        """``repos/list``: ``[{repo_id, repo_info}]``."""
        return self._list(f"/api/project/{project}/repos/list")

    def repos_get(self, project: str, repo_id: str, include_creds: bool = False) -> JSONObject:
        """``repos/get``; raises :class:`ResourceNotExistsError` if there is none."""
        return self._obj(f"/api/project/{project}/repos/get", {"repo_id": repo_id, "include_creds": include_creds})

    def repos_delete(self, project: str, repo_ids: list[str]) -> None:
        """``repos/delete``."""
        self._post(f"/api/project/{project}/repos/delete", {"repos_ids": repo_ids})

    def repos_upload_code(self, project: str, repo_id: str, code_hash: str, data: bytes) -> None:
        """``repos/upload_code``: the diff or archive, named by its SHA-256."""
        self._post(
            f"/api/project/{project}/repos/upload_code",
            files={"file": (code_hash, data)},
            params={"repo_id": repo_id},
        )

    # ---- files --------------------------------------------------------------------------

    def files_get_archive_by_hash(self, archive_hash: str) -> JSONObject:
        """``files/get_archive_by_hash``: ``{id, hash}``; :class:`ResourceNotExistsError` if not uploaded."""
        return self._obj("/api/files/get_archive_by_hash", {"hash": archive_hash})

    def files_upload_archive(self, archive_hash: str, data: bytes) -> JSONObject:
        """``files/upload_archive``: ``{id, hash}``."""
        return self._obj("/api/files/upload_archive", files={"file": (archive_hash, data)})

    # ---- runs ---------------------------------------------------------------------------

    def runs_get_plan(
        self,
        project: str,
        run_spec: JSONObject,
        max_offers: int | None = None,
        for_offers_only: bool = False,
    ) -> JSONObject:
        """``runs/get_plan``; returns a RunPlan."""
        body: JSONObject = {"run_spec": run_spec}
        if max_offers is not None:
            body["max_offers"] = max_offers
        if for_offers_only:
            body["for_offers_only"] = True
        return self._obj(f"/api/project/{project}/runs/get_plan", body)

    def runs_apply(self, project: str, plan: JSONObject, force: bool = False) -> JSONObject:
        """``runs/apply`` with ``plan = {run_spec, current_resource}``; returns the Run."""
        return self._obj(f"/api/project/{project}/runs/apply", {"plan": plan, "force": force})

    def runs_list(
        self,
        project: str | None,
        only_active: bool = False,
        limit: int = 100,
        job_submissions_limit: int | None = 1,
        prev_submitted_at: str | None = None,
        prev_run_id: str | None = None,
        repo_id: str | None = None,
        username: str | None = None,
        ascending: bool = False,
    ) -> list[JSONObject]:
        """``runs/list`` (newest first), with the body dstack's ``ps`` sends."""
        return self._list(
            "/api/runs/list",
            {
                "project_name": project,
                "repo_id": repo_id,
                "username": username,
                "only_active": only_active,
                "include_jobs": True,
                "job_submissions_limit": job_submissions_limit,
                "prev_submitted_at": prev_submitted_at,
                "prev_run_id": prev_run_id,
                "limit": limit,
                "ascending": ascending,
            },
        )

    def runs_get(self, project: str, run_name: str) -> JSONObject:
        """``runs/get`` by name; raises :class:`ResourceNotExistsError` if there is none."""
        return self._obj(f"/api/project/{project}/runs/get", {"run_name": run_name})

    def job_metrics(
        self, project: str, run_name: str, replica_num: int = 0, job_num: int = 0, limit: int = 1
    ) -> JSONObject:
        """``GET metrics/job/{run}``: the job's series (``{"metrics": [{name, timestamps, values}]}``), newest
        first, ``limit`` samples."""
        params = {"replica_num": replica_num, "job_num": job_num, "limit": limit}
        data = self._get(f"/api/project/{project}/metrics/job/{run_name}", params)
        if not isinstance(data, dict):
            raise ServerError(f"Expected a JSON object from metrics/job, got {type(data).__name__}")
        return data

    def runs_stop(self, project: str, names: list[str], abort: bool = False) -> None:
        """``runs/stop``: graceful, or immediate with ``abort``."""
        self._post(f"/api/project/{project}/runs/stop", {"runs_names": names, "abort": abort})

    def runs_delete(self, project: str, names: list[str]) -> None:
        """``runs/delete`` (the runs must be finished)."""
        self._post(f"/api/project/{project}/runs/delete", {"runs_names": names})

    # ---- events -------------------------------------------------------------------------

    def events_list(self, filters: JSONObject, limit: int = 100, ascending: bool = False) -> list[JSONObject]:
        """``events/list``: one page of the events ``filters`` select (dstack's field names)."""
        return self._list("/api/events/list", {**filters, "limit": limit, "ascending": ascending})

    # ---- logs ---------------------------------------------------------------------------

    def logs_poll(
        self,
        project: str,
        run_name: str,
        job_submission_id: str,
        start_time: str | None = None,
        next_token: str | None = None,
        limit: int = 1000,
        descending: bool = False,
        diagnose: bool = False,
    ) -> JSONObject:
        """``logs/poll``: ``{"logs": [{timestamp, log_source, message (base64)}], "next_token"}``.

        ``start_time`` is exclusive: only events after it are returned.
        """
        body: JSONObject = {
            "run_name": run_name,
            "job_submission_id": job_submission_id,
            "start_time": start_time,
            "end_time": None,
            "descending": descending,
            "next_token": next_token,
            "limit": limit,
            "diagnose": diagnose,
        }
        return self._obj(f"/api/project/{project}/logs/poll", body)


def _error_from_response(url: str, path: str, response: httpx.Response) -> Exception:
    status = response.status_code
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if status == 400:
        items = detail if isinstance(detail, list) else [detail]
        msgs = [_msg(item) for item in items if _msg(item)]
        codes = [item.get("code") for item in items if isinstance(item, dict)]
        code = codes[0] if codes else None
        message = "; ".join(msgs) or f"The server rejected {path}"
        if code == "resource_not_exists":
            return ResourceNotExistsError(message, code)
        return ClientError(message, code)
    if status in (401, 403):
        msg = _msg(detail)
        if status == 403 and msg and msg != "Invalid token":
            return AuthError(f"{msg} ({path} at {url})")
        return AuthError(
            f"Invalid token for {url}; run `corral project add --name NAME --url {url} --token TOKEN`"
            " with a valid token"
        )
    if status == 404:
        project = _project_of(path)
        if project is not None:
            return NotFoundError(f"Project {project} not found at {url}")
        return NotFoundError(f"Not found: {path} at {url}")
    if status == 422:
        items = detail if isinstance(detail, list) else [detail]
        return ValidationError([_validation_line(item) for item in items])
    if status == 507:  # the server's disk is full: its message says where, how much is free and what to do
        items = detail if isinstance(detail, list) else [detail]
        said = "; ".join(m for m in (_msg(item) for item in items) if m)
        return ServerError(f"{said or 'The server has no space left'} ({path} at {url})", status)
    text = response.text.strip().replace("\n", " ")[:300]
    return ServerError(f"Server error {status} on {path} at {url}: {text}", status)


def _msg(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("msg") or "")
    if isinstance(item, str):
        return item
    return ""


def _validation_line(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    loc = [str(part) for part in item.get("loc") or []]
    if loc and loc[0] == "body":
        loc = loc[1:]
    msg = str(item.get("msg") or "invalid")
    return f"{'.'.join(loc)}: {msg}" if loc else msg


def _project_of(path: str) -> str | None:
    parts = path.strip("/").split("/")
    if (
        len(parts) >= 3
        and parts[0] == "api"
        and parts[1] in ("project", "projects")
        and parts[2] not in ("list", "create", "delete")
    ):
        return parts[2]
    return None
