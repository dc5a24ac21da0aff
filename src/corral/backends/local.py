"""The ``local`` backend: instances are host-agent processes on this machine.

This machine is one host, split as dstack splits an SSH host into blocks: its CPUs, memory and GPUs
(as an SSH host's agent reports them: all CPUs, total memory, the GPUs ``nvidia-smi``/``amd-smi``
report) are divided into equal blocks -- one per GPU, else one per CPU, unless told -- and the disk
holding the work directory is shared. Each local instance is carved out of 1 to all of those blocks
(one offer per size, price 0), and a new one is reserved only while that many are free
(``store.plan_apply`` recounts the blocks live instances hold). It owns specific GPUs of the machine
(indexes chosen at reservation, none another live instance owns, kept in its offer), and its agent is
started with ``--gpus`` so that it reports, and its jobs see, only those. Each instance is an agent started in
its own session with its own work directory and secret token, so it and its jobs survive a server
restart; the server finds it again from the instance row, and reaps agents it has no record of.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from corral.agent import leftovers, sandbox
from corral.agent.protocol import HostInfo
from corral.agent.resources import detect_host_info
from corral.backends import local_process
from corral.backends.agent_client import AgentClient, AgentError, AgentUnreachable
from corral.backends.base import AgentEndpoint, Provisioned, ProvisioningError
from corral.domain.records import InstanceRec
from corral.domain.resources import Gpu, InstanceResources
from corral.scheduler.blocks import HOST_GPUS_KEY, carved_offers, total_blocks_for
from corral.scheduler.codec import resources_from_json
from corral.scheduler.types import Offer


def host_resources(info: HostInfo) -> InstanceResources:
    return InstanceResources(
        cpus=info.cpus,
        memory_mib=info.memory_mib,
        gpus=tuple(Gpu(name=g.name, memory_mib=g.memory_mib, vendor=g.vendor) for g in info.gpus),
        spot=False,
        disk_size_mib=info.disk_size_mib,
        cpu_arch=info.cpu_arch,
    )


log = logging.getLogger("corral.local")


class LocalCompute:
    name = "local"
    owns_hosts = True

    def __init__(
        self,
        instances_dir: Path,
        provisioning_timeout: float,
        request_timeout: float = 5.0,
        docker_host: str | None = None,
        reap_grace: float = 0.0,
        hide: tuple[Path, ...] = (),
        sandbox_mode: str = "auto",
        uid_range: str | None = None,
        host_cpus: int | None = None,
        host_memory_mib: int | None = None,
        host_blocks: int | None = None,
        keep_free: int = 0,
    ) -> None:
        self.instances_dir = instances_dir
        #: Bytes of the state directory's disk the agents leave free when storing jobs' output.
        self.keep_free = keep_free
        #: Paths no job may see (the server's state), besides each agent's own work dir.
        self.hide = (instances_dir, *hide)
        #: Why the agents cannot sandbox host-process jobs here (None: they can).
        self.sandbox_mode = sandbox_mode
        self.uid_range = uid_range
        self.sandbox_reason = sandbox.probe(sandbox.SandboxConfig(mode=sandbox_mode))
        if self.sandbox_reason is not None:
            log.warning(
                "local jobs without an image run WITHOUT a sandbox (only global admins' runs are admitted): %s",
                self.sandbox_reason,
            )
        #: Leave work dirs younger than this alone when reaping (replicas sharing the dir on Postgres).
        self.reap_grace = reap_grace
        self.provisioning_timeout = provisioning_timeout
        self.request_timeout = request_timeout
        #: The Docker engine the agents run jobs with an image on (None: their DOCKER_HOST or the socket).
        self.docker_host = docker_host
        #: What the machine is taken to have, where the operator says (None: what it reports).
        self.host_cpus = host_cpus
        self.host_memory_mib = host_memory_mib
        self._host_blocks = host_blocks
        self._offers: list[Offer] | None = None
        self._host: InstanceResources | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def host_info(self) -> HostInfo:
        self.instances_dir.mkdir(parents=True, exist_ok=True)
        return detect_host_info(str(self.instances_dir), None)

    def host(self) -> InstanceResources:
        """This machine as the local backend divides it."""
        if self._host is None:
            res = host_resources(self.host_info())
            if self.host_cpus is not None:
                res = replace(res, cpus=self.host_cpus)
            if self.host_memory_mib is not None:
                res = replace(res, memory_mib=self.host_memory_mib)
            self._host = res
        return self._host

    def host_blocks(self) -> int:
        """How many blocks the machine is split into (``blocks: auto``: one per GPU, else one per CPU)."""
        return max(1, self._host_blocks or total_blocks_for(None, self.host()))

    def offers(self) -> list[Offer]:
        if self._offers is None:
            self._offers = list(carved_offers("local", self.host(), self.host_blocks()))
        return self._offers

    @staticmethod
    def _carved(instance: InstanceRec | None, info: HostInfo) -> InstanceResources:
        """The instance's share of the machine (its reservation's offer), not the whole machine its agent sees."""
        data = (instance.offer or {}).get("resources") if instance is not None else None
        return resources_from_json(data) if isinstance(data, dict) else host_resources(info)

    async def _adopt(self, work_dir: Path, instance: InstanceRec) -> Provisioned | None:
        """An agent already started for this reservation (a crash came between start and record)."""
        try:
            pid = int((work_dir / "agent.pid").read_text().strip())
            port = int((work_dir / "agent.port").read_text().strip())
            token = (work_dir / "agent.token").read_text().strip()
        except (OSError, ValueError):
            return None
        if not local_process.alive(pid):
            return None
        endpoint = AgentEndpoint(url=f"http://127.0.0.1:{port}", token=token, pid=pid, work_dir=str(work_dir))
        client = AgentClient(endpoint.url, token, timeout=self.request_timeout)
        try:
            info = await client.info()
        except (AgentUnreachable, AgentError):
            local_process.kill_group(pid)
            return None
        finally:
            await client.aclose()
        return Provisioned(
            agent=endpoint,
            hostname=info.hostname,
            resources=self._carved(instance, info),
            internal_ip="127.0.0.1",
            addresses=tuple(info.addresses),
        )

    async def create_instance(self, instance: InstanceRec) -> Provisioned:
        """Start the agent of reservation ``instance`` -- idempotently: the reservation id names the
        work directory, so a retry after a crash adopts the agent it already started instead of a second one."""
        instance_id = instance.id
        work_dir = self.instances_dir / instance_id
        work_dir.mkdir(parents=True, exist_ok=True)
        adopted = await self._adopt(work_dir, instance)
        if adopted is not None:
            return adopted
        token = secrets.token_hex(24)
        token_file = work_dir / "agent.token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        port_file = work_dir / "agent.port"
        port_file.unlink(missing_ok=True)
        proc = local_process.spawn_detached(
            [
                sys.executable,
                "-m",
                "corral.agent",
                "serve",
                "--work-dir",
                str(work_dir),
                "--token-file",
                str(token_file),
                *(["--docker-host", self.docker_host] if self.docker_host else []),
                *(a for p in self.hide for a in ("--hide", str(p))),
                "--sandbox",
                self.sandbox_mode,
                *(["--uid-range", self.uid_range] if self.uid_range else []),
                *(["--keep-free", str(self.keep_free)] if self.keep_free else []),
                *_gpus_args(instance),
            ],
            work_dir / "agent.log",
        )
        self._procs[instance_id] = proc
        deadline = time.monotonic() + self.provisioning_timeout
        while not port_file.exists():
            if proc.poll() is not None:
                tail = (work_dir / "agent.log").read_text(errors="replace")[-800:]
                raise ProvisioningError(f"The local agent exited with code {proc.returncode}: {tail.strip()}")
            if time.monotonic() > deadline:
                local_process.kill_group(proc.pid)
                raise ProvisioningError(f"The local agent did not start within {self.provisioning_timeout:.0f}s")
            await asyncio.sleep(0.01)
        port = int(port_file.read_text().strip())
        endpoint = AgentEndpoint(url=f"http://127.0.0.1:{port}", token=token, pid=proc.pid, work_dir=str(work_dir))
        client = AgentClient(endpoint.url, token, timeout=self.request_timeout)
        try:
            info = await client.info()
        except (AgentUnreachable, AgentError) as e:
            local_process.kill_group(proc.pid)
            raise ProvisioningError(f"The local agent does not answer: {e}") from None
        finally:
            await client.aclose()
        return Provisioned(
            agent=endpoint,
            hostname=info.hostname,
            resources=self._carved(instance, info),
            internal_ip="127.0.0.1",
            addresses=tuple(info.addresses),
        )

    async def open_port(self, instance: InstanceRec, port: int) -> tuple[Any, Any]:
        """A stream to ``port`` on the instance's host (this machine's loopback): a replica's port."""
        return await asyncio.open_connection("127.0.0.1", port)

    async def terminate_instance(self, instance_id: str, agent: AgentEndpoint | None) -> None:
        """Ask the agent to shut down (it ends its jobs and gives back its sandbox slots) and wait for it; an
        agent that does not take the request (killed, or hung: ``workers/hosts.py`` gave it up) is killed at
        once, and what it left -- its jobs' processes, its slots -- is ended from here."""
        asked = False
        if agent is not None:
            client = AgentClient(agent.url, agent.token, timeout=self.request_timeout)
            try:
                await client.shutdown()
                asked = True
            except (AgentUnreachable, AgentError):
                pass
            finally:
                await client.aclose()
            if agent.pid is not None:
                if asked:
                    await local_process.wait_gone(agent.pid, 15.0)
                local_process.kill_group(agent.pid)
        proc = self._procs.pop(instance_id, None)
        if proc is not None:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        work_dir = self.instances_dir / instance_id
        if not asked:
            killed, slots = await asyncio.to_thread(leftovers.reap, str(work_dir), self._sandbox_config())
            if killed or slots:
                log.info(
                    "instance %s: ended %d leftover job processes and %d sandbox slots", instance_id, killed, slots
                )
        await self._forget_work_dir(work_dir)

    def _sandbox_config(self) -> sandbox.SandboxConfig:
        """The sandbox settings the agents of this server run with (as ``corral.agent serve`` reads them)."""
        environ = dict(os.environ)
        if self.uid_range:
            environ["CORRAL_JOB_UID_RANGE"] = self.uid_range
        return sandbox.SandboxConfig.from_env(environ, self.sandbox_mode, tuple(str(p) for p in self.hide))

    async def _forget_work_dir(self, work_dir: Path) -> None:
        """Remove an agent's work dir, and the containers of its jobs if the agent could not."""
        from corral.agent.containers import remove_agent_containers  # only when an instance goes away

        await asyncio.to_thread(remove_agent_containers, self.docker_host, str(work_dir))
        shutil.rmtree(work_dir, ignore_errors=True)

    def agent_url(self, instance: InstanceRec) -> str:
        return AgentEndpoint.from_json(instance.agent or {"token": ""}).url

    async def recover(self, instance: InstanceRec) -> None:
        """A local agent that died is not restarted: its instance stays flagged unreachable."""

    async def aclose(self) -> None:
        """Nothing to release: local agents are separate processes that outlive the server."""

    async def reap_unknown(self, known_instance_ids: set[str]) -> list[str]:
        """Stop agents left in the instances directory that no live instance owns."""
        reaped: list[str] = []
        if not self.instances_dir.exists():
            return reaped
        for d in self.instances_dir.iterdir():
            if not d.is_dir() or d.name in known_instance_ids:
                continue
            # Another replica may have reserved and started it a moment ago: leave young ones alone.
            if self.reap_grace and time.time() - d.stat().st_mtime < self.reap_grace:
                continue
            pid_file = d / "agent.pid"
            if pid_file.exists():
                try:
                    local_process.kill_group(int(pid_file.read_text().strip()))
                except ValueError:
                    pass
            await self._forget_work_dir(d)
            reaped.append(d.name)
        return reaped


def _gpus_args(instance: InstanceRec) -> list[str]:
    """``--gpus`` for the agent of a carved instance: the host GPUs its reservation was given (none: no
    GPU at all); nothing for an instance reserved before carves owned GPUs (it sees them all)."""
    owned = (instance.offer or {}).get(HOST_GPUS_KEY)
    if not isinstance(owned, list):
        return []
    return ["--gpus", ",".join(str(int(i)) for i in owned) or "none"]
