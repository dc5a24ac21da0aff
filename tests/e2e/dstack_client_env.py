"""The official dstack client (CLI) in its own virtualenv, and a ``corral server`` subprocess for it to talk to.

The client venv comes from ``$CORRAL_DSTACK_CLIENT_VENV`` when that points at a usable venv, else from a
cache under ``~/.cache/corral-tests/dstack-<version>`` that is built once (``python -m venv`` + ``pip install
dstack==<version>``, ~40 s). The build happens under an exclusive lock file and the venv only counts as
usable once a completion marker has been written as its last step, so a half-installed venv (an
interrupted build, a failed pip) is never reused: it is wiped and rebuilt.

Every CLI call runs with ``HOME`` in a temp dir, ``COLUMNS=200``, the daily version check switched off
(see :func:`cli_env`) and proxies pointed at a dead port for anything but loopback, so nothing reaches the
internet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

DSTACK_VERSION = "0.22.5"
VENV_ENV_VAR = "CORRAL_DSTACK_CLIENT_VENV"
_MARKER = ".corral-complete"
_PIP_TIMEOUT = 900


class ClientInstallError(RuntimeError):
    """Building the client venv failed; the message carries pip's output."""


def _venv_version(venv: Path) -> str | None:
    """The dstack version installed in ``venv``, or None when it has no working ``dstack`` CLI."""
    python = venv / "bin" / "python"
    if not (venv / "bin" / "dstack").is_file() or not python.exists():
        return None
    try:
        out = subprocess.run(
            [str(python), "-c", "import dstack.version as v; print(v.__version__)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "corral-tests" / f"dstack-{DSTACK_VERSION}"


def _build(venv: Path) -> None:
    """Create ``venv`` from scratch and install the client into it; the marker is written last."""
    shutil.rmtree(venv, ignore_errors=True)
    log: list[str] = []

    def step(cmd: list[str]) -> None:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            said = "\n".join(o.decode() if isinstance(o, bytes) else o or "" for o in (e.stdout, e.stderr))
            raise ClientInstallError(f"{' '.join(cmd)} timed out after {_PIP_TIMEOUT}s\n{said}")
        log.append(f"$ {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
        if out.returncode != 0:
            raise ClientInstallError(f"exit code {out.returncode}\n" + "\n".join(log))

    # --without-scm-ignore-files: not on every Python; plain venv is enough.
    step([sys.executable, "-m", "venv", str(venv)])
    step(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            f"dstack=={DSTACK_VERSION}",
        ]
    )
    version = _venv_version(venv)
    if version != DSTACK_VERSION:
        raise ClientInstallError(f"installed, but the venv reports dstack {version!r}\n" + "\n".join(log))
    (venv / _MARKER).write_text(f"dstack=={DSTACK_VERSION}\n")


def client_venv() -> Path:
    """A virtualenv with the official dstack client at :data:`DSTACK_VERSION` (see the module docstring)."""
    given = os.environ.get(VENV_ENV_VAR)
    if given:
        venv = Path(given).expanduser()
        if _venv_version(venv) == DSTACK_VERSION:
            return venv
        # Not usable: fall through to the cache rather than skipping.
    venv = default_cache_dir()
    if (venv / _MARKER).is_file() and _venv_version(venv) == DSTACK_VERSION:
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it right now: wait for it
        if (venv / _MARKER).is_file() and _venv_version(venv) == DSTACK_VERSION:
            return venv
        try:
            _build(venv)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def short_home() -> Iterator[Path]:
    """A HOME for the CLI, short whatever pytest's tmp dir is (a worker's is deeper): OpenSSH's control
    socket under ``~/.dstack/ssh/`` must fit a Unix socket's path (108 bytes), else the attach says only
    "Can't connect to the remote host"."""
    home = Path(tempfile.mkdtemp(prefix="dsh-"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def cli_env(home: Path) -> dict[str, str]:
    """The environment of one CLI call: a private HOME, wide output, no update check, no internet.

    dstack's CLI checks for a newer version once a day (``dstack/_internal/cli/utils/updates.py``):
    ``check_for_updates()`` asks get.dstack.ai only when ``~/.cache/.dstack/cli/last_check`` is missing or
    its mtime is not today (``cli`` is the channel of a release build), so the file is touched before every
    call. Proxies to a closed port catch any other attempt to go out, while loopback goes direct.
    """
    last_check = home / ".cache" / ".dstack" / "cli" / "last_check"
    last_check.parent.mkdir(parents=True, exist_ok=True)
    last_check.touch()
    os.utime(last_check)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSTACK_", "CORRAL_"))}
    for k in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        env.pop(k, None)
        env.pop(k.upper(), None)
    env.update(
        HOME=str(home),
        COLUMNS="200",
        LINES="200",
        NO_COLOR="1",
        TERM="dumb",
        PYTHONUNBUFFERED="1",
        DSTACK_CLI_LOG_LEVEL="INFO",
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


@dataclass
class CliResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def describe(self) -> str:
        return (
            f"$ dstack {' '.join(self.args)}\nexit code {self.returncode}\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


@dataclass
class CorralServer:
    url: str
    token: str
    server_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"

    def api(self, path: str, body: object = None) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)


@dataclass
class DstackCli:
    """Runs the official ``dstack`` CLI from an empty working dir that is not a git repo."""

    venv: Path
    home: Path
    workdir: Path
    server: CorralServer
    calls: list[CliResult] = field(default_factory=list)
    #: Extra environment of every call (e.g. git configuration).
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 120) -> CliResult:
        out = subprocess.run(
            [str(self.venv / "bin" / "dstack"), *args],
            cwd=self.workdir,
            env={**cli_env(self.home), **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        res = CliResult(list(args), out.returncode, out.stdout, out.stderr)
        self.calls.append(res)
        return res

    def ok(self, *args: str, timeout: float = 120) -> CliResult:
        res = self.run(*args, timeout=timeout)
        assert res.returncode == 0, self.explain(res)
        return res

    def explain(self, res: CliResult) -> str:
        return f"{res.describe()}\n--- corral server log (tail)\n{self.server.log_tail()}"

    def write(self, name: str, text: str) -> Path:
        path = self.workdir / name
        path.write_text(text)
        return path


def _corral_command() -> list[str]:
    script = Path(sys.executable).parent / "corral"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from corral.cli.main import main; sys.argv[0] = 'corral'; main()"]


def agent_pids_under(root: Path) -> list[int]:
    """Processes of ``corral.agent`` whose command line names a path under ``root``."""
    pids = []
    needle = str(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "corral.agent" in cmdline and needle in cmdline:
            pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def corral_server(tmp: Path, token: str, **env_overrides: str) -> Iterator[CorralServer]:
    """``corral server`` on a free loopback port with its state under ``tmp``; killed (and its agents
    reaped) on exit."""
    server_dir = tmp / "server"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        HOME=str(tmp / "server-home"),
        CORRAL_SERVER_DIR=str(server_dir),
        CORRAL_SERVER_ADMIN_TOKEN=token,
        CORRAL_CONFIG_DIR=str(tmp / "corral-config"),
        CORRAL_SAFETY_NET_INTERVAL="60",  # prove that wake-ups, not polling, drive the work
        CORRAL_PROVISIONING_TIMEOUT="30",
        CORRAL_DEFAULT_STOP_DURATION="5",
        CORRAL_LOCAL_MAX_INSTANCES="4",
        # the local backend divides the machine among its instances: a machine of 8 blocks whatever runs the tests
        CORRAL_LOCAL_CPUS="8",
        CORRAL_LOCAL_MEMORY="64GB",
        CORRAL_AWS_LIVE_CATALOG="off",  # tests never fetch gpuhunt's public price catalogue
        PYTHONUNBUFFERED="1",
    )
    env.update(env_overrides)
    (tmp / "server-home").mkdir(parents=True, exist_ok=True)
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*_corral_command(), "server", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp,
            start_new_session=True,
        )
    server = CorralServer(f"http://127.0.0.1:{port}", token, server_dir, log_path, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"corral server exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                if httpx.post(f"{server.url}/api/server/get_info", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"corral server did not answer within 60s:\n{server.log_tail()}")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for pid in agent_pids_under(tmp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
