"""What corral does on an SSH fleet's host: probe it, install and start the agent, remove it again.

Everything corral puts on a host lives in ``~/.corral-agent`` of the login user (the agent zipapp, its
token, environment, log and work directory), plus, for root on a host with systemd's unit directory,
the unit ``/etc/systemd/system/corral-agent.service``. Where systemd runs, the unit starts the agent and
starts it again after a reboot; elsewhere the agent is started detached (``setsid nohup``), survives
the SSH session, and the server starts it again when it finds the host back without it.

The agent runs host-process jobs in their sandbox as the server's settings say (``CORRAL_SANDBOX``,
``CORRAL_JOB_UID_RANGE``: its ``--sandbox`` and ``--uid-range``); an agent running with other ones is
started again. The agent listens on the host's loopback only, on a port it picks (``work/agent.port``); the server
reaches it through the SSH connection. Each step is one command over the connection.

Removal stops the agent (its shutdown stops its jobs and their containers), then runs ``agent.pyz
cleanup``, which removes every container labelled with the agent's work dir -- those of an agent that
died before it could -- and then removes the files.
"""

from __future__ import annotations

import base64
import logging
import re
import shlex
from dataclasses import dataclass

from corral.backends.ssh_conn import HostLink, SshError

log = logging.getLogger("corral.ssh")

AGENT_DIR = ".corral-agent"
UNIT_NAME = "corral-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
MIN_PYTHON = (3, 9)
_PROBE_MARK = "corral-probe"


@dataclass(frozen=True)
class HostFacts:
    python: str
    python_version: tuple[int, int]
    home: str
    uid: int
    systemd: bool  # systemd is running (PID 1)
    unit_dir: bool  # /etc/systemd/system exists
    agent_hash: str | None  # the installed zipapp's content hash

    @property
    def agent_dir(self) -> str:
        return f"{self.home}/{AGENT_DIR}"

    @property
    def work_dir(self) -> str:
        return f"{self.agent_dir}/work"

    @property
    def writes_unit(self) -> bool:
        return self.uid == 0 and self.unit_dir


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _tail(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]


PROBE = f"""echo {_PROBE_MARK}
py=$(command -v python3 2>/dev/null) || {{ echo "missing=python3"; exit 0; }}
echo "python=$py"
"$py" -c 'import sys; print("pyver=%d.%d" % sys.version_info[:2])'
echo "home=$HOME"
echo "uid=$(id -u)"
[ -d /run/systemd/system ] && echo systemd=1
[ -d /etc/systemd/system ] && echo unitdir=1
[ -f "$HOME/{AGENT_DIR}/agent.pyz.hash" ] && echo "hash=$(cat "$HOME/{AGENT_DIR}/agent.pyz.hash")"
exit 0
"""


async def probe(link: HostLink) -> HostFacts:
    """What the host offers: python3 (required), its home, root or not, systemd, the installed agent."""
    result = await link.run("sh -s", input=PROBE, timeout=30)
    out = _text(result.stdout)
    label = link.target.label()
    if _PROBE_MARK not in out:
        said = _tail(out + " " + _text(result.stderr)) or f"exit status {result.exit_status}"
        raise SshError(f"{label}: the login works but cannot run commands: {said}", permanent=True)
    facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if facts.get("missing") == "python3":
        raise SshError(
            f"{label}: python3 is not installed (corral's agent needs Python "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ on the host's PATH)",
            permanent=True,
        )
    try:
        major, minor = (int(x) for x in facts["pyver"].split("."))
        version = (major, minor)
        home, uid = facts["home"], int(facts["uid"])
    except (KeyError, ValueError):
        raise SshError(f"{label}: unexpected answer to the host probe: {_tail(out)}", permanent=True) from None
    if version < MIN_PYTHON:
        raise SshError(
            f"{label}: python3 is {major}.{minor}; corral's agent needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+",
            permanent=True,
        )
    return HostFacts(
        python=facts["python"],
        python_version=version,
        home=home,
        uid=uid,
        systemd=facts.get("systemd") == "1",
        unit_dir=facts.get("unitdir") == "1",
        agent_hash=facts.get("hash"),
    )


async def upload_agent(link: HostLink, facts: HostFacts, zipapp: bytes, digest: str) -> None:
    """Put the agent zipapp in place (atomically) and record its hash; no SFTP needed."""
    d = shlex.quote(facts.agent_dir)
    command = (
        f"mkdir -p {d} && cat > {d}/.agent.pyz.tmp && mv -f {d}/.agent.pyz.tmp {d}/agent.pyz"
        f" && echo {digest} > {d}/agent.pyz.hash"
    )
    result = await link.run(command, input=zipapp, timeout=120)
    if result.exit_status != 0:
        raise SshError(
            f"{link.target.label()}: cannot write {facts.agent_dir}: {_tail(_text(result.stderr))}", permanent=True
        )


SANDBOX_MODES = ("auto", "on", "off")
_UID_RANGE = re.compile(r"^[0-9]+-[0-9]+$")


def sandbox_flags(mode: str, uid_range: str | None) -> tuple[str, ...]:
    """The agent's ``serve`` flags for the server's sandbox settings (the same as a local agent gets)."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode {mode!r} is not one of auto, on, off")
    if uid_range is not None and not _UID_RANGE.match(uid_range):
        raise ValueError(f"uid range {uid_range!r} is not FIRST-LAST")
    return ("--sandbox", mode, *(("--uid-range", uid_range) if uid_range else ()))


def _serve(facts: HostFacts, flags: tuple[str, ...]) -> str:
    d = facts.agent_dir
    serve = f"{facts.python} -I {d}/agent.pyz serve --work-dir {d}/work --token-file {d}/agent.token"
    return " ".join((serve, *flags))


def unit_file(facts: HostFacts, user: str, flags: tuple[str, ...] = ()) -> str:
    """The systemd unit that starts the agent at boot and restarts it when it stops."""
    d = facts.agent_dir
    return (
        "[Unit]\n"
        "Description=corral host agent (installed by the corral server; removed when its fleet is deleted)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"User={user}\n"
        f"WorkingDirectory={d}\n"
        f"EnvironmentFile=-{d}/agent.env\n"
        f"ExecStart={_serve(facts, flags)}\n"
        "Restart=always\n"
        "RestartSec=3\n"
        # jobs run in their own sessions: stopping or restarting the agent does not kill them behind its back
        "KillMode=process\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def env_file(env: dict[str, str]) -> str:
    """The fleet's ``env`` for the agent (and so its jobs), in a form both ``sh`` and systemd read."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def start_script(
    facts: HostFacts, user: str, token: str, env: dict[str, str], wait_seconds: float, flags: tuple[str, ...] = ()
) -> str:
    """Write token, environment and unit; keep a running agent started with the same token and flags (a
    retried bootstrap or a recovery adopts it), else stop the old one and start the agent; print its port.

    Run by ``sh -s`` from stdin, so the token never shows in the host's process list."""
    d = shlex.quote(facts.agent_dir)
    py = shlex.quote(facts.python)
    serve = " ".join((f"{py} -I agent.pyz serve --work-dir {d}/work --token-file {d}/agent.token", *flags))
    use_systemd = facts.writes_unit and facts.systemd
    lines = [
        "set -u",
        f"cd {d} || exit 1",
        "mkdir -p work",
        "umask 077",
        "cat > agent.token.new <<'CORRAL_TOKEN'",
        token,
        "CORRAL_TOKEN",
        f"echo {_b64(' '.join(flags))} | base64 -d > agent.flags.new",
        "same=0; cmp -s agent.token.new agent.token 2>/dev/null && cmp -s agent.flags.new agent.flags 2>/dev/null"
        " && same=1",
        "mv -f agent.token.new agent.token",
        "mv -f agent.flags.new agent.flags",
        f"echo {_b64(env_file(env))} | base64 -d > agent.env",
        "umask 022",
    ]
    if facts.writes_unit:
        lines.append(f"echo {_b64(unit_file(facts, user, flags))} | base64 -d > {UNIT_PATH}")
    lines += [
        "pid=$(cat work/agent.pid 2>/dev/null || true)",
        'alive=0; [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1',
        'if [ "$alive" = 1 ] && [ "$same" = 1 ] && [ -s work/agent.port ]; then',
        "  echo adopted=1",
        "else",
        '  if [ "$alive" = 1 ]; then kill "$pid" 2>/dev/null; sleep 1; kill -9 "$pid" 2>/dev/null; fi',
        "  rm -f work/agent.port work/agent.pid",
    ]
    if use_systemd:
        lines += [
            "  systemctl daemon-reload && systemctl enable -q corral-agent && systemctl restart corral-agent"
            ' || { echo "failed=systemctl could not start corral-agent"; exit 0; }',
            "  child=",
        ]
    else:
        lines += [
            f"  setsid nohup sh -c 'set -a; . ./agent.env; set +a; exec {serve}' >> agent.log 2>&1 < /dev/null &",
            "  child=$!",
        ]
    lines += [
        "fi",
        f"n=0; limit={max(1, int(wait_seconds * 10))}",
        "while [ ! -s work/agent.port ]; do",
        '  if [ -n "${child:-}" ] && ! kill -0 "$child" 2>/dev/null; then',
        '    echo "failed=the agent exited: $(tail -n 5 agent.log | tr "\\n" " ")"; exit 0',
        "  fi",
        '  n=$((n+1)); [ "$n" -gt "$limit" ] && { echo "failed=the agent did not start in time"; exit 0; }',
        "  sleep 0.1",
        "done",
        'echo "port=$(cat work/agent.port)"',
        'echo "pid=$(cat work/agent.pid 2>/dev/null)"',
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Started:
    port: int
    pid: int | None
    adopted: bool


async def start_agent(
    link: HostLink,
    facts: HostFacts,
    token: str,
    env: dict[str, str],
    wait_seconds: float,
    flags: tuple[str, ...] = (),
) -> Started:
    if not token.isalnum():
        raise ValueError("the agent token must be alphanumeric")
    script = start_script(facts, link.target.user, token, env, wait_seconds, flags)
    result = await link.run("sh -s", input=script, timeout=wait_seconds + 30)
    out = _text(result.stdout)
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    label = link.target.label()
    if "failed" in values:
        raise SshError(f"{label}: {values['failed'].strip()}", permanent=True)
    try:
        port = int(values["port"])
    except (KeyError, ValueError):
        said = _tail(out + " " + _text(result.stderr)) or f"exit status {result.exit_status}"
        raise SshError(f"{label}: starting the agent failed: {said}", permanent=True) from None
    pid = int(values["pid"]) if values.get("pid", "").strip().isdigit() else None
    return Started(port=port, pid=pid, adopted=values.get("adopted") == "1")


READ_PORT = f'cat "$HOME/{AGENT_DIR}/work/agent.port"'


async def read_agent_port(link: HostLink) -> int:
    """The port the agent listens on (it picks one at each start)."""
    result = await link.run(READ_PORT, timeout=30)
    try:
        return int(_text(result.stdout).strip())
    except ValueError:
        raise SshError(f"{link.target.label()}: the agent is not running (no port file)") from None


REMOVE = f"""D="$HOME/{AGENT_DIR}"
if [ -f {UNIT_PATH} ]; then
  [ -d /run/systemd/system ] && systemctl disable -q --now corral-agent 2>/dev/null
  rm -f {UNIT_PATH}
  [ -d /run/systemd/system ] && systemctl daemon-reload 2>/dev/null
fi
pid=$(cat "$D/work/agent.pid" 2>/dev/null || true)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
  kill "$pid" 2>/dev/null
  n=0; while kill -0 "$pid" 2>/dev/null && [ "$n" -lt 100 ]; do n=$((n+1)); sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
fi
py=$(command -v python3 2>/dev/null || true)
if [ -f "$D/agent.pyz" ] && [ -n "$py" ]; then
  ( cd "$D" && {{ [ ! -f agent.env ] || {{ set -a; . ./agent.env; set +a; }}; }} &&
    exec "$py" -I agent.pyz cleanup --work-dir "$D/work" ) || echo "containers=failed"
fi
rm -rf "$D"
echo removed=1
"""


async def remove_agent(link: HostLink) -> int | None:
    """Stop the agent, remove the containers it started (an agent that died could not), and remove
    everything corral put on the host. Returns how many containers were left and removed (None when
    that step failed: logged, the rest goes on)."""
    result = await link.run("sh -s", input=REMOVE, timeout=60)
    out = _text(result.stdout)
    if "removed=1" not in out.splitlines():
        raise SshError(f"{link.target.label()}: cleaning up failed: {_tail(_text(result.stderr))}")
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    containers = values.get("containers", "0").strip()
    if not containers.isdigit():
        said = _tail(_text(result.stderr)) or "no output"
        log.warning("%s: removing the containers the agent left failed: %s", link.target.label(), said)
        return None
    if int(containers):
        log.info("%s: removed %s container(s) the agent left", link.target.label(), containers)
    return int(containers)
