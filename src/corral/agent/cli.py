"""Command line of the agent.

    python -m corral.agent serve --work-dir DIR (--token-file FILE | --endpoint-file FILE)
                                 [--host 127.0.0.1] [--port 0]
                                 [--docker-host unix:///var/run/docker.sock]
                                 [--sandbox auto|on|off] [--uid-range FIRST-LAST] [--hide PATH ...]
    python3 -I agent.pyz serve ...            (the same, from the zipapp)
    python -m corral.agent info [--work-dir DIR] [--docker-host ...]   (print HostInfo as JSON and exit)
    python -m corral.agent cleanup --work-dir DIR [--docker-host ...]  (remove the containers of a
                                 stopped agent with this work dir; prints ``containers=N``)

Once listening, ``serve`` writes ``DIR/agent.pid`` and then ``DIR/agent.port`` (atomically; the
port file appearing means the agent is ready) and logs to stderr. SIGTERM or SIGINT do what
``POST /shutdown`` does: stop all jobs (gracefully, bounded) and exit 0. Both files are removed
on a clean exit.

``--endpoint-file FILE`` (an agent started inside a Slurm allocation, on a node the server cannot log in to):
without ``--token-file`` the agent picks its own token; once listening it writes ``{"url", "token"}`` as JSON
to FILE (atomically, mode 0600, its directory made if missing), which the server reads through the cluster's
shared home. The file is removed on a clean exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import socket
import sys
from typing import Any

from . import gpus, logstore, metrics, resources, sandbox
from .server import Agent

log = logging.getLogger("corral.agent")


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_endpoint(path: str, host: str, port: int, token: str) -> None:
    """``{url, token}`` for the server, readable by the agent's user alone, written whole or not at all."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    url_host = f"[{host}]" if ":" in host else host
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": f"http://{url_host}:{port}", "token": token}, f)
    os.replace(tmp, path)


def _read_token(args: argparse.Namespace) -> str | None:
    if args.token_file is None:
        if args.endpoint_file is None:
            log.error("give --token-file, or --endpoint-file for an agent that picks its own token")
            return None
        return secrets.token_hex(24)
    try:
        with open(args.token_file) as f:
            token = f.read().strip()
    except OSError as e:
        log.error("cannot read the token file: %s", e)
        return None
    if not token:
        log.error("the token file %s is empty", args.token_file)
        return None
    return token


def _serve(args: argparse.Namespace) -> int:  # noqa: C901, PLR0915
    work_dir = os.path.abspath(args.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    token = _read_token(args)
    if token is None:
        return 2
    try:
        environ = dict(os.environ)
        if args.uid_range:
            environ["CORRAL_JOB_UID_RANGE"] = args.uid_range
        config = sandbox.SandboxConfig.from_env(environ, args.sandbox, tuple(args.hide))
    except ValueError as e:
        log.error("%s", e)
        return 2
    logstore.keep_free(args.keep_free)
    try:
        allowed = None if args.gpus is None else gpus.parse_gpus(args.gpus)
    except ValueError as e:
        log.error("%s", e)
        return 2
    interval = args.metrics_interval
    if interval is None:
        raw = environ.get("CORRAL_AGENT_METRICS_INTERVAL") or str(metrics.DEFAULT_INTERVAL)
        try:
            interval = float(raw)
        except ValueError:
            log.error("CORRAL_AGENT_METRICS_INTERVAL=%r is not a number of seconds", raw)
            return 2
    if not interval >= 0:
        log.error("--metrics-interval must be a number of seconds, 0 or more")
        return 2
    reason = sandbox.probe(config)
    if reason is not None and config.mode == "on":
        log.error("--sandbox on, but jobs cannot get a sandbox here: %s", reason)
        return 2
    if reason is not None:
        log.warning(
            "jobs without an image run WITHOUT a sandbox (as the agent's user, in the host's network "
            "and filesystem): %s",
            reason,
        )
    try:
        agent = Agent(
            work_dir,
            token,
            host=args.host,
            port=args.port,
            docker_host=args.docker_host,
            sandbox_config=config,
            gpus=allowed,
            metrics_interval=interval,
        )
    except OSError as e:
        log.error("cannot listen on %s:%s: %s", args.host, args.port, e)
        return 1

    def on_signal(signum: int, frame: Any) -> None:
        log.info("received signal %d", signum)
        agent.request_shutdown()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    pid_path = os.path.join(work_dir, "agent.pid")
    port_path = os.path.join(work_dir, "agent.port")
    _write_atomic(pid_path, f"{os.getpid()}\n")
    _write_atomic(port_path, f"{agent.port}\n")
    if args.endpoint_file is not None:
        write_endpoint(args.endpoint_file, args.host, agent.port, token)
    log.info("corral agent listening on %s:%d (work dir %s)", args.host, agent.port, work_dir)
    try:
        agent.serve_forever()
    finally:
        for path in (port_path, pid_path, *((args.endpoint_file,) if args.endpoint_file else ())):
            try:
                os.unlink(path)
            except OSError:
                pass
    log.info("corral agent stopped")
    return 0


def _info(args: argparse.Namespace) -> int:
    info = resources.detect_host_info(os.path.abspath(args.work_dir), resources.container_runtime(args.docker_host))
    json.dump(info.to_dict(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    """Remove every container the agent with this work dir started (run once that agent is stopped:
    it is what the server does before it removes the agent from a host, since an agent that died
    could not remove its jobs' containers itself)."""
    from .containers import remove_agent_containers

    removed = remove_agent_containers(args.docker_host, args.work_dir)
    sys.stdout.write(f"containers={removed}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corral-agent", description="corral's host agent")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the agent's HTTP API")
    serve.add_argument("--work-dir", required=True, help="where jobs, logs and state live")
    serve.add_argument("--token-file", default=None, help="file holding the bearer token")
    serve.add_argument(
        "--endpoint-file",
        default=None,
        help="write {url, token} as JSON here once listening (mode 0600); without --token-file the agent "
        "picks its own token (an agent in a Slurm allocation)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=0, help="port (0 = pick a free one)")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    serve.add_argument(
        "--docker-host",
        default=None,
        help="the Docker engine for jobs with an image (default: $DOCKER_HOST or the socket)",
    )
    serve.add_argument(
        "--sandbox",
        default="auto",
        choices=sandbox.MODES,
        help="host-process jobs in a sandbox: auto (when the agent is root), on (required), off",
    )
    serve.add_argument("--uid-range", default=None, help="uids of sandboxed jobs, FIRST-LAST (default 200000-265535)")
    serve.add_argument(
        "--hide", action="append", default=[], help="a host path no job may see (repeatable; e.g. the server's state)"
    )
    serve.add_argument(
        "--keep-free",
        type=int,
        default=0,
        help="bytes of its disk the jobs' output leaves free: what would go below is dropped and counted (default 0)",
    )
    serve.add_argument(
        "--gpus",
        default=None,
        help="only these of the host's GPUs, by index (e.g. 0,2; 'none' for no GPU; default: all of them)",
    )
    serve.add_argument(
        "--metrics-interval",
        type=float,
        default=None,
        help="seconds between samples of running jobs' CPU, memory and GPUs (default: "
        "$CORRAL_AGENT_METRICS_INTERVAL, else 2; 0 turns sampling off)",
    )
    info = sub.add_parser("info", help="print this host's resources as JSON")
    info.add_argument("--work-dir", default=".", help="the directory whose disk to measure")
    info.add_argument("--docker-host", default=None, help="the Docker engine to look for (default: $DOCKER_HOST)")
    cleanup = sub.add_parser("cleanup", help="remove the containers of a stopped agent with this work dir")
    cleanup.add_argument("--work-dir", required=True, help="the stopped agent's work dir")
    cleanup.add_argument("--docker-host", default=None, help="its Docker engine (default: $DOCKER_HOST or the socket)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "INFO")).upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "serve":
        return _serve(args)
    if args.command == "info":
        return _info(args)
    if args.command == "cleanup":
        return _cleanup(args)
    parser.print_help(sys.stderr)
    return 2
