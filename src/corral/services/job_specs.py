"""A run's job specs: dstack 0.22.5's ``JobSpec`` documents built from a typed run spec (``RunSpec``): one
per node, or per replica for services (with one template per replica group); a dev environment's
commands. ``derive`` builds them once for a run name, as ``runs/get_plan`` shows them and ``runs/apply``
stores them. Pure but for the configuration models."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from corral.config.run_spec import RunSpec
from corral.scheduler import offer_filters
from corral.services import dev_env, python_env, service_runs

DEFAULT_IMAGE = "dstackai/base:0.16-base-ubuntu24.04"
#: dstack 0.22.5's image for ``docker: true`` (``DSTACK_DIND_IMAGE``, src/dstack/_internal/settings.py) and the
#: command its job configurator puts before the run's own (``_dstack_image_commands``,
#: src/dstack/_internal/server/services/jobs/configurators/base.py): the image's script that starts dockerd.
DIND_IMAGE = "dstackai/dind"
DIND_START = ("start-dockerd",)
LEGACY_REPO_DIR = "/workflow"


def _retry_json(retry: Any) -> dict[str, Any] | None:
    if retry is None or retry is False:
        return None
    if retry is True:
        return {"on_events": ["no-capacity", "interruption", "error"], "duration": 3600}
    events = retry.on_events or ["no-capacity", "interruption", "error"]
    return {
        "on_events": [getattr(e, "value", e) for e in events],
        "duration": int(retry.duration) if retry.duration is not None else 3600,
    }


def _duration(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _utilization_json(policy: Any) -> dict[str, int] | None:
    """dstack's ``job_spec.utilization_policy`` (``time_window`` in seconds)."""
    if policy is None:
        return None
    return {"min_gpu_utilization": int(policy.min_gpu_utilization), "time_window": int(policy.time_window)}


def _working_dir(working_dir: str | None) -> str | None:
    """dstack's JobSpec ``working_dir``: absolute or None; a relative one (pre-0.20) is under ``/workflow``.
    (The agent runs a relative ``working_dir`` relative to the repo dir; see ``corral.agent.workdir``.)"""
    if working_dir is None or working_dir.startswith("/"):
        return working_dir
    return posixpath.join(LEGACY_REPO_DIR, working_dir)


def _unix_user(user: str | None) -> dict[str, Any] | None:
    """dstack's ``UnixUser`` of a ``user[:group]`` (names or ids) configuration value."""
    if not user:
        return None
    name, _, group = user.partition(":")
    out: dict[str, Any] = {"uid": None, "gid": None, "username": None, "groupname": None}
    out.update({"uid": int(name)} if name.isdigit() else {"username": name})
    if group:
        out.update({"gid": int(group)} if group.isdigit() else {"groupname": group})
    return out


def _app_specs(ports: list[Any]) -> list[dict[str, Any]]:
    """dstack's ``app_specs``: the ports the attached CLI forwards (its own 10000-10999 left out)."""
    kept = [p for p in ports if isinstance(p, dict) and not 10000 <= int(p.get("container_port") or 0) <= 10999]
    return [
        {"port": p["container_port"], "map_to_port": p.get("local_port"), "app_name": f"app_{i}", "url_path": None,
         "url_query_params": None}
        for i, p in enumerate(kept)
    ]  # fmt: skip


def node_layout(c: dict[str, Any]) -> list[tuple[int, dict[str, Any], int]]:
    """(group index, group, index in the group) of each node, in ``job_num`` order: a task's ``groups``
    (each with its own ``nodes``, ``commands``, ``ports`` and ``resources``), else one group of the
    configuration's ``nodes`` (1 for other run types)."""
    groups = c.get("groups") if c.get("type") == "task" else None
    if groups:
        return [(gi, g, j) for gi, g in enumerate(groups) for j in range(int(g.get("nodes") or 1))]
    nodes = int(c.get("nodes") or 1) if c.get("type") == "task" else 1
    whole = {"name": "0", "commands": c.get("commands"), "ports": c.get("ports"), "resources": c.get("resources")}
    return [(0, whole, j) for j in range(nodes)]


@dataclass(frozen=True)
class JobSpecs:
    """A run's job specs, derived once from its ``RunSpec`` (``derive``)."""

    #: One per node (one per replica of every group for a service, ``replicas.min`` of each).
    jobs: list[dict[str, Any]]
    #: A service's one template per replica group (``service_runs.group_templates``); empty for other types.
    templates: list[dict[str, Any]]

    @property
    def first(self) -> dict[str, Any] | None:
        return self.jobs[0] if self.jobs else None


def derive(
    spec: RunSpec,
    run_name: str,
    default_image: str | None = None,
    ide_download_url: str | None = None,
    dind_image: str = DIND_IMAGE,
) -> JobSpecs:
    """The run's job specs and, of a service, its replica-group templates, from one build of the node specs
    (``dind_image``: the image of a ``docker: true`` run)."""
    nodes = _node_specs(spec, run_name, default_image, ide_download_url, dind_image)
    conf = spec.conf
    if conf.type == "service":
        return JobSpecs(
            service_runs.replica_job_specs(run_name, nodes[0], conf),
            service_runs.group_templates(run_name, nodes[0], conf),
        )
    return JobSpecs(nodes, [])


def _node_specs(
    spec: RunSpec, run_name: str, default_image: str | None, ide_download_url: str | None, dind_image: str
) -> list[dict[str, Any]]:
    """One job spec per node (a service's one node: the base of its replicas' and templates')."""
    conf, merged, document = spec.conf, spec.merged, spec.document
    c = spec.configuration
    layout = node_layout(c)
    nodes = len(layout)
    repo_specs = c.get("repos") or []
    out = []
    for i, (group_index, group, job_index) in enumerate(layout):
        out.append(
            {
                "replica_num": 0,
                "job_num": i,
                "job_name": f"{run_name}-{i}-0",
                "jobs_per_replica": nodes,
                "replica_group": "0",
                "app_specs": _app_specs(group.get("ports") or []),
                "user": _unix_user(conf.user),
                "commands": [
                    *(DIND_START if conf.docker is True else ()),
                    *python_env.prelude(c, c.get("python")),
                    *(
                        dev_env.commands(c, run_name, ide_download_url)
                        if conf.type == "dev-environment"
                        else list(group.get("commands") or [])
                    ),
                ],
                "env": dict(c.get("env") or {}),
                "home_dir": conf.home_dir or "/root",
                "image_name": dind_image
                if conf.docker is True
                else python_env.image_name(c, default_image, DEFAULT_IMAGE),
                "privileged": bool(conf.privileged) or conf.docker is True,
                "single_branch": conf.single_branch
                if conf.single_branch is not None
                else conf.type != "dev-environment",
                "max_duration": _duration(merged.max_duration),
                "stop_duration": _duration(merged.stop_duration),
                "utilization_policy": _utilization_json(merged.utilization_policy),
                "registry_auth": c.get("registry_auth"),
                "requirements": {
                    "resources": group.get("resources"),
                    "max_price": merged.max_price,
                    "spot": offer_filters.spot_of(merged.spot_policy),
                    "reservation": merged.reservation,
                    "multinode": nodes > 1,
                },
                "retry": _retry_json(merged.retry),
                "volumes": [],
                "ssh_key": None,
                "working_dir": _working_dir(conf.working_dir),
                "repo_data": document["repo_data"],
                "repo_code_hash": document["repo_code_hash"],
                "repo_dir": repo_specs[0]["path"] if repo_specs else document.get("repo_dir") or LEGACY_REPO_DIR,
                "repo_exists_action": repo_specs[0]["if_exists"] if repo_specs else None,
                "file_archives": list(document.get("file_archives") or []),
                "service_port": None,
                "probes": [],
                "node_group_index": group_index,
                "node_group_name": str(group.get("name") or "0"),
                "node_group_job_index": job_index,
            }
        )
    return out
