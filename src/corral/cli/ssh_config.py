"""The SSH configuration the attached CLI writes, the same as the official dstack CLI writes it: the user's
key at ``~/.dstack/ssh/<sha1(token)[:8]>`` (0600, as ``users/get_my_user`` gives it), one ``Host`` block
per hop in ``~/.dstack/ssh/config`` (``<run>-host`` and ``<run>`` through it, dstack's ``dockerized``
layout) and ``Include ~/.dstack/ssh/config`` at the top of ``~/.ssh/config``, so that ``ssh <run>`` and
IDE links work. The blocks are removed when the CLI detaches.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

DSTACK_SSH = Path("~/.dstack/ssh")


def _home(path: Path) -> Path:
    return Path(os.path.expanduser(str(path)))


def key_path(token: str) -> Path:
    return _home(DSTACK_SSH) / hashlib.sha1(token.encode()).hexdigest()[:8]


def write_user_key(token: str, private_key: str, public_key: str) -> Path:
    """The user's key where the official CLI keeps it (what both CLIs name in ``IdentityFile``)."""
    path = key_path(token)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(private_key if private_key.endswith("\n") else private_key + "\n")
    path.chmod(0o600)
    path.with_suffix(".pub").write_text(public_key)
    return path


def _collapse(path: Path) -> str:
    """``~/...`` for a path under the user's home as the passwd database gives it (what OpenSSH expands ``~``
    to), the path itself otherwise -- as the official CLI writes it."""
    import pwd

    try:
        home = pwd.getpwuid(os.getuid()).pw_dir.rstrip("/")
    except KeyError:
        return str(path)
    text = str(path)
    return "~" + text[len(home) :] if text == home or text.startswith(home + "/") else text


def hosts(run_host: str, jpd: dict[str, Any], jrd: dict[str, Any] | None, identity: Path) -> dict[str, dict[str, Any]]:
    """The ``Host`` blocks of the ``dockerized`` layout for a job (``run_host``: the run's name, or the
    job's name for jobs other than 0/0)."""
    common = {
        "IdentityFile": _collapse(identity),
        "IdentitiesOnly": "yes",
        "StrictHostKeyChecking": "no",
        "UserKnownHostsFile": "/dev/null",
    }
    ports = (jrd or {}).get("ports") or {}
    return {
        f"{run_host}-host": {"HostName": jpd["hostname"], "Port": jpd["ssh_port"], "User": jpd["username"], **common},
        run_host: {
            "HostName": "localhost",
            "Port": ports.get("10022", 10022),
            "User": (jrd or {}).get("username") or "root",
            **common,
            "ProxyJump": f"{run_host}-host",
        },
    }


def update(path: Path, host: str, options: dict[str, Any]) -> None:
    """Replace (or, with no ``options``, remove) ``host``'s block in ``path``, as dstack's CLI does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content = []
    copying = True
    if path.exists():
        for line in path.read_text().splitlines(keepends=True):
            m = re.match(r"^Host\s+(\S+)$", line.strip())
            if m is not None:
                copying = m.group(1) != host
            if copying:
                content.append(line)
    if options:
        content.append(f"Host {host}\n")
        content += [f"    {k} {v}\n" for k, v in options.items()]
    path.write_text("".join(content))


def include(config: Path) -> None:
    """``Include <config>`` at the top of ``~/.ssh/config`` (once)."""
    ssh_config = _home(Path("~/.ssh/config"))
    ssh_config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"Include {_collapse(config)}\n"
    text = ssh_config.read_text() if ssh_config.exists() else ""
    if line not in text:
        ssh_config.write_text(line + text)


def add(blocks: dict[str, dict[str, Any]]) -> Path:
    config = _home(DSTACK_SSH) / "config"
    include(config)
    for host, options in blocks.items():
        update(config, host, options)
    return config


def remove(blocks: dict[str, dict[str, Any]]) -> None:
    config = _home(DSTACK_SSH) / "config"
    for host in blocks:
        update(config, host, {})
