#!/usr/bin/env python3
"""corral end to end on a machine with a real NVIDIA GPU: one short run, one screen of report.

    python3 scripts/gpu_check.py OUT_DIR [--load-seconds 60] [--policy-window 30] [--fake-bin DIR]

What it checks (``docs/dev/gpu-check.md`` says how to run it and what each line means): that ``import torch``
sees the GPU; the server on its embedded default (SQLite, the local backend, the sandbox as the machine
allows, which it records); ``runs/get_plan`` of ``gpu: <the GPU's name>:1`` offers the local instance with
the name, memory and count ``nvidia-smi`` reports, and ``gpu: A100`` gets no offer and a message; a ``gpu: 1``
task that prints ``nvidia-smi -L`` and ``CUDA_VISIBLE_DEVICES`` and runs a bf16 matmul ends ``done`` with the
device in its logs; ``metrics/job`` during the matmul (GPU utilisation over 50 % in a sample, memory used)
and the Prometheus GPU series of the job; a second ``gpu: 1`` task waits in the queue while the first runs,
then sleeps with its GPU idle and is ended ``terminated_due_to_utilization_policy`` (``time_window`` of
``--policy-window`` seconds through the server's ``CORRAL_UTILIZATION_MIN_WINDOW``, for checks only).

It writes ``report.txt`` (what it prints), ``report.json``, the server's log and the raw ``nvidia-smi``
output it read to OUT_DIR, and exits 1 when an item failed. It only reads ``nvidia-smi`` (never a setting
of the card: MIG, clocks, persistence, reset). ``--fake-bin DIR`` puts DIR first on ``PATH`` (a fake
``nvidia-smi``, for the test of this script); without a CUDA torch the load is a CPU stand-in, reported as
``STAND-IN`` (never a pass; on a real GPU, a failure). Standard library and corral only (installed, or on
``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The load's command line holds this word (a fake ``nvidia-smi`` reports the GPU busy while it runs).
LOAD_MARKER = "gpu-check-load"
PASS, FAIL, STAND_IN, INFO = "PASS", "FAIL", "STAND-IN", "INFO"
#: The Prometheus series of a job's GPU that must show (their highest value while the load ran is reported).
PROMETHEUS_GPU = ("dstack_job_gpu_usage_ratio", "dstack_job_gpu_memory_usage_bytes")
HOST_QUERY = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
SAMPLE_QUERY = ["--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
LOAD = r"""
import sys, time
secs = float(sys.argv[2])
try:
    import torch
except Exception as e:
    torch, why = None, "no torch (%s)" % e.__class__.__name__
if torch is not None and torch.cuda.is_available():
    n = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(n))
    print("torch %s sees %d CUDA device(s): %s" % (torch.__version__, n, names), flush=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    torch.cuda.synchronize()
    start, steps = time.time(), 0
    while time.time() - start < secs:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        steps += 20
    took = time.time() - start
    print("bf16 matmul 8192^3 x%d in %.1f s: %.0f TFLOP/s, peak memory %d MiB" % (
        steps, took, 2 * 8192**3 * steps / took / 1e12, torch.cuda.max_memory_allocated() >> 20), flush=True)
else:
    why = why if torch is None else "torch %s without CUDA" % torch.__version__
    print("STAND-IN: %s: a CPU loop for %g s, not a GPU result" % (why, secs), flush=True)
    end, x = time.time() + secs, 0
    while time.time() < end:
        x += 1
    print("stand-in done", flush=True)
"""


@dataclass
class Item:
    name: str
    status: str
    detail: str


@dataclass
class Report:
    mode: str
    items: list[Item] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, status: str, detail: str) -> None:
        self.items.append(Item(name, status, detail))
        print(f"  {status:<8} {name}: {detail}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.add(name, PASS if ok else FAIL, detail)

    def text(self) -> str:
        lines = [f"corral GPU check ({self.mode})"]
        lines += [f"  {k}: {v}" for k, v in self.facts.items()]
        lines += [f"  {i.status:<8} {i.name}: {i.detail}" for i in self.items]
        counts = {s: sum(i.status == s for i in self.items) for s in (PASS, FAIL, STAND_IN)}
        lines.append("  " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return "\n".join(lines) + "\n"

    @property
    def failed(self) -> bool:
        return any(i.status == FAIL for i in self.items)


@dataclass(frozen=True)
class Gpu:
    name: str  # as nvidia-smi prints it
    short: str  # as dstack names it
    memory_mib: int


class Smi:
    """``nvidia-smi`` read-only queries, each kept raw under ``OUT/nvidia-smi/``."""

    def __init__(self, out: Path) -> None:
        self.dir = out / "nvidia-smi"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def run(self, label: str, args: list[str]) -> str:
        self.count += 1
        try:
            done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
            text, rc = done.stdout + done.stderr, done.returncode
        except (OSError, subprocess.SubprocessError) as e:
            text, rc = f"{e.__class__.__name__}: {e}\n", -1
        name = f"{self.count:02d}-{label}.txt"
        (self.dir / name).write_text(f"$ nvidia-smi {' '.join(args)}  (exit {rc})\n{text}")
        return text if rc == 0 else ""


def parse_gpus(host_csv: str) -> list[Gpu]:
    from corral.agent import nvidia_csv
    from corral.agent.resources import convert_nvidia_gpu_name

    gpus = []
    for line in host_csv.splitlines():
        parts = nvidia_csv.fields(line)
        mem = nvidia_csv.number(parts[1]) if len(parts) >= 3 else None
        if parts[0] and mem is not None:
            gpus.append(Gpu(parts[0], convert_nvidia_gpu_name(parts[0]), int(mem)))
    return gpus


def torch_probe(fake: bool) -> tuple[str, str]:
    """(status, detail) of ``import torch`` in this Python: does it see a CUDA GPU? (No torch: a stand-in
    against a fake ``nvidia-smi``, a failure on a real GPU.)"""
    code = (
        "import torch; ok = torch.cuda.is_available(); n = torch.cuda.device_count() if ok else 0; "
        "print(torch.__version__, ok, n, '|'.join(torch.cuda.get_device_name(i) for i in range(n)))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return FAIL, "import torch took over 120 s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return (STAND_IN if fake else FAIL), f"no torch in {sys.executable} ({last}): the load runs a CPU stand-in"
    version, ok, count, names = (done.stdout.strip().split(" ", 3) + [""] * 4)[:4]
    if ok != "True":
        return FAIL, f"torch {version} sees no CUDA GPU"
    return PASS, f"torch {version} sees {count} CUDA GPU(s): {names.replace('|', ', ')}"


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def call(self, path: str, body: Any = None, *, token: str | None = None) -> tuple[int, str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST")
        req.add_header("Authorization", f"Bearer {token or self.token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: Any) -> Any:
        status, text = self.call(path, body)
        if status != 200:
            raise RuntimeError(f"POST {path}: {status} {text[:500]}")
        return json.loads(text)

    def run(self, name: str) -> Any:
        return self.post("/api/project/main/runs/get", {"run_name": name})

    def logs(self, run: Any, *, diagnose: bool = False) -> str:
        """The job's output (``diagnose``: the agent's own log of the job, as ``dstack logs -d``)."""
        body = {"run_name": run["run_spec"]["run_name"], "job_submission_id": run["latest_job_submission"]["id"]}
        found = self.post("/api/project/main/logs/poll", {**body, "limit": 1000, "diagnose": diagnose})["logs"]
        return b"".join(base64.b64decode(x["message"]) for x in found).decode("utf-8", "replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    api: Api
    state: Path
    log: Path
    prometheus_token: str


def unreachable_python() -> str | None:
    """Why the ``python3`` a job runs is out of reach of other users (a sandboxed job runs as one), or None."""
    exe = shutil.which("python3")
    if exe is None:
        return "no python3 on PATH"
    for path in (Path(exe), Path(os.path.realpath(exe))):
        for d in path.parents:
            if not d.stat().st_mode & 0o001:
                return f"{d} (on the way to {exe}) is not searchable by other users"
    if Path(os.path.realpath(exe)).stat().st_mode & 0o005 != 0o005:
        return f"{exe} cannot be run by other users"
    return None


def sandbox_mode(wanted: str, report: Report) -> str:
    """``auto`` unless the job's ``python3`` (the one with torch) is out of a sandboxed job's reach."""
    why = unreachable_python() if wanted == "auto" and os.geteuid() == 0 else None
    if why is None:
        return wanted
    report.facts["sandbox choice"] = f"off: the job's python3 would be out of a sandboxed job's reach: {why}"
    return "off"


def start_server(out: Path, state: Path, args: argparse.Namespace) -> Server:
    port, token, prom = free_port(), secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "DSTACK_"))}
    env.update(
        CORRAL_SERVER_DIR=str(state / "server"),
        CORRAL_CONFIG_DIR=str(state / "cli"),
        CORRAL_SERVER_ADMIN_TOKEN=token,
        CORRAL_ENABLE_PROMETHEUS_METRICS="1",
        CORRAL_PROMETHEUS_AUTH_TOKEN=prom,
        CORRAL_UTILIZATION_MIN_WINDOW=str(args.policy_window),
        CORRAL_AGENT_METRICS_INTERVAL="1",
        CORRAL_AGENT_POLL_WAIT="1",
        CORRAL_DEFAULT_STOP_DURATION="5",
        CORRAL_SANDBOX=args.sandbox,
        PYTHONUNBUFFERED="1",
    )
    if args.fake_bin:
        env["PATH"] = f"{Path(args.fake_bin).resolve()}:{env.get('PATH', '')}"
    log = out / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)],
            env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    server = Server(proc, Api(f"http://127.0.0.1:{port}", token), state, log, prom)
    deadline = time.monotonic() + 60
    while _healthy(server.api) is False:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return server


def _healthy(api: Api) -> bool:
    try:
        return api.call("/healthcheck")[0] == 200
    except OSError:
        return False


def sandbox_fact(log: Path) -> str:
    """What the server says of the job sandbox (it logs why jobs run without one)."""
    for line in log.read_text(errors="replace").splitlines():
        if "WITHOUT a sandbox" in line:
            return "off: " + line.split("WITHOUT a sandbox", 1)[1].lstrip(" (:)")
    return "on (every host-process job in its own network, mount and uid namespaces)"


def stop_server(server: Server) -> None:
    """Delete the fleet (its agents stop), stop the server, then end any agent of ours still there."""
    try:
        server.api.call("/api/project/main/fleets/delete", {"names": ["gpu-check"]})
        time.sleep(2)
    except OSError:
        pass
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
    needle, ours = str(server.state).encode(), []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGTERM)
                ours.append(int(entry.name))
        except OSError:
            continue
    deadline = time.monotonic() + 10  # they stop their jobs and write their state: then the state dir goes
    while any(Path(f"/proc/{pid}").exists() for pid in ours) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in ours:
        try:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


#: What a job gets of this environment besides PATH (an agent gives jobs PATH, HOME, LANG, USER, TERM and
#: their configuration's ``env``): where an image keeps its CUDA libraries, when it says so this way.
PASSED_ENV = ("LD_LIBRARY_PATH", "CUDA_HOME")


def passed_env(report: Report) -> dict[str, str]:
    env = {k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}
    report.facts["load's python3"] = shutil.which("python3") or "none on PATH"
    report.facts["load's env"] = ", ".join(f"{k}={v}" for k, v in env.items()) or "PATH only"
    return env


def task(name: str, commands: list[str], **conf: Any) -> dict[str, Any]:
    resources = {"cpu": "1..", "memory": "0.5GB..", "disk": "1GB..", "gpu": 1}
    configuration = {"type": "task", "name": name, "commands": commands, "resources": resources, **conf}
    return {"run_spec": {"configuration": configuration}}


def check_plan(report: Report, api: Api, gpus: list[Gpu]) -> None:
    """The plan of ``gpu: <name>:1`` offers the local instance as nvidia-smi reports the GPU; ``A100`` none."""
    if not gpus:
        report.add("plan offers the GPU", FAIL, "nvidia-smi reported no GPU")
        return
    gpu = gpus[0]
    spec = task("plan-gpu", ["true"])
    spec["run_spec"]["configuration"]["resources"]["gpu"] = f"{gpu.short}:1"
    plan = api.post("/api/project/main/runs/get_plan", spec)
    local = [o for o in plan["job_plans"][0]["offers"] if o.get("corral_backend") == "local"]
    seen = [(g["name"], g["memory_mib"]) for g in local[0]["instance"]["resources"]["gpus"]] if local else []
    ok = bool(local) and seen == [(gpu.short, gpu.memory_mib)]
    detail = f"gpu: {gpu.short}:1 -> local offer with {seen or 'no offer'}"
    detail += f"; nvidia-smi: {len(gpus)} x {gpu.name}, {gpu.memory_mib} MiB"
    report.check("plan offers the GPU", ok, detail)
    spec["run_spec"]["configuration"]["resources"]["gpu"] = "A100"
    plan = api.post("/api/project/main/runs/get_plan", spec)
    offers, why = plan["job_plans"][0]["offers"], plan.get("corral_plan_error") or ""
    report.check("plan of gpu: A100", not offers and "A100" in why, f"{len(offers)} offers; {why[:160]!r}")


@dataclass
class Watch:
    """What was seen of the load run and the idle run, polled once a second."""

    load_statuses: list[str] = field(default_factory=list)
    idle_statuses: list[str] = field(default_factory=list)
    idle_waiting: str = ""
    both_running: int = 0
    util_max: int = -1
    memory_max: int = -1
    samples: int = 0
    prometheus: dict[str, float] = field(default_factory=dict)
    captured: bool = False
    #: When the idle run was first seen running, and ended (monotonic seconds; 0: not seen).
    idle_running_at: float = 0.0
    idle_ended_at: float = 0.0
    load: Any = None
    idle: Any = None


def sample_metrics(server: Server, run: str, watch: Watch) -> None:
    body = json.loads(server.api.call(f"/api/project/main/metrics/job/{run}?limit=5")[1])
    found = {m["name"]: m["values"] for m in body.get("metrics", [])}
    util, memory = found.get("gpu_util_percent_gpu0", []), found.get("gpu_memory_usage_bytes_gpu0", [])
    watch.samples = max(watch.samples, len(util))
    watch.util_max = max([watch.util_max, *util])
    watch.memory_max = max([watch.memory_max, *memory])
    status, text = server.api.call("/metrics", token=server.prometheus_token)
    for line in text.splitlines() if status == 200 else []:
        name = line.split("{", 1)[0]
        if name in PROMETHEUS_GPU and f'dstack_run_name="{run}"' in line:
            watch.prometheus[name] = max(watch.prometheus.get(name, 0.0), float(line.rsplit(" ", 1)[1]))


def watch_runs(server: Server, smi: Smi, load: str, idle: str, until: float) -> Watch:
    watch = Watch()
    finished = ("done", "failed", "terminated")
    while time.monotonic() < until:
        watch.load, watch.idle = server.api.run(load), server.api.run(idle)
        a, b = watch.load["status"], watch.idle["status"]
        for seen, status in ((watch.load_statuses, a), (watch.idle_statuses, b)):
            if not seen or seen[-1] != status:
                seen.append(status)
        watch.both_running += a == "running" and b == "running"
        if b == "running" and not watch.idle_running_at:
            watch.idle_running_at = time.monotonic()
        if b in finished and watch.idle_running_at and not watch.idle_ended_at:
            watch.idle_ended_at = time.monotonic()
        if a == "running":
            watch.idle_waiting = (
                watch.idle_waiting or (watch.idle["latest_job_submission"] or {}).get("corral_waiting") or ""
            )
            sample_metrics(server, load, watch)
            if watch.samples >= 3 and not watch.captured:  # the raw view of the GPU under the load
                smi.run("during-load", [])
                smi.run("sample-query-during-load", SAMPLE_QUERY)
                watch.captured = True
        if a in finished and b in finished:
            break
        time.sleep(1)
    return watch


def judge_load(report: Report, server: Server, watch: Watch, gpus: list[Gpu], fake: bool) -> None:
    run = watch.load
    sub = run["latest_job_submission"] or {}
    report.check("load run ends done", run["status"] == "done", f"{run['status']} ({sub.get('termination_reason')})")
    logs = server.api.logs(run)
    agent_log = server.api.logs(run, diagnose=True)
    (Path(report.facts["out"]) / "load-run-agent.log").write_text(agent_log)
    sandboxed = [ln for ln in agent_log.splitlines() if ln.startswith(("Sandbox opened", "Runs without a sandbox"))]
    report.facts["load's sandbox"] = sandboxed[0] if sandboxed else "the agent's log of the job does not say"
    (Path(report.facts["out"]) / "load-run.log").write_text(logs)
    listed = re.findall(r"^GPU \d+: (.+?) \(UUID", logs, re.M)
    visible = re.findall(r"^CUDA_VISIBLE_DEVICES=(.*)$", logs, re.M)
    device = next((ln for ln in logs.splitlines() if ln.startswith(("torch ", "STAND-IN"))), "no device line")
    named = bool(gpus) and gpus[0].name in listed
    one = len(visible) == 1 and visible[0].isdigit()  # its own GPU alone (of several, any one)
    report.check("logs show the device", named and one, f"-L: {listed}; CUDA_VISIBLE_DEVICES={visible}")
    matmul = next((ln for ln in logs.splitlines() if ln.startswith("bf16 matmul")), "")
    if device.startswith("STAND-IN"):  # no CUDA torch in the job: never a pass, and a failure on a real GPU
        report.add("bf16 matmul on the GPU", STAND_IN if fake else FAIL, device)
    else:
        sees_one = re.search(r"sees 1 CUDA device", device) is not None
        report.check("bf16 matmul on the GPU", bool(matmul) and sees_one, f"{device}; {matmul or 'no result'}")
    report.check(
        "metrics/job during the load",
        watch.util_max > 50 and watch.memory_max > 0,
        f"max GPU utilisation {watch.util_max} %, max GPU memory {watch.memory_max >> 20} MiB "
        f"({watch.samples} samples at most in one reply)",
    )
    shown = ", ".join(f"{k} max {v:g}" for k, v in watch.prometheus.items()) or "none"
    report.check("Prometheus GPU series of the job", set(watch.prometheus) == set(PROMETHEUS_GPU), shown)


def judge_queue_and_policy(report: Report, watch: Watch, window: int) -> None:
    run = watch.idle
    sub = run["latest_job_submission"] or {}
    report.check(
        "second gpu: 1 run waits for the first",
        watch.both_running == 0 and "submitted" in watch.idle_statuses and bool(watch.idle_waiting),
        f"never both running: {watch.both_running == 0}; statuses {watch.idle_statuses}; "
        f"waiting: {watch.idle_waiting[:120]!r}",
    )
    reason = sub.get("termination_reason")
    idle_for = watch.idle_ended_at - watch.idle_running_at if watch.idle_ended_at else 0.0
    report.check(
        "idle GPU ended by utilization_policy",
        reason == "terminated_due_to_utilization_policy" and idle_for >= 0.8 * window,
        f"{sub.get('status')} / {reason}: {sub.get('termination_reason_message')}; ended {idle_for:.0f} s after "
        f"it was seen running (window {window} s)",
    )


def run_checks(
    report: Report, server: Server, smi: Smi, gpus: list[Gpu], args: argparse.Namespace, until: float
) -> None:
    report.facts["sandbox"] = sandbox_fact(server.log)
    # one instance of one GPU at most: the second gpu: 1 task waits for it whatever the machine's GPU count
    fleet = {"type": "fleet", "name": "gpu-check", "nodes": "0..1", "resources": {"gpu": 1}}
    server.api.post(
        "/api/project/main/fleets/apply", {"plan": {"spec": {"configuration": fleet, "profile": {}}}, "force": False}
    )
    check_plan(report, server.api, gpus)
    load = task(
        "gc-matmul",
        ["nvidia-smi -L", 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"',
         f'python3 -c "$GPU_CHECK_LOAD" {LOAD_MARKER} {args.load_seconds}'],
        env={"GPU_CHECK_LOAD": LOAD, **passed_env(report)},
    )  # fmt: skip
    policy = {"min_gpu_utilization": 50, "time_window": f"{args.policy_window}s"}
    idle = task("gc-idle", ["sleep 600"], utilization_policy=policy)
    for body in (load, idle):
        server.api.post("/api/project/main/runs/apply", {"plan": body, "force": False})
        time.sleep(1)  # the load first in the queue
    watch = watch_runs(server, smi, "gc-matmul", "gc-idle", until)
    judge_load(report, server, watch, gpus, bool(args.fake_bin))
    judge_queue_and_policy(report, watch, args.policy_window)
    for name in ("gc-matmul", "gc-idle"):
        server.api.call("/api/project/main/runs/stop", {"runs_names": [name], "abort": True})


class Interrupted(Exception):
    """SIGTERM (``gpu_check.sh``'s time limit): reported as a failure, after the server is stopped."""


def _interrupted(signum: int, frame: object) -> None:
    raise Interrupted("SIGTERM: the time limit was reached")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory for report.txt, report.json, server.log and nvidia-smi/")
    ap.add_argument("--load-seconds", type=float, default=60.0, help="how long the matmul runs (default 60)")
    ap.add_argument("--policy-window", type=int, default=30, help="utilization_policy time_window, s (default 30)")
    ap.add_argument("--fake-bin", help="a directory put first on PATH (a fake nvidia-smi: for tests only)")
    ap.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto", help="the job sandbox (default auto)")
    ap.add_argument("--budget", type=float, default=270.0, help="seconds the runs may take in all (default 270)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.fake_bin:
        os.environ["PATH"] = f"{Path(args.fake_bin).resolve()}:{os.environ.get('PATH', '')}"
    report = Report("FAKE nvidia-smi: no line below is a GPU result" if args.fake_bin else "real nvidia-smi")
    report.facts.update(out=str(out), python=f"{sys.executable} {sys.version.split()[0]}")
    smi = Smi(out)
    smi.run("nvidia-smi", [])
    listed = smi.run("list-gpus", ["-L"])
    gpus = parse_gpus(smi.run("host-query", HOST_QUERY))
    report.facts["nvidia-smi"] = (
        f"{len(gpus)} GPU(s): " + ", ".join(f"{g.name} ({g.short}, {g.memory_mib} MiB)" for g in gpus)
        + f"; -L: {len(re.findall(r'^GPU [0-9]+:', listed, re.M))} GPU(s), "
        f"{len(re.findall(r'^ +MIG ', listed, re.M))} MIG device(s)"
    )  # fmt: skip
    status, detail = torch_probe(bool(args.fake_bin))
    report.facts["torch"] = f"{status}: {detail}"
    report.add("import torch sees the GPU", status, detail)
    # a timeout's SIGTERM ends the check through ``finally``: the server and its agents (sessions of their own,
    # which would outlive it) are stopped, and the GPU is not left running the load
    signal.signal(signal.SIGTERM, _interrupted)
    state = Path(tempfile.mkdtemp(prefix="corral-gpu-check-"))
    args.sandbox = sandbox_mode(args.sandbox, report)
    server = start_server(out, state, args)
    try:
        run_checks(report, server, smi, gpus, args, started + args.budget)
        smi.run("sample-query-after", SAMPLE_QUERY)
    except Exception as e:  # a check that cannot go on is reported, and the server still stopped
        report.add("check ran to the end", FAIL, f"{e.__class__.__name__}: {e}"[:600])
    finally:
        stop_server(server)
        shutil.rmtree(state, ignore_errors=True)
    report.facts["took"] = f"{time.monotonic() - started:.0f} s"
    text = report.text()
    (out / "report.txt").write_text(text)
    (out / "report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    print("\n" + text, end="")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
