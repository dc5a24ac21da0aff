"""Test doubles for the CLI tests: a fake API client and builders of runs (dstack wire shapes)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from corral.sdk.errors import ResourceNotExistsError

JSON = dict[str, Any]
NOW = "2026-11-29T22:03:48.350884Z"


def submission(status: str, **extra: Any) -> JSON:
    sub = {
        "id": "sub-1",
        "submission_num": 0,
        "submitted_at": NOW,
        "last_processed_at": NOW,
        "finished_at": None,
        "status": status,
        "status_message": "",
        "termination_reason": None,
        "termination_reason_message": None,
        "exit_status": None,
        "job_provisioning_data": None,
        "job_runtime_data": None,
        "error": None,
    }
    sub.update(extra)
    return sub


def make_run(name: str, status: str, sub: JSON | None = None, **extra: Any) -> JSON:
    sub = sub or submission(status)
    result = {
        "id": f"id-{name}",
        "project_name": "main",
        "user": "admin",
        "submitted_at": NOW,
        "last_processed_at": NOW,
        "status": status,
        "status_message": extra.pop("status_message", status),
        "termination_reason": None,
        "run_spec": {"run_name": name, "configuration": {"type": "task"}},
        "jobs": [
            {
                "job_spec": {"replica_num": 0, "job_num": 0, "job_name": f"{name}-0-0"},
                "job_submissions": [sub],
            }
        ],
        "latest_job_submission": sub,
        "cost": 0.0,
        "error": None,
    }
    result.update(extra)
    return result


JPD = {
    "backend": "remote",
    "corral_backend": "local",
    "corral_instance": "gpu-fleet-0",
    "region": None,
    "price": 0.0,
    "instance_type": {
        "name": "local",
        "resources": {
            "cpus": 16,
            "memory_mib": 131072,
            "gpus": [{"name": "H200", "memory_mib": 143771, "vendor": "nvidia"}],
            "spot": False,
            "disk": {"size_mib": 65536},
            "cpu_arch": None,
        },
    },
}


class FakeClient:
    """Stands in for CorralClient: canned answers, recorded calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.runs: dict[str, list[JSON]] = {}  # name -> successive runs/get answers
        self.run_list: list[JSON] = []
        self.finished_list: list[JSON] = []
        self.fleets: list[JSON] = []
        self.logs: list[bytes] = []
        self.run_plan: JSON = {}
        self.fleet_plan: JSON = {}
        self.archives: dict[str, str] = {}  # hash -> id of the archives "on the server"
        self.metrics: JSON = {"metrics": []}  # the metrics/job answer
        self.usage: JSON = {}  # the quotas/usage answer

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def quotas_usage(self, project: str) -> JSON:
        self._record("quotas_usage", project)
        return self.usage

    def repos_init_virtual(self, project: str) -> None:
        self._record("repos_init_virtual", project)

    def repos_init(self, project: str, repo_id: str, repo_info: JSON, repo_creds: JSON | None = None) -> None:
        self._record("repos_init", project, repo_id, repo_info, repo_creds)

    def repos_upload_code(self, project: str, repo_id: str, code_hash: str, data: bytes) -> None:
        self._record("repos_upload_code", project, repo_id, code_hash, data)

    def files_get_archive_by_hash(self, archive_hash: str) -> JSON:
        self._record("files_get_archive_by_hash", archive_hash)
        if archive_hash not in self.archives:
            raise ResourceNotExistsError("No such archive", "resource_not_exists")
        return {"id": self.archives[archive_hash], "hash": archive_hash}

    def files_upload_archive(self, archive_hash: str, data: bytes) -> JSON:
        self._record("files_upload_archive", archive_hash, data)
        self.archives[archive_hash] = f"archive-{len(self.archives) + 1}"
        return {"id": self.archives[archive_hash], "hash": archive_hash}

    def runs_get_plan(self, project: str, run_spec: JSON, **kw: Any) -> JSON:
        self._record("runs_get_plan", project, run_spec, **kw)
        return self.run_plan

    def runs_apply(self, project: str, plan: JSON, force: bool = False) -> JSON:
        self._record("runs_apply", project, plan, force=force)
        name = plan["run_spec"]["run_name"]
        return self.runs[name][0]

    def job_metrics(self, project: str, run_name: str, replica_num: int = 0, job_num: int = 0, limit: int = 1) -> JSON:
        self._record("job_metrics", project, run_name, replica_num, job_num, limit)
        return self.metrics

    def runs_get(self, project: str, run_name: str) -> JSON:
        self._record("runs_get", project, run_name)
        answers = self.runs.get(run_name)
        if not answers:
            raise ResourceNotExistsError("Run not found", "resource_not_exists")
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def runs_list(self, project: str, only_active: bool = False, limit: int = 100, **kw: Any) -> list[JSON]:
        self._record("runs_list", project, only_active=only_active, limit=limit)
        if only_active:
            return self.run_list
        return (self.run_list + self.finished_list)[:limit]

    def runs_stop(self, project: str, names: list[str], abort: bool = False) -> None:
        self._record("runs_stop", project, names, abort=abort)

    def runs_delete(self, project: str, names: list[str]) -> None:
        self._record("runs_delete", project, names)

    def logs_poll(self, project: str, run_name: str, job_submission_id: str, **kw: Any) -> JSON:
        self._record("logs_poll", project, run_name, job_submission_id, **kw)
        events = [
            {
                "timestamp": f"2026-11-29T22:03:{50 + i}Z",
                "log_source": "stdout",
                "message": base64.b64encode(b).decode(),
            }
            for i, b in enumerate(self.logs)
        ]
        start = kw.get("start_time")
        if start:
            events = [e for e in events if e["timestamp"] > start]
        return {"logs": events, "next_token": None}

    def fleets_list(self, project: str, include_imported: bool = True) -> list[JSON]:
        self._record("fleets_list", project)
        return self.fleets

    def fleets_get_plan(self, project: str, spec: JSON) -> JSON:
        self._record("fleets_get_plan", project, spec)
        return self.fleet_plan

    def fleets_apply(self, project: str, plan: JSON, force: bool = False) -> JSON:
        self._record("fleets_apply", project, plan, force=force)
        return self.fleets[0]

    def fleets_get(self, project: str, name: str) -> JSON:
        self._record("fleets_get", project, name)
        for fleet in self.fleets:
            if fleet["name"] == name:
                return fleet
        raise ResourceNotExistsError("Fleet not found", "resource_not_exists")

    def fleets_delete(self, project: str, names: list[str]) -> None:
        self._record("fleets_delete", project, names)

    def fleets_delete_instances(self, project: str, name: str, nums: list[int]) -> None:
        self._record("fleets_delete_instances", project, name, nums)


@dataclass
class Result:
    code: int
    out: str
    err: str
