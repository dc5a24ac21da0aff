"""The workloads, run the same way against either server; each appends one value per repeat to
``Results`` under a figure key (``main`` turns them into medians and the table).

Runs use the seed scenario's task body without ``image`` and ``fleets``, applied in a
project with no fleet, so both servers take the same path: accept the run, then fail it for lack of a
fleet. Every repeat of a write workload gets a project of its own, so each starts from the same state
and the list workloads see exactly ``--requests`` runs (or fleets) in their project. corral's
``local`` workload repeats the run workload, on a fresh server of its own, in a project whose local fleet
really runs the jobs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime
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


def const(body: dict[str, Any]) -> Callable[[int], dict[str, Any]]:
    """The same body for every request."""
    return lambda _i: body


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
    settle: float = 5.0  # idle seconds over which idle CPU and then idle RSS are read
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


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle(res: Results, srv: Running, o: Options) -> None:
    """Idle RSS and idle CPU over ``o.settle`` seconds right after start-up."""
    cpu0 = _cpu_s(srv.proc.pid)
    time.sleep(o.settle)
    res.add("idle_cpu_pct", (_cpu_s(srv.proc.pid) - cpu0) / o.settle * 100)
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


Steps = Generator[None, None, None]


class Bench:
    """Every selected workload against one server; ``steps()`` yields between measured steps so that
    ``main`` can interleave the two servers' steps (a change in the machine's background load then
    hits both alike). Only one step runs at a time; the other server idles meanwhile."""

    def __init__(self, fl: Flavour, o: Options, only: set[str]) -> None:
        self.fl, self.o, self.only = fl, o, only
        self.res = Results()
        self.srv: Running | None = None

    def say(self, msg: str) -> None:
        _say(self.fl.kind, msg)

    def load(self, prefix: str, path: str, body: Callable[[int], Any], n: int) -> None:
        assert self.srv is not None
        cpu0 = _cpu_s(self.srv.proc.pid)
        r = run_load(self.srv.url, self.srv.token, path, body, n, self.o.concurrency)
        # the server's CPU per request: steadier than req/s on a machine shared with other work
        server_cpu_ms = (_cpu_s(self.srv.proc.pid) - cpu0) * 1000 / max(1, r.requests)
        self.res.add_load(prefix, r)
        self.res.add(f"{prefix}_cpu_ms", server_cpu_ms)
        self.say(
            f"{prefix}: {r.rps:.1f} req/s, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms, "
            f"{r.response_bytes / r.requests / 1024:.0f} KiB/resp, client CPU {r.client_cpu_share:.2f} cores, "
            f"server CPU {server_cpu_ms:.1f} ms/request"
        )

    def steps(self) -> Steps:
        t_all = time.perf_counter()
        main_work = self.only - {"local"}
        try:
            if "start" in self.only:
                yield from self.starts()
            elif main_work:
                self.fl.fresh()
                self.srv = start(self.fl)
                _idle(self.res, self.srv, self.o)
            srv = self.srv
            if srv is not None:
                with Api(srv.url, srv.token) as api, PeakSampler(srv.proc.pid) as sampler:
                    if self.only & {"apply", "list"}:
                        yield from self.runs(api)
                    if "fleets" in self.only:
                        yield from self.fleets(api)
                    if "cli" in self.only:
                        yield from self.cli()
                    self.res.add("rss_peak_mb", max(sampler.peak()[0], tree_rss(srv.proc.pid).server_kib) / 1024)
                    self.res.add("rss_hwm_mb", hwm_kib(srv.proc.pid) / 1024)
                self.res.add("stop_s", stop(srv))
                self.srv = None
            if "local" in self.only and self.fl.kind == "corral":
                # a server of its own, so that the other workloads' fleets and runs do not weigh on it
                projects = tuple(f"local{r}" for r in range(self.o.repeats))
                local = Flavour(
                    self.fl.kind, self.fl.root / "local-fleet", self.fl.dstack_venv, local_projects=projects
                )
                local.fresh()
                self.srv = start(local)
                with Api(self.srv.url, self.srv.token) as api, PeakSampler(self.srv.proc.pid) as sampler:
                    yield from self.local(api, sampler)
        finally:
            if self.srv is not None:
                self.res.add("stop_s", stop(self.srv))
                self.srv = None
        self.say(f"done in {time.perf_counter() - t_all:.0f} s")

    def starts(self) -> Steps:
        """Cold starts (fresh state each), warm starts (existing state); leaves the last one running."""
        for _ in range(self.o.repeats):
            self.fl.fresh()
            self.srv = start(self.fl)
            self.say(f"cold start {self.srv.startup_s:.2f} s")
            self.res.add("start_cold_s", self.srv.startup_s)
            self.res.add("stop_s", stop(self.srv))
            self.srv = None
            yield
        for i in range(self.o.repeats):
            self.srv = start(self.fl)
            self.say(f"warm start {self.srv.startup_s:.2f} s")
            self.res.add("start_warm_s", self.srv.startup_s)
            _idle(self.res, self.srv, self.o)
            if i < self.o.repeats - 1:
                self.res.add("stop_s", stop(self.srv))
                self.srv = None
            yield

    def runs(self, api: Api) -> Steps:
        o = self.o
        for r in range(o.repeats):
            project = f"apply{r}"
            api.post("/api/projects/create", {"project_name": project})
            self.load("apply", f"/api/project/{project}/runs/apply", const(APPLY_RUN), o.requests)
            drained = _drain(api, project, o.drain_timeout)
            if drained is None:
                self.say(f"runs of {project} still active after {o.drain_timeout:.0f} s")
            else:
                self.res.add("apply_drain_s", drained)
                self.say(f"all runs of {project} finished {drained:.1f} s after the last apply")
            yield
        if "list" in self.only:
            body = {"project_name": "apply0", "limit": 100}
            ps = ps_body("apply0")
            for _ in range(o.repeats):
                self.load("list", "/api/runs/list", const(body), o.list_requests)
                yield
                self.load("ps", "/api/runs/list", const(ps), o.list_requests)
                yield

    def fleets(self, api: Api) -> Steps:
        o = self.o
        for r in range(o.repeats):
            project = f"fleets{r}"
            api.post("/api/projects/create", {"project_name": project})
            path = f"/api/project/{project}/fleets/apply"
            self.load("fleet_apply", path, lambda i: fleet_body(f"f{i}"), o.fleets)
            yield
        for _ in range(o.repeats):
            body = {"include_imported": True}
            self.load("fleet_list", "/api/project/fleets0/fleets/list", const(body), o.list_requests)
            yield

    def cli(self) -> Steps:
        fl, res, srv = self.fl, self.res, self.srv
        assert srv is not None
        n = max(self.o.repeats, 5)
        for _ in range(n):
            res.add("cli_help_s", run_cli(fl, "--help")[0])
        self.say(f"--help {min(res['cli_help_s']):.2f}..{max(res['cli_help_s']):.2f} s")
        yield
        project = "apply0" if self.only & {"apply", "list"} else "main"
        run_cli(fl, "project", "add", "--name", project, "--url", srv.url, "--token", srv.token, "-y")
        for args, key in ((("ps",), "cli_ps_s"), (("ps", "-a"), "cli_ps_all_s")):
            for _ in range(n):
                took, out = run_cli(fl, *args)
                res.add(key, took)
            lines = len(out.stdout.splitlines())
            self.say(f"{' '.join(args)}: {min(res[key]):.2f}..{max(res[key]):.2f} s ({lines} lines)")
            yield

    def local(self, api: Api, sampler: PeakSampler) -> Steps:
        """corral only: the run workload in a project whose local fleet runs the jobs (one project and
        fleet per repeat; the list workloads run in the first, with ``--requests`` runs queued)."""
        o, res, srv = self.o, self.res, self.srv
        assert srv is not None
        for r in range(o.repeats):
            project = f"local{r}"  # made at start, with the local backend, by the server's config.yml
            api.post(f"/api/project/{project}/fleets/apply", fleet_body("local", f"0..{os.cpu_count() or 1}"))
            sampler.reset()
            t0_wall = time.time()
            self.load("local_apply", f"/api/project/{project}/runs/apply", const(APPLY_RUN), o.requests)
            if r == 0:
                body = {"project_name": project, "limit": 100}
                self.load("local_list", "/api/runs/list", const(body), o.list_requests)
                self.load("local_ps", "/api/runs/list", const(ps_body(project)), o.list_requests)
            # evidence that the fleet really runs the jobs: the oldest runs finish (`date; sleep 6; date`)
            done_at, deadline = None, time.perf_counter() + 60
            oldest = {"project_name": project, "limit": 10, "ascending": True, "job_submissions_limit": 1}
            while time.perf_counter() < deadline and done_at is None:
                finished = [
                    _epoch(run["latest_job_submission"]["finished_at"])
                    for run in api.post("/api/runs/list", oldest)
                    if run["status"] == "done" and run.get("latest_job_submission")
                ]
                if finished:
                    done_at = min(finished) - t0_wall
                else:
                    time.sleep(0.5)
            t = tree_rss(srv.proc.pid)
            server_peak, agents_peak, _ = sampler.peak()
            res.add("local_server_peak_mb", server_peak / 1024)
            res.add("local_agents_mb", t.agents_kib / 1024)
            res.add("local_agents_peak_mb", agents_peak / 1024)
            res.add("local_agents", t.agents)
            if done_at is None:
                self.say(f"no run of {project} finished within 60 s: the local fleet did not run jobs")
                res.add("local_no_run_done", 1)
            else:
                res.add("local_first_done_s", done_at)
                self.say(f"{project}: the first run was done {done_at:.1f} s after the first apply; {t.agents} agents")
            t_clean = time.perf_counter()
            _stop_all(api, project)
            api.post(f"/api/project/{project}/fleets/delete", {"names": ["local"]})
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline:
                insts = api.post("/api/instances/list", {"project_names": [project]})
                if all(i["status"] == "terminated" for i in insts):
                    break
                time.sleep(0.25)
            self.say(f"{project}: runs stopped and fleet gone in {time.perf_counter() - t_clean:.1f} s")
            yield


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _stop_all(api: Api, project: str, timeout: float = 120.0) -> None:
    """Abort every run of ``project`` (all pages), then wait until none is active."""
    names: list[str] = []
    page: dict[str, Any] = {"project_name": project, "limit": 100, "job_submissions_limit": 0}
    while batch := api.post("/api/runs/list", page):
        names += [run["run_spec"]["run_name"] for run in batch]
        page = {**page, "prev_submitted_at": batch[-1]["submitted_at"], "prev_run_id": batch[-1]["id"]}
    for i in range(0, len(names), 100):
        api.post(f"/api/project/{project}/runs/stop", {"runs_names": names[i : i + 100], "abort": True})
    _drain(api, project, timeout)


def interleave(benches: list[Bench]) -> None:
    """Run the benches' steps alternately until all are done; on an error every server is stopped."""
    gens = [b.steps() for b in benches]
    active = list(gens)
    try:
        while active:
            for g in list(active):
                try:
                    next(g)
                except StopIteration:
                    active.remove(g)
    finally:
        for g in gens:
            g.close()
