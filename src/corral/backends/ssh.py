"""The ``ssh`` backend: hosts an SSH fleet lists, taken over through SSH (``backend: remote`` on the wire).

Each host is one instance, created by ``fleets/apply`` with everything needed to reach it in its
``agent`` JSON (``AgentEndpoint.connection``: host, port, user, private key, proxy jump, plus the
fleet's ``internal_ip``/``network``, ``blocks`` and ``env``) and a token chosen there; the private keys
in it are sealed (:mod:`corral.backends.ssh_secrets`) and opened by the :class:`HostLink` only to log
in, so the connection this backend hands back to be stored stays sealed. Provisioning
logs in (through the proxy jump when there is one), checks for ``python3``, uploads the agent zipapp
when the host lacks this build, starts it (see :mod:`corral.backends.ssh_bootstrap`) and asks it what
the host has: CPUs, memory, disk and GPUs become the instance's resources. Failures that trying again
cannot fix (the key is refused, no ``python3``, a login that cannot run commands) end provisioning at
once with a message naming the host; others (no route, refused, timeouts) are retried until the
provisioning timeout, then reported the same way.

The server reaches an agent only through its :class:`HostLink` (one reused SSH connection and a local
port forwarded to the agent's loopback port), made again from the stored connection facts after a
server restart. Terminating stops the agent, removes the containers its jobs left (an agent that died
could not) and removes what corral put on the host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from pathlib import Path
from typing import Any

from corral.agent.protocol import HostInfo
from corral.agent.zipapp import build_zipapp, content_hash
from corral.backends import ssh_bootstrap as boot
from corral.backends.agent_client import AgentClient, AgentError, AgentUnreachable
from corral.backends.base import AgentEndpoint, Provisioned, ProvisioningError
from corral.backends.local import host_resources
from corral.backends.ssh_conn import HostLink, SshError, SshTarget
from corral.backends.ssh_secrets import KeyOpener, KeyUnreadable
from corral.domain.records import InstanceRec
from corral.domain.resources import InstanceResources
from corral.scheduler.types import Offer

#: A connection's key that says the host's user data authorises the key (a refused login is retried).
AUTHORISED_BY_USER_DATA = "key_by_user_data"

log = logging.getLogger("corral.ssh")

RETRY_PAUSE = 1.0


def split_blocks(blocks: Any, res: InstanceResources) -> int:
    """dstack's rule: ``auto`` = as many blocks as GPUs (CPUs when there are none); CPUs and GPUs must
    divide evenly. Raises ``ValueError`` saying why a host cannot be split."""
    cpus, gpus = res.cpus, len(res.gpus)
    n = (cpus if gpus == 0 else min(cpus, gpus)) if blocks in (None, "auto") else int(blocks)
    if n < 1 or cpus % n or gpus % n:
        raise ValueError(f"cannot split the host into {n} blocks: its {cpus} CPUs and {gpus} GPUs do not divide evenly")
    return n


def internal_ip(connection: dict[str, Any], info: HostInfo) -> str | None:
    """The address other hosts of the fleet reach this one at (``internal_ip``, else one in ``network``).
    Raises ``ValueError`` when the configured one is not the host's."""
    addresses = list(info.addresses)
    wanted = connection.get("internal_ip")
    if wanted:
        if addresses and wanted not in addresses:
            raise ValueError(f"internal_ip {wanted} is not an address of the host ({', '.join(addresses)})")
        return str(wanted)
    network = connection.get("network")
    if network:
        net = ipaddress.ip_network(network, strict=False)
        for a in addresses:
            if ipaddress.ip_address(a) in net:
                return a
        raise ValueError(f"no address of the host is in network {network} (it has {', '.join(addresses) or 'none'})")
    host = str(connection.get("host"))
    return host if host in addresses else (addresses[0] if addresses else None)


class SSHCompute:
    name = "ssh"
    owns_hosts = False

    def __init__(
        self,
        cache_dir: Path,
        provisioning_timeout: float,
        connect_timeout: float,
        request_timeout: float = 5.0,
        key_opener: KeyOpener | None = None,
        sandbox_mode: str = "auto",
        uid_range: str | None = None,
    ) -> None:
        self.cache_dir = cache_dir
        #: The agents' ``--sandbox`` and ``--uid-range`` (the server's ``CORRAL_SANDBOX``, ``CORRAL_JOB_UID_RANGE``).
        self.agent_flags = boot.sandbox_flags(sandbox_mode, uid_range)
        self.provisioning_timeout = provisioning_timeout
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._links: dict[str, HostLink] = {}
        self._zipapp: tuple[bytes, str] | None = None
        #: Opens the stored (sealed) private keys; without one, only keys in clear can be used.
        self._open_key = key_opener or KeyOpener()
        self._open_token = self._open_key.named("agent token")

    def offers(self) -> list[Offer]:
        return []  # an SSH fleet has exactly its hosts

    # ---- links -------------------------------------------------------------------------------
    def _link(self, instance_id: str, connection: dict[str, Any]) -> HostLink:
        link = self._links.get(instance_id)
        if link is None:
            target = SshTarget.from_json(connection)
            link = HostLink(target, self.connect_timeout, boot.read_agent_port, self._open_key)
            self._links[instance_id] = link
        return link

    def _endpoint(self, instance: InstanceRec) -> AgentEndpoint:
        """The instance's endpoint with its agent token opened (its private keys stay sealed until a login)."""
        try:
            endpoint = AgentEndpoint.from_json(instance.agent or {"token": ""}).opened(self._open_token)
        except KeyUnreadable as e:
            raise ProvisioningError(f"instance {instance.name}: {e}") from None
        if not endpoint.connection:
            raise ProvisioningError(f"instance {instance.name} has no SSH connection details")
        return endpoint

    def agent_url(self, instance: InstanceRec) -> str:
        return self._link(instance.id, self._endpoint(instance).connection or {}).local_url()

    def _agent_build(self) -> tuple[bytes, str]:
        if self._zipapp is None:
            path = build_zipapp(self.cache_dir / "agent.pyz")
            self._zipapp = (path.read_bytes(), content_hash())
        return self._zipapp

    # ---- provisioning ------------------------------------------------------------------------
    async def _install(
        self, link: HostLink, endpoint: AgentEndpoint, wait_seconds: float
    ) -> tuple[boot.HostFacts, boot.Started]:
        """Probe, upload the agent when this build is missing, start (or adopt) it."""
        connection = endpoint.connection or {}
        facts = await boot.probe(link)
        data, digest = self._agent_build()
        if facts.agent_hash != digest:
            await boot.upload_agent(link, facts, data, digest)
        env = {str(k): str(v) for k, v in (connection.get("env") or {}).items() if isinstance(v, str)}
        started = await boot.start_agent(link, facts, endpoint.token, env, wait_seconds, self.agent_flags)
        link.remote_port = started.port
        return facts, started

    async def _bootstrap(self, instance: InstanceRec, endpoint: AgentEndpoint, deadline: float) -> Provisioned:
        connection = endpoint.connection or {}
        link = self._link(instance.id, connection)
        label = link.target.label()
        facts, started = await self._install(link, endpoint, max(5.0, deadline - time.monotonic()))
        url = link.local_url()
        client = AgentClient(url, endpoint.token, timeout=self.request_timeout)
        try:
            info = await client.info()
        except (AgentUnreachable, AgentError) as e:
            raise SshError(f"{label}: the agent started but does not answer through the tunnel: {e}") from None
        finally:
            await client.aclose()
        resources = host_resources(info)
        try:
            blocks = split_blocks(connection.get("blocks", 1), resources)
            ip = internal_ip(connection, info)
        except ValueError as e:
            raise SshError(f"{label}: {e}", permanent=True) from None
        return Provisioned(
            agent=AgentEndpoint(
                # the host's identity, the same for every server replica: the tunnel's local end (``url``
                # above) belongs to this process only and is looked up through ``agent_url``
                url=f"ssh://{link.target.user}@{link.target.host}:{link.target.port}",
                token=endpoint.token,
                pid=started.pid,
                work_dir=facts.work_dir,
                connection=connection,
            ),
            hostname=link.target.host,
            resources=resources,
            internal_ip=ip,
            total_blocks=blocks,
            addresses=(info.hostname, *info.addresses),  # `instances` selectors may name any of them
        )

    async def create_instance(self, instance: InstanceRec) -> Provisioned:
        """Bootstrap the host; transient failures are retried until the provisioning timeout."""
        endpoint = self._endpoint(instance)
        started = time.monotonic()
        deadline = started + self.provisioning_timeout
        last: SshError | None = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                return await asyncio.wait_for(self._bootstrap(instance, endpoint, deadline), remaining)
            except SshError as e:
                # a new cloud instance's user data authorises the key: until it ran, a refusal is transient
                authorising = e.login_refused and bool((endpoint.connection or {}).get(AUTHORISED_BY_USER_DATA))
                if e.permanent and not authorising:
                    raise ProvisioningError(str(e)) from None
                last = e
                log.info("bootstrap of %s: %s; trying again", instance.name, e)
            except asyncio.TimeoutError:
                pass
            if time.monotonic() + RETRY_PAUSE >= deadline:
                waited = time.monotonic() - started
                reason = str(last) if last is not None else f"{instance.hostname}: setting the host up took too long"
                raise ProvisioningError(f"{reason} (gave up after {waited:.0f}s of trying)") from None
            await asyncio.sleep(RETRY_PAUSE)

    async def recover(self, instance: InstanceRec) -> None:
        """The agent does not answer: if the host answers SSH, start its agent again (adopting one that
        still runs with this instance's token). Raises ``SshError`` when the host cannot be reached."""
        endpoint = self._endpoint(instance)
        link = self._link(instance.id, endpoint.connection or {})
        _facts, started = await self._install(link, endpoint, 30.0)
        if not started.adopted:
            log.warning("started the agent of %s (%s) again", instance.name, link.target.label())

    # ---- termination -------------------------------------------------------------------------
    async def open_port(self, instance: InstanceRec, port: int) -> tuple[Any, Any]:
        """A stream to ``port`` on the host's loopback, through the host's SSH connection (a replica's port)."""
        link = self._link(instance.id, self._endpoint(instance).connection or {})
        conn = await link.connection()
        try:
            return await conn.open_connection("127.0.0.1", port)
        except Exception as e:  # asyncssh's ChannelOpenError: nothing listens there
            raise ConnectionRefusedError(f"{instance.name}: port {port}: {e}") from None

    async def terminate_instance(self, instance_id: str, agent: AgentEndpoint | None) -> None:
        """Stop the agent, remove its jobs' containers and what corral put on the host. A host that
        cannot be reached keeps its leftovers (logged): the instance is gone either way."""
        if agent is None or not agent.connection:
            await self._forget(instance_id)
            return
        link = self._link(instance_id, agent.connection)
        try:
            await boot.remove_agent(link)
        except SshError as e:
            log.warning("could not clean up %s: %s", link.target.label(), e)
        finally:
            await self._forget(instance_id)

    async def _forget(self, instance_id: str) -> None:
        link = self._links.pop(instance_id, None)
        if link is not None:
            await link.close()

    async def reap_unknown(self, known_instance_ids: set[str]) -> list[str]:
        """Drop links of instances that are gone (a host corral does not know is never touched)."""
        for instance_id in [i for i in self._links if i not in known_instance_ids]:
            await self._forget(instance_id)
        return []

    async def aclose(self) -> None:
        for instance_id in list(self._links):
            await self._forget(instance_id)
