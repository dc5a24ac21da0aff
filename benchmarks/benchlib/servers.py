"""The two servers under test as processes: the cached dstack 0.22.5 virtualenv, start-up to the first
``200`` on ``/api/server/get_info``, shutdown, and how each CLI is invoked.

* dstack: ``dstack[server]==0.22.5`` is installed into its own virtualenv (default
  ``~/.cache/corral-bench/dstack-server-0.22.5``) under an exclusive file lock; a marker file written
  last says the install finished, so a half install is removed and redone, never reused. The server
  runs with ``HOME`` and ``DSTACK_SERVER_DIR`` in a temporary directory, ``--token`` and
  ``DSTACK_SERVER_LOG_FORMAT=standard``; the CLI's daily version check is skipped by touching
  ``~/.cache/.dstack/cli/last_check`` in that ``HOME``.
* corral: ``sys.executable -m corral.cli.main server`` with ``CORRAL_SERVER_DIR``,
  ``CORRAL_CONFIG_DIR`` and ``CORRAL_SERVER_ADMIN_TOKEN``; the CLI is the same interpreter's
  ``-m corral.cli.main``.
* Bytecode: dstack runs from a pip-installed virtualenv, compiled at install. corral runs from its source
  tree (an editable install), which Python compiles on first import and caches in ``__pycache__``, unless
  ``PYTHONDONTWRITEBYTECODE`` is set (as in some sandboxes): then every corral process would compile all
  of corral's modules again, which no installed corral does. So where it is set, corral's processes get
  a bytecode cache of their own (``PYTHONPYCACHEPREFIX``, next to the dstack virtualenv), primed once
  before measuring (:func:`prime_bytecode`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

DSTACK_VERSION = "0.22.5"
DEFAULT_DSTACK_VENV = Path("~/.cache/corral-bench").expanduser() / f"dstack-server-{DSTACK_VERSION}"
CORRAL_PYCACHE = DEFAULT_DSTACK_VENV.parent / "corral-pycache"
MARKER = ".corral-bench-complete"
TOKEN = "bench-0123456789abcdef"


class BenchError(RuntimeError):
    """A failure that stops the benchmark with one clear line."""


def ensure_dstack_venv(venv: Path, extras: str = "server") -> Path:
    """Install dstack[<extras>]==0.22.5 into ``venv`` unless a finished install is there already."""
    marker = venv / MARKER
    if marker.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():  # another process finished it while we waited
            return venv
        if venv.exists():
            print(f"removing an unfinished install at {venv}", file=sys.stderr)
            shutil.rmtree(venv)
        print(f"installing dstack[{extras}]=={DSTACK_VERSION} into {venv} (about a minute, once)", file=sys.stderr)
        t0 = time.perf_counter()
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"dstack[{extras}]=={DSTACK_VERSION}",
            ],
            [str(venv / "bin" / "python"), "-c", "import dstack._internal.server.main"],
        ]
        for cmd in steps:
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                tail = (res.stdout + res.stderr).strip().splitlines()[-15:]
                raise BenchError(f"installing dstack failed at {' '.join(cmd[:4])}:\n" + "\n".join(tail))
        marker.write_text(f"dstack[{extras}]=={DSTACK_VERSION}\n")
        print(f"installed in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSTACK_", "CORRAL_"))}
    env.update(HOME=str(home), COLUMNS="200", PYTHONUNBUFFERED="1", NO_COLOR="1")
    last_check = home / ".cache" / ".dstack" / "cli" / "last_check"
    last_check.parent.mkdir(parents=True, exist_ok=True)
    last_check.touch()
    return env


def _corral_env(env: dict[str, str]) -> dict[str, str]:
    """corral's processes: a bytecode cache of their own where the environment forbids ``__pycache__``."""
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env["PYTHONPYCACHEPREFIX"] = str(CORRAL_PYCACHE)
    return env


def write_local_projects(state: Path, projects: tuple[str, ...]) -> None:
    """The server's ``config.yml``: ``main`` and ``projects`` with the local backend (which belongs only to the
    projects config.yml names)."""
    state.mkdir(parents=True, exist_ok=True)
    lines = ["projects:", "  - name: main", *(f"  - name: {p}\n    backends: [{{type: local}}]" for p in projects)]
    (state / "config.yml").write_text("\n".join(lines) + "\n")


@dataclass
class Flavour:
    """How to start one kind of server and its CLI, given a working directory of its own."""

    kind: str  # "corral" or "dstack"
    root: Path  # everything of this server lives under it
    dstack_venv: Path | None = None
    #: A Postgres cluster (``benchlib.postgres.Cluster``) whose database ``bench_<kind>`` this server uses
    #: instead of SQLite.
    postgres: Any = None
    database_url: str | None = None
    #: corral: projects the server's config.yml gives the local backend (the ``local`` workload's).
    local_projects: tuple[str, ...] = ()

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def server_cmd(self, port: int) -> tuple[list[str], dict[str, str]]:
        env = _clean_env(self.home)
        if self.kind == "corral":
            _corral_env(env)
            if self.local_projects:
                write_local_projects(self.state, self.local_projects)
            env.update(
                CORRAL_SERVER_DIR=str(self.state),
                CORRAL_CONFIG_DIR=str(self.home / ".corral"),
                CORRAL_SERVER_ADMIN_TOKEN=TOKEN,
            )
            if self.database_url:
                env["CORRAL_DATABASE_URL"] = self.database_url
            return [sys.executable, "-m", "corral.cli.main", "server", "--port", str(port)], env
        assert self.dstack_venv is not None
        env.update(DSTACK_SERVER_DIR=str(self.state), DSTACK_SERVER_LOG_FORMAT="standard")
        if self.database_url:
            env["DSTACK_DATABASE_URL"] = self.database_url
        cmd = [str(self.dstack_venv / "bin" / "dstack"), "server", "--host", "127.0.0.1", "--port", str(port)]
        return [*cmd, "--token", TOKEN, "-y"], env

    def cli_cmd(self, *args: str) -> tuple[list[str], dict[str, str]]:
        cli_home = self.root / "cli-home"
        env = _clean_env(cli_home)
        if self.kind == "corral":
            _corral_env(env)
            env["CORRAL_CONFIG_DIR"] = str(cli_home / ".corral")
            return [sys.executable, "-m", "corral.cli.main", *args], env
        assert self.dstack_venv is not None
        return [str(self.dstack_venv / "bin" / "dstack"), *args], env

    def fresh(self) -> None:
        """Forget all state (a cold start follows)."""
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir(parents=True)
        if self.postgres is not None:
            self.database_url = self.postgres.fresh_database(f"bench_{self.kind}")


@dataclass
class Running:
    flavour: Flavour
    proc: subprocess.Popen[bytes]
    port: int
    startup_s: float
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return TOKEN

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start(flavour: Flavour, timeout: float = 180.0) -> Running:
    """Launch the server; returns once ``/api/server/get_info`` answered 200 (time measured from launch)."""
    port = free_port()
    cmd, env = flavour.server_cmd(port)
    flavour.home.mkdir(parents=True, exist_ok=True)
    log_path = flavour.root / f"server-{int(time.time() * 1000)}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    running = Running(flavour, proc, port, 0.0, log_path)
    url = f"{running.url}/api/server/get_info"
    with httpx.Client(timeout=2.0) as c:
        while True:
            try:
                if c.post(url).status_code == 200:
                    running.startup_s = time.perf_counter() - t0
                    return running
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise BenchError(f"{flavour.kind} server exited with {proc.returncode}:\n{running.log_tail()}")
            if time.perf_counter() - t0 > timeout:
                stop(running)
                raise BenchError(f"{flavour.kind} server did not answer within {timeout:.0f} s")
            time.sleep(0.01)


def stop(running: Running, timeout: float = 60.0) -> float:
    """SIGTERM, wait for the exit; returns the seconds it took. Leftover children we started are killed."""
    proc = running.proc
    if proc.poll() is not None:
        return 0.0
    from benchlib.procs import descendants, naming

    kids = descendants(proc.pid)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    took = time.perf_counter() - t0
    # only processes this run's server started: its children at the stop, and local agents it started after
    # the snapshot (or while shutting down), found by the state directory their command line names
    kids += naming(str(running.flavour.state))
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return took


def prime_bytecode(root: Path) -> bool:
    """Compile what corral's server and CLI import into their bytecode cache (a start, a stop, ``--help``),
    as installing corral would have; False when the environment lets Python cache bytecode anyway."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return False
    flavour = Flavour("corral", root)
    stop(start(flavour))
    run_cli(flavour, "--help")
    shutil.rmtree(root, ignore_errors=True)
    return True


def run_cli(flavour: Flavour, *args: str, timeout: float = 120.0) -> tuple[float, subprocess.CompletedProcess[str]]:
    cmd, env = flavour.cli_cmd(*args)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise BenchError(f"{' '.join([flavour.kind, *args])} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    return took, res
