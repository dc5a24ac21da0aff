"""A tiny HTTP-01 responder of the ACME tests' own: the standard library's ``http.server`` over a webroot, in a
network namespace of the pebble lab, on port 80; publishing a token writes its file, withdrawing removes it."""

from __future__ import annotations

import pathlib
import socket
import sys
import time
from dataclasses import dataclass, field

from pebble_harness import LabHost, PebbleLab


@dataclass
class Responder:
    """A host answering ``GET /.well-known/acme-challenge/<token>`` from its webroot on port 80."""

    host: LabHost
    webroot: pathlib.Path
    log: pathlib.Path
    published: list[str] = field(default_factory=list)
    withdrawn: list[str] = field(default_factory=list)

    @property
    def challenges(self) -> pathlib.Path:
        return self.webroot / ".well-known" / "acme-challenge"

    async def publish(self, token: str, key_authorization: str) -> None:
        self.published.append(token)
        (self.challenges / token).write_text(key_authorization)

    async def withdraw(self, token: str) -> None:
        self.withdrawn.append(token)
        (self.challenges / token).unlink(missing_ok=True)

    def fetches(self) -> int:
        """How many challenge fetches the responder has answered 200."""
        return sum(
            1
            for line in self.log.read_text().splitlines()
            if "/.well-known/acme-challenge/" in line and '" 200' in line
        )


def start_responder(lab: PebbleLab, name: str, base: pathlib.Path) -> Responder:
    host = lab.add_host(name)
    responder = Responder(host, base / f"www-{name}", base / f"www-{name}.log")
    responder.challenges.mkdir(parents=True)
    lab.spawn_in(
        host,
        [sys.executable, "-m", "http.server", "80", "--bind", host.ip, "--directory", str(responder.webroot)],
        responder.log,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((host.ip, 80), timeout=1).close()
            return responder
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
