"""The workloads, run the same way against either server; each appends one value per repeat to
``Results`` under a figure key (``main`` turns them into medians and the table).

Runs use the seed's body (/work/shared/seeds/000_*) without ``image`` and ``fleets``, applied in a
project with no fleet, so both servers take the same path: accept the run, then fail it for lack of a
fleet. Every repeat of a write workload gets a project of its own, so each starts from the same state
and the list workloads see exactly ``--requests`` runs (or fleets) in their project. corral's
``local`` workload repeats the run workload in a project whose local fleet really runs the jobs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchlib.load import Api, LoadResult, run_load
from benchlib.procs import PeakSampler, hwm_kib, tree_rss
from benchlib.servers import Flavour, Running, run_cli, start, stop

WORKLOADS = ("start", "apply", "list", "fleets", "cli", "local")

RUN_CONF: dict[str, Any] = {
    "type": "task",
    "creation_policy": "reuse-or-create",
    "commands": ["date", "sleep 6", "date"],
}
APPLY_RUN = {"force": True, "plan": {"run_spec": {"configuration": RUN_CONF}}}


def ps_body(project: str) -> dict[str, Any]:
    """What ``dstack ps`` sends (captured from the real CLI)."""
    return {
        "project_name": project,
        "repo_id": None,
        "username": None,
        "only_active": True,
        "include_jobs": True,
        "job_submissions_limit": 1,
        "prev_submitted_at": None,
        "prev_run_id": None,
        "limit": 100,
        "ascending": False,
    }


def fleet_body(name: str, nodes: str = "0..3") -> dict[str, Any]:
    conf = {"type": "fleet", "name": name, "nodes": nodes, "resources": {"cpu": "1.."}}
    return {"force": True, "plan": {"spec": {"configuration": conf, "profile": {}}}}


@dataclass
class Options:
    repeats: int = 3
    requests: int = 500  # runs/apply requests per repeat (= runs in the listed project)
    list_requests: int = 200  # requests per repeat of each list workload
    fleets: int = 100  # fleets/apply requests per repeat
    concurrency: int = 8
    settle: float = 3.0  # idle seconds before reading idle RSS
    drain_timeout: float = 300.0  # how long to wait for applied runs to finish


class Results(dict[str, list[float]]):
    def add(self, key: str, value: float) -> None:
        self.setdefault(key, []).append(value)

    def add_load(self, prefix: str, r: LoadResult) -> None:
        self.add(f"{prefix}_rps", r.rps)
        self.add(f"{prefix}_p50", r.p50_ms)
        self.add(f"{prefix}_p99", r.p99_ms)
        self.add(f"{prefix}_client_cpu", r.client_cpu_share)
        self.add(f"{prefix}_errors", r.errors)
        if r.first_error:
            print(f"    {r.errors} errors; first: {r.first_error}", file=sys.stderr)


def _say(kind: str, msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {kind}: {msg}", file=sys.stderr, flush=True)


def _load(res: Results, prefix: str, srv: Running, path: str, body: Callable[[int], Any], n: int, o: Options) -> None:
    r = run_load(srv.url, srv.token, path, body, n, o.concurrency)
    res.add_load(prefix, r)
    _say(
        srv.flavour.kind,
        f"{prefix}: {r.rps:.1f} req/s, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms, "
        f"{r.response_bytes / r.requests / 1024:.0f} KiB/resp, client CPU {r.client_cpu_share:.2f} cores",
    )


def _idle_rss(res: Results, srv: Running, o: Options) -> None:
    time.sleep(o.settle)
    t = tree_rss(srv.proc.pid)
    res.add("rss_idle_mb", t.server_kib / 1024)
    res.add("rss_idle_tree_mb", t.total_kib / 1024)


def _drain(api: Api, project: str, timeout: float) -> float | None:
    """Seconds until no run of ``project`` is active, or None on timeout."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if not api.post("/api/runs/list", {"project_name": project, "only_active": True, "limit": 1}):
            return time.perf_counter() - t0
        time.sleep(0.25)
    return None


def bench_starts(fl: Flavour, res: Results, o: Options) -> Running:
    """Cold starts (fresh state each), warm starts (existing state); leaves the last one running."""
    for _ in range(o.repeats):
        fl.fresh()
        srv = start(fl)
        res.add("start_cold_s", srv.startup_s)
        res.add("stop_s", stop(srv))
        _say(fl.kind, f"cold start {srv.startup_s:.2f} s")
    for i in range(o.repeats):
        srv = start(fl)
        res.add("start_warm_s", srv.startup_s)
        _say(fl.kind, f"warm start {srv.startup_s:.2f} s")
        _idle_rss(res, srv, o)
        if i < o.repeats - 1:
            res.add("stop_s", stop(srv))
    return srv


def bench_runs(srv: Running, api: Api, res: Results, o: Options, only: set[str]) -> None:
    kind = srv.flavour.kind
    for r in range(o.repeats):
        project = f"apply{r}"
        api.post("/api/projects/create", {"project_name": project})
        _load(res, "apply", srv, f"/api/project/{project}/runs/apply", lambda i: APPLY_RUN, o.requests, o)
        drained = _drain(api, project, o.drain_timeout)
        if drained is None:
            _say(kind, f"runs of {project} still active after {o.drain_timeout:.0f} s")
        else:
            res.add("apply_drain_s", drained)
            _say(kind, f"all runs of {project} finished {drained:.1f} s after the last apply")
        if "list" in only and r == 0:
            for _ in range(o.repeats):
                body = {"project_name": project, "limit": 100}
                _load(res, "list", srv, "/api/runs/list", lambda i, b=body: b, o.list_requests, o)  # type: ignore[misc]
            for _ in range(o.repeats):
                body = ps_body(project)
                _load(res, "ps", srv, "/api/runs/list", lambda i, b=body: b, o.list_requests, o)  # type: ignore[misc]


def bench_fleets(srv: Running, api: Api, res: Results, o: Options) -> None:
    for r in range(o.repeats):
        project = f"fleets{r}"
        api.post("/api/projects/create", {"project_name": project})
        path = f"/api/project/{project}/fleets/apply"
        _load(res, "fleet_apply", srv, path, lambda i: fleet_body(f"f{i}"), o.fleets, o)
    path = "/api/project/fleets0/fleets/list"
    for _ in range(o.repeats):
        _load(res, "fleet_list", srv, path, lambda i: {"include_imported": True}, o.list_requests, o)


def bench_cli(fl: Flavour, srv: Running, res: Results, o: Options, only: set[str]) -> None:
    for _ in range(max(o.repeats, 5)):
        took, _out = run_cli(fl, "--help")
        res.add("cli_help_s", took)
    _say(fl.kind, f"--help {min(res['cli_help_s']):.2f}..{max(res['cli_help_s']):.2f} s")
    project = "apply0" if only & {"apply", "list"} else "main"
    run_cli(fl, "project", "add", "--name", project, "--url", srv.url, "--token", srv.token, "-y")
    for args, key in ((("ps",), "cli_ps_s"), (("ps", "-a"), "cli_ps_all_s")):
        for _ in range(max(o.repeats, 5)):
            took, out = run_cli(fl, *args)
            res.add(key, took)
        lines = len(out.stdout.splitlines())
        _say(fl.kind, f"{' '.join(args)}: {min(res[key]):.2f}..{max(res[key]):.2f} s ({lines} lines)")


def bench_local(srv: Running, api: Api, res: Results, o: Options, sampler: PeakSampler) -> None:
    """corral only: the run workload in a project whose local fleet runs the jobs."""
    kind = srv.flavour.kind
    for r in range(o.repeats):
        project = f"local{r}"
        api.post("/api/projects/create", {"project_name": project})
        api.post(f"/api/project/{project}/fleets/apply", fleet_body("local", f"0..{os.cpu_count() or 1}"))
        sampler.reset()
        t0 = time.perf_counter()
        _load(res, "local_apply", srv, f"/api/project/{project}/runs/apply", lambda i: APPLY_RUN, o.requests, o)
        _load(res, "local_list", srv, "/api/runs/list", lambda i: {"project_name": project}, o.list_requests, o)
        _load(res, "local_ps", srv, "/api/runs/list", lambda i: ps_body(project), o.list_requests, o)
        done_at = None
        while time.perf_counter() - t0 < 60 and done_at is None:
            runs = api.post("/api/runs/list", {"project_name": project, "limit": 100, "job_submissions_limit": 1})
            if any(run["status"] == "done" for run in runs):
                done_at = time.perf_counter() - t0
            else:
                time.sleep(0.5)
        t = tree_rss(srv.proc.pid)
        server_peak, agents_peak, _ = sampler.peak()
        res.add("local_server_peak_mb", server_peak / 1024)
        res.add("local_agents_mb", t.agents_kib / 1024)
        res.add("local_agents_peak_mb", agents_peak / 1024)
        res.add("local_agents", t.agents)
        _say(kind, f"{project}: first run done {done_at or -1:.1f} s after the first apply; {t.agents} agents")
        if done_at is None:
            _say(kind, f"no run of {project} finished within 60 s: the local fleet did not run jobs")
        # clean up: stop every active run, delete the fleet, wait for its instances to go
        while active := api.post("/api/runs/list", {"project_name": project, "only_active": True}):
            names = [run["run_spec"]["run_name"] for run in active]
            api.post(f"/api/project/{project}/runs/stop", {"runs_names": names, "abort": True})
            time.sleep(0.2)
        api.post(f"/api/project/{project}/fleets/delete", {"names": ["local"]})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            insts = api.post("/api/instances/list", {"project_names": [project]})
            if all(i["status"] == "terminated" for i in insts):
                break
            time.sleep(0.25)


def bench(fl: Flavour, res: Results, o: Options, only: set[str]) -> None:
    """Every selected workload against one server (``fl``), which is stopped at the end."""
    t_all = time.perf_counter()
    if "start" in only:
        srv = bench_starts(fl, res, o)
    else:
        fl.fresh()
        srv = start(fl)
        _idle_rss(res, srv, o)
    try:
        with Api(srv.url, srv.token) as api, PeakSampler(srv.proc.pid) as sampler:
            if "apply" in only or "list" in only:
                bench_runs(srv, api, res, o, only | {"apply"})
            if "fleets" in only:
                bench_fleets(srv, api, res, o)
            if "cli" in only:
                bench_cli(fl, srv, res, o, only)
            res.add("rss_peak_mb", sampler.peak()[0] / 1024)
            res.add("rss_hwm_mb", hwm_kib(srv.proc.pid) / 1024)
            if "local" in only and fl.kind == "corral":
                bench_local(srv, api, res, o, sampler)
    finally:
        res.add("stop_s", stop(srv))
    _say(fl.kind, f"done in {time.perf_counter() - t_all:.0f} s")
