#!/usr/bin/env python3
"""What a job's sandbox costs: set-up (network namespace, veth, port relay, the launcher's mounts, PID,
IPC and user namespaces, the job's init, fork and exec) and teardown (namespace, veth, slot), per job,
beside starting the same command as a plain host process. Uses the agent's own code
(``corral.agent.sandbox``) on this machine; needs root.

Each round starts ``/bin/true`` in a fresh sandbox with one port and a small job tree, waits for it and
tears the sandbox down. ``steady`` keeps one other sandbox open, so the bridge exists (the usual case on
a busy host); ``fresh`` is the same with the launcher a fresh interpreter per job (the fallback where the
agent's fork server cannot start); ``first`` is a lone job, which also creates and removes the bridge and its
NAT rules. CPU per job is measured over the rounds twice: the machine's (all processes and the kernel: what a
busy machine's other work inflates) and the benchmark's own (its process, the launcher server and every job
process, reaped).
Figures, not assertions:

    sudo python benchmarks/sandbox_setup.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from corral.agent import sandbox


def _tree(base: str) -> tuple[dict[str, str], str]:
    root = os.path.join(base, "workdir")
    for d in ("workflow", "tmp", "root"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    mount = os.path.join(base, "root")
    os.makedirs(mount, exist_ok=True)
    binds = {"/workflow": os.path.join(root, "workflow"), "/tmp": os.path.join(root, "tmp")}
    binds["/root"] = os.path.join(root, "root")
    return binds, mount


def one(sbs: sandbox.Sandboxes, base: str, n: int, fork_server: bool = True) -> tuple[float, float, float, float]:
    """(network + relay, launcher up to exec, teardown, total) in ms."""
    job_dir = os.path.join(base, f"job{n}")
    binds, mount = _tree(job_dir)
    t0 = time.perf_counter()
    sb = sbs.open(f"bench-{n}", [8000])
    t1 = time.perf_counter()
    sandbox.chown_tree(os.path.join(job_dir, "workdir"), sb.uid)
    inside = (0, 0) if sb.userns else None
    env = {"PATH": "/usr/bin:/bin"}
    if fork_server:
        launched = sbs.launcher.launch(sb, ["/bin/true"], "/workflow", binds, mount, inside, env, job_dir)
    else:
        pipes = sandbox.Pipes.open()
        cmd = sbs.launcher.command(sbs.launcher.spec(sb, ["/bin/true"], "/workflow", binds, mount, pipes, inside))
        popen = functools.partial(subprocess.Popen, cmd, pass_fds=(pipes.status_w, pipes.go_r), cwd=job_dir, env=env)
        launched = sandbox.start(popen, pipes, inside, sb.uid)
    t2 = time.perf_counter()
    launched.proc.wait()
    t3 = time.perf_counter()
    sbs.close(sb)
    t4 = time.perf_counter()
    shutil.rmtree(job_dir, ignore_errors=True)
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t4 - t3) * 1e3, (t2 - t0 + t4 - t3) * 1e3


def _busy_ms() -> float:
    """The machine's busy CPU time so far (every core, every process, the kernel's work included), in ms."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) * 1000 / os.sysconf("SC_CLK_TCK")


def _own_ms() -> float:
    """This process's CPU time and its reaped children's (the launcher server's and, through it, every job
    process's, once the server has been reaped), in ms: the sandbox's own cost, whatever else the machine runs."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime) * 1000


def plain(rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        proc = subprocess.Popen(["/bin/true"])
        times.append((time.perf_counter() - t0) * 1e3)
        proc.wait()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="corral-bench-sandbox-")
    os.makedirs(os.path.join(base, "agent"))  # a work dir that is gone would have its slots reaped by other agents
    sbs = sandbox.Sandboxes(os.path.join(base, "agent"), sandbox.SandboxConfig(mode="on"))
    if not sbs.available:
        print(f"no sandbox here: {sbs.reason}", file=sys.stderr)
        return 2
    try:
        one(sbs, base, 0)  # warm the page cache and the launcher's source
        first = [one(sbs, base, 1000 + i) for i in range(max(3, args.rounds // 3))]
        anchor = sbs.open("bench-anchor", [])
        try:
            one(sbs, base, 2000, fork_server=False)
            cpu0, own0 = _busy_ms(), _own_ms()
            fresh = [one(sbs, base, 3000 + i, fork_server=False) for i in range(args.rounds)]
            sbs.launcher.close()  # its CPU so far counted before the steady rounds, which start another
            cpu1, own1 = _busy_ms(), _own_ms()
            steady = [one(sbs, base, i) for i in range(args.rounds)]
            sbs.launcher.close()  # reaped: the CPU of the server and of every job it forked is counted
            cpu2, own2 = _busy_ms(), _own_ms()
        finally:
            sbs.close(anchor)
            sbs.launcher.close()
        base_ms = plain(args.rounds)
    finally:
        sbs.reap(set())  # whatever a failed round left
        shutil.rmtree(base, ignore_errors=True)
    print(f"sandbox set-up and teardown per job (medians of {args.rounds} rounds, ms)")
    print(f"{'case':<8} {'network':>9} {'launcher':>9} {'teardown':>9} {'total':>9}  CPU per job: machine, own")
    cpu = {"steady": (cpu2 - cpu1) / args.rounds, "fresh": (cpu1 - cpu0) / args.rounds}
    own = {"steady": (own2 - own1) / args.rounds, "fresh": (own1 - own0) / args.rounds}
    for name, rows in (("steady", steady), ("fresh", fresh), ("first", first)):
        cols = [statistics.median(r[i] for r in rows) for i in range(4)]
        mark = f"  {cpu[name]:9.1f} {own[name]:6.1f}" if name in cpu else ""
        print(f"{name:<8} " + " ".join(f"{c:9.1f}" for c in cols) + mark)
    print("(fresh: as steady, the launcher a fresh interpreter per job instead of a fork of the agent's fork server)")
    print(f"plain host process start (Popen of /bin/true): {base_ms:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
