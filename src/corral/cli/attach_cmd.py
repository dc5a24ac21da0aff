"""``corral attach RUN`` and the attached part of ``corral apply``: dstack's flags and messages, through
:mod:`corral.cli.attach` (asyncssh), with the ``Host`` entries of :mod:`corral.cli.ssh_config` written
while attached and removed on exit.

* ``attach``: ``runs/get`` (waiting while the run is provisioning), ``users/get_my_user`` for the key,
  then the two hops, the run's ports forwarded to ``--host`` (``localhost``), ``-p LOCAL:REMOTE``
  overrides, and with ``--logs`` the job's output (``--since``) until it ends; else until Ctrl-C.
* ``apply`` (attached): the same for the new run, its output streamed from ``/logs_ws`` until the job
  ends, then the run's final status.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption

JSON = dict[str, Any]
_WAITING = ("pending", "submitted", "provisioning")


def _job(run: JSON, replica: int | None, job_num: int) -> JSON:
    from corral.cli.errors import CLIError

    jobs = [j for j in run.get("jobs") or [] if (j.get("job_spec") or {}).get("job_num", 0) == job_num]
    if replica is not None:
        jobs = [j for j in jobs if (j.get("job_spec") or {}).get("replica_num", 0) == replica]
    running = [j for j in jobs if ((j.get("job_submissions") or [{}])[-1]).get("status") == "running"]
    chosen = sorted(running or jobs, key=lambda j: (j.get("job_spec") or {}).get("replica_num", 0))
    if not chosen:
        name = (run.get("run_spec") or {}).get("run_name")
        raise CLIError(f"Run {name} has no job {job_num}" + (f" in replica {replica}" if replica is not None else ""))
    return dict(chosen[0])


def _ports(job: JSON, overrides: list[str]) -> list[tuple[int, int, bool]]:
    """(local, remote, automatic) for each of the job's ``app_specs``, with ``-p LOCAL:REMOTE`` applied."""
    from corral.cli.errors import CLIError

    apps = (job.get("job_spec") or {}).get("app_specs") or []
    out = {int(a["port"]): (int(a.get("map_to_port") or a["port"]), a.get("map_to_port") is None) for a in apps}
    for text in overrides:
        local, sep, remote = text.partition(":")
        if not sep or not local.isdigit() or not remote.isdigit():
            raise CLIError(f"-p {text}: expected LOCAL_PORT:REMOTE_PORT, e.g. -p 8000:80")
        if int(remote) not in out:
            raise CLIError(f"Cannot override port {remote} not exposed by the run")
        out[int(remote)] = (int(local), False)
    return [(local, remote, auto) for remote, (local, auto) in out.items()]


class Session:
    """One attachment of the CLI to a job: key, entries, SSH connections, forwards."""

    def __init__(self, client: Any, run: JSON, job: JSON, identity: str | None, bind: str, overrides: list[str]):
        self.client, self.run, self.job = client, run, job
        self.identity, self.bind, self.overrides = identity, bind, overrides
        self.blocks: dict[str, dict[str, Any]] = {}
        self.forwarded: list[tuple[int, int]] = []
        from corral.cli.attach import Attachment

        self.attachment = Attachment()

    @property
    def host(self) -> str:
        spec = self.job.get("job_spec") or {}
        name = str((self.run.get("run_spec") or {}).get("run_name"))
        return name if (spec.get("job_num", 0), spec.get("replica_num", 0)) == (0, 0) else str(spec.get("job_name"))

    async def open(self) -> None:
        from corral.cli import ssh_config
        from corral.cli.attach import AttachError
        from corral.cli.errors import CLIError

        sub = (self.job.get("job_submissions") or [{}])[-1]
        jpd, jrd = sub.get("job_provisioning_data"), sub.get("job_runtime_data")
        if not jpd or not jpd.get("ssh_port"):
            raise CLIError("Failed to attach. The run is not provisioned yet.")
        if self.identity:
            key = Path(self.identity).expanduser()
        else:
            me = self.client.get_my_user()
            if not me.get("ssh_private_key") or not me.get("ssh_public_key"):
                raise CLIError("Server response does not contain user SSH key")
            key = ssh_config.write_user_key(self.client.token, me["ssh_private_key"], me["ssh_public_key"])
        ports = _ports(self.job, self.overrides)
        try:
            await self.attachment.open(jpd, jrd, key)
            for local, remote, auto in ports:
                self.forwarded.append((await self.attachment.forward(self.bind, local, remote, auto), remote))
        except AttachError as e:
            await self.attachment.close()
            raise CLIError(f"Failed to attach: {e}") from None
        self.blocks = ssh_config.hosts(self.host, jpd, jrd, key)
        ssh_config.add(self.blocks)

    async def close(self) -> None:
        from corral.cli import ssh_config

        if self.blocks:
            ssh_config.remove(self.blocks)
            self.blocks = {}
        await self.attachment.close()

    def describe(self, out: Any) -> None:
        spec = self.job.get("job_spec") or {}
        name = (self.run.get("run_spec") or {}).get("run_name")
        out.print(
            f"Attached to run [code]{name}[/] (replica={spec.get('replica_num', 0)} job={spec.get('job_num', 0)})"
        )
        if self.forwarded:
            out.print("Forwarded ports (local -> remote):")
            for local, remote in self.forwarded:
                out.print(f"  - {self.bind}:{local} -> {remote}")
        out.print(f"To connect to the run via SSH, use `ssh {self.host}`.")
        info = self.job.get("job_connection_info") or {}
        if info.get("attached_ide_url"):
            out.print(f"To open in {info.get('ide_name')}, use link below:\n\n  {info['attached_ide_url']}\n")


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def wait_running(client: Any, project: str, name: str, out: Any) -> JSON:
    from corral.cli.common import get_run_or_fail

    run = get_run_or_fail(client, project, name)
    with out.status(f"Waiting for [code]{name}[/] to run..."):
        while run.get("status") in _WAITING:
            time.sleep(1.0)
            run = get_run_or_fail(client, project, name)
    return run


async def _attached(
    session: Session, logs: bool, since: str | None, until_done: Callable[[], bool], announce: bool = True
) -> None:
    import asyncio

    await session.open()
    try:
        from corral.cli import render

        out = render.console()
        if announce:
            session.describe(out)
        if logs:
            await session.attachment.stream_logs(_write, since)
            return
        out.print("Press Ctrl+C to detach...")
        while not await asyncio.get_running_loop().run_in_executor(None, until_done):
            await asyncio.sleep(5.0)
    finally:
        await session.close()


def _since(text: str | None) -> str | None:
    from corral.cli import formatting
    from corral.cli.errors import CLIError

    if not text:
        return None
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc).isoformat()
    except ValueError:
        pass
    seconds = formatting.parse_duration(text)
    if not isinstance(seconds, int) or seconds <= 0:
        raise CLIError(f"--since {text}: expected a duration (e.g. 10m) or an ISO 8601 time")
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds)).isoformat()


def attach(
    run_name: Annotated[str, typer.Argument(help="The run's name.", metavar="RUN")],
    logs: Annotated[bool, typer.Option("--logs", help="Print the run's output until it ends.")] = False,
    since: Annotated[
        Optional[str], typer.Option("--since", help="With --logs: from this time or this long ago (e.g. 10m).")
    ] = None,
    ssh_identity: Annotated[
        Optional[str], typer.Option("--ssh-identity", help="The SSH private key to use.", metavar="SSH_PRIVATE_KEY")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="The local address to forward ports on.")] = "localhost",
    port: Annotated[
        Optional[list[str]], typer.Option("-p", "--port", help="Map a port: LOCAL_PORT:REMOTE_PORT.", metavar="MAPPING")
    ] = None,
    replica: Annotated[Optional[int], typer.Option("--replica", help="The replica number.", metavar="N")] = None,
    job: Annotated[int, typer.Option("--job", help="The job number inside the replica.", metavar="N")] = 0,
    project: ProjectOption = None,
) -> None:
    """Attach to a running run: forward its ports, write `ssh RUN`'s entry, optionally print its output."""
    from corral.cli import formatting, render
    from corral.cli.common import client_for, get_run_or_fail
    from corral.cli.errors import CLIError

    out = render.console()
    client, project_name = client_for(project)
    with client:
        run = wait_running(client, project_name, run_name, out)
        if run.get("status") in formatting.FINISHED_RUN_STATUSES and run.get("status") != "done":
            raise CLIError(f"Run {run_name} is {run.get('status')}")
        session = Session(client, run, _job(run, replica, job), ssh_identity, host, list(port or []))

        def finished() -> bool:
            return get_run_or_fail(client, project_name, run_name).get("status") in formatting.FINISHED_RUN_STATUSES

        import asyncio

        try:
            asyncio.run(_attached(session, logs, _since(since), finished))
        except KeyboardInterrupt:
            out.print("Detached")


def stream_attached(client: Any, run: JSON) -> bool:
    """The attached part of ``corral apply``: the run's ports forwarded and its output streamed from the job
    until it ends. False when the job offers no SSH endpoint (the caller reads ``logs/poll`` instead)."""
    job = _job(run, None, 0)
    sub = (job.get("job_submissions") or [{}])[-1]
    if not (sub.get("job_provisioning_data") or {}).get("ssh_port"):
        return False
    import asyncio

    session = Session(client, run, job, None, "localhost", [])
    asyncio.run(_attached(session, True, None, lambda: True, announce=False))
    return True
