"""SSH fleets at plan and apply time: what ``ssh_config`` must hold, and one instance per host.

``check`` turns a configuration dstack's server would refuse into a 400 naming the field and the host
(cloud-only fields, a host without a user or key, a key corral cannot use, ``internal_ip`` given for
some hosts only, a host listed twice or already in another fleet). ``sync_hosts`` runs inside the
``fleets/apply`` transaction: it creates a ``pending`` instance for each host that has none (a new
host, or one whose last try failed: applying again retries it), and takes the removed hosts out --
at once when free, once their jobs finish when busy (they are marked and no longer receive work).
A host's instance carries everything needed to reach it in its ``agent`` JSON (see
:mod:`corral.backends.ssh`), its private keys sealed (:mod:`corral.backends.ssh_secrets`), and a fresh
agent token. The fleet's spec is stored with its keys sealed too (:func:`stored_spec`); specs are
compared key pair by key pair through the keys' public halves, never by opening the stored ones.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

from corral.backends.base import AgentEndpoint
from corral.backends.ssh_conn import private_key_problem
from corral.backends.ssh_secrets import seal_connection, seal_spec
from corral.config import fleet_spec
from corral.config.fleet_spec import FleetSpec
from corral.domain.documents import spec_configuration
from corral.domain.records import FleetRec, InstanceRec
from corral.domain.ssh_keys import public_halves
from corral.domain.statuses import READY_INSTANCE, UNFINISHED_INSTANCE
from corral.services.errors import ServiceError
from corral.store import fleets as store
from corral.store.db import Connection
from corral.store.encryption import Cipher, seal

#: Fleet fields that only choose cloud offers (dstack's ``BackendFleetConfiguraionProps``).
CLOUD_ONLY = (
    "nodes",
    "reservation",
    "resources",
    "backends",
    "regions",
    "availability_zones",
    "instance_types",
    "spot_policy",
    "retry",
    "max_price",
    "idle_duration",
    "tags",
    "backend_options",
)
REMOVED_MESSAGE = "Removed from the fleet: leaves once its jobs finish"


def is_ssh(spec: dict[str, Any]) -> bool:
    """Whether a stored fleet spec document configures an SSH fleet."""
    return fleet_spec.is_ssh(spec)


def _hostname(host: Any) -> str:
    return str(host if isinstance(host, str) else host.get("hostname"))


def _key(params: dict[str, Any] | None) -> str | None:
    key = (params or {}).get("ssh_key") or {}
    return key.get("private") if isinstance(key, dict) else None


def _proxy(params: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    if not params:
        return None
    private = _key(params)
    if not private:
        raise ServiceError(
            f"No SSH key for the proxy jump {params.get('hostname')} of {where}: set its `identity_file` "
            "(the CLI sends the key's contents as `ssh_key`)"
        )
    return {
        "host": params["hostname"],
        "port": int(params.get("port") or 22),
        "user": params["user"],
        "private_key": private,
        "proxy_jump": None,
    }


def host_connections(conf: dict[str, Any]) -> list[dict[str, Any]]:
    """One connection document per host (global ``ssh_config`` values under each host's own); raises
    ``ServiceError`` for a host without a user or key."""
    ssh = conf["ssh_config"]
    env = conf.get("env") or {}
    out = []
    for raw in ssh.get("hosts") or []:
        host: dict[str, Any] = {"hostname": raw} if isinstance(raw, str) else raw
        name = str(host["hostname"])
        user = host.get("user") or ssh.get("user")
        if not user:
            raise ServiceError(f"No SSH user for host {name}: set `ssh_config.user` or the host's `user`")
        private = _key(host) or _key(ssh)
        if not private:
            raise ServiceError(
                f"No SSH key for host {name}: set `ssh_config.identity_file` or the host's `identity_file` "
                "(the CLI sends the key's contents as `ssh_key`)"
            )
        blocks = host.get("blocks")
        out.append(
            {
                "host": name,
                "port": int(host.get("port") or ssh.get("port") or 22),
                "user": user,
                "private_key": private,
                "proxy_jump": _proxy(host.get("proxy_jump") or ssh.get("proxy_jump"), f"host {name}"),
                "internal_ip": host.get("internal_ip"),
                "network": ssh.get("network"),
                "blocks": blocks if blocks is not None else conf.get("blocks", 1),
                "env": env,
            }
        )
    return out


def host_id(connection: dict[str, Any]) -> str:
    return f"{connection['host']}:{connection['port']}"


def check(conf: dict[str, Any]) -> list[dict[str, Any]]:
    """Refuse what dstack's server refuses for an SSH fleet (400s); returns the hosts' connections."""
    extra = [name for name in CLOUD_ONLY if conf.get(name) is not None]
    if extra:
        raise ServiceError(
            f"SSH fleet configuration does not support the following fields: {extra} "
            "(they choose cloud offers; an SSH fleet has exactly the hosts in `ssh_config.hosts`)"
        )
    for name, value in (conf.get("env") or {}).items():
        if not isinstance(value, str):
            raise ServiceError(f"`env` variable {name} of the fleet has no value: give it one (`{name}=...`)")
    connections = host_connections(conf)
    seen: set[str] = set()
    for c in connections:
        for what, key in (("host", c["private_key"]), ("proxy jump", (c["proxy_jump"] or {}).get("private_key"))):
            problem = private_key_problem(key) if key else None
            if problem:
                raise ServiceError(f"Unsupported SSH key for the {what} of {c['host']}: {problem}")
        if host_id(c) in seen:
            raise ServiceError(f"Host {host_id(c)} is listed twice in `ssh_config.hosts`")
        seen.add(host_id(c))
    with_ip = sum(1 for c in connections if c["internal_ip"])
    if with_ip not in (0, len(connections)):
        raise ServiceError("internal_ip must be specified for all hosts")
    if with_ip and conf["ssh_config"].get("network"):
        raise ServiceError("internal_ip is mutually exclusive with network")
    return connections


def _connection(inst: InstanceRec) -> dict[str, Any]:
    return dict((inst.agent or {}).get("connection") or {})


async def check_not_in_other_fleets(conn: Connection, connections: list[dict[str, Any]], fleet_id: str | None) -> None:
    """A host belongs to one fleet at a time (as in dstack)."""
    taken = {
        host_id(_connection(i))
        for i in await store.list_instances(conn, statuses=UNFINISHED_INSTANCE)
        if i.backend == "ssh" and i.fleet_id != fleet_id and _connection(i)
    }
    clash = [host_id(c) for c in connections if host_id(c) in taken]
    if clash:
        raise ServiceError(f"Instances [{', '.join(clash)}] are already assigned to a fleet.")


def _comparable_host(host: Any) -> Any:
    if isinstance(host, str):
        return host
    out = {k: v for k, v in host.items() if k != "identity_file"}
    if isinstance(out.get("proxy_jump"), dict):
        out["proxy_jump"] = {k: v for k, v in out["proxy_jump"].items() if k != "identity_file"}
    return out


def update_problem(current: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why ``new`` cannot replace ``current`` in place (dstack's rule: only hosts may be added or
    removed), or None when it can. Keys are compared by their public halves (the stored private ones
    are sealed)."""
    a, b = spec_configuration(public_halves(current)), spec_configuration(public_halves(new))
    if bool(a.get("ssh_config")) != bool(b.get("ssh_config")):
        return "Fleet type changed between cloud and SSH, cannot update"
    changed = [k for k in sorted(set(a) | set(b)) if k not in ("ssh_config", "name") and a.get(k) != b.get(k)]
    sa, sb = a["ssh_config"], b["ssh_config"]
    changed += [f"ssh_config.{k}" for k in sorted(set(sa) | set(sb)) if k != "hosts" and sa.get(k) != sb.get(k)]
    if changed:
        return f"Failed to update fields {changed}. Can only update ['ssh_config.hosts']."
    old_hosts = {_hostname(h): _comparable_host(h) for h in sa.get("hosts") or []}
    new_hosts = {_hostname(h): _comparable_host(h) for h in sb.get("hosts") or []}
    differ = sorted(h for h in old_hosts.keys() & new_hosts.keys() if old_hosts[h] != new_hosts[h])
    if differ:
        return f"Hosts configuration changed, cannot update: {differ}"
    return None


def stored_spec(cipher: Cipher, spec: dict[str, Any]) -> dict[str, Any]:
    """A fleet spec as the database keeps it: an SSH fleet's private keys sealed."""
    return seal_spec(cipher, spec)


def same_spec(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two fleet specs configure the same fleet (sealed or open, keys compare by public half)."""
    return spec_configuration(public_halves(a)) == spec_configuration(public_halves(b))


async def sync_hosts(
    conn: Connection,
    fleet: FleetRec,
    connections: list[dict[str, Any]],
    now: float,
    cipher: Cipher,
    actor_id: str | None = None,
) -> bool:
    """Make the fleet's instances match its hosts (a new host's connection stored with its keys
    sealed by ``cipher``); returns whether anything changed."""
    wanted = {host_id(c): c for c in connections}
    current = {host_id(_connection(i)): i for i in fleet.instances if i.status != "terminated" and _connection(i)}
    changed = False
    for inst in fleet.instances:
        if inst.status == "terminated":  # a failed try (retried below) or a removed host: stop showing it
            await store.update_instance(conn, inst.id, {"deleted": True})
            changed = True
    for key, inst in current.items():
        if key in wanted:
            if inst.termination_reason is not None and inst.status in READY_INSTANCE:  # removed, then added back
                await store.update_instance(
                    conn, inst.id, {"termination_reason": None, "termination_reason_message": None}
                )
                changed = True
            continue
        changed = True
        if inst.status == "busy" or inst.busy_blocks:
            await store.update_instance(
                conn,
                inst.id,
                {"termination_reason": "terminated_by_user", "termination_reason_message": REMOVED_MESSAGE},
            )
        else:
            await store.update_instance(
                conn,
                inst.id,
                {"status": "terminating", "termination_reason": "terminated_by_user"},
                expect_status=("pending", "provisioning", "idle"),
                actor_id=actor_id,
            )
    used = {i.instance_num for i in fleet.instances if i.status != "terminated"}
    for key, c in wanted.items():
        if key in current:
            continue
        num = next(n for n in range(len(used) + 1) if n not in used)
        used.add(num)
        blocks = c["blocks"]
        agent = AgentEndpoint(url="", token=seal(cipher, secrets.token_hex(24)), connection=seal_connection(cipher, c))
        await store.insert_instance(
            conn,
            {
                "id": str(uuid.uuid4()),
                "project_id": fleet.project_id,
                "fleet_id": fleet.id,
                "name": f"{fleet.name}-{num}",
                "instance_num": num,
                "status": "pending",
                "backend": "ssh",
                "region": "remote",
                "price": 0.0,
                "offer": None,
                "total_blocks": int(blocks) if isinstance(blocks, int) else None,
                "hostname": c["host"],
                "agent": store.dump(agent.to_json()),
                "created_at": now,
                "last_processed_at": now,
            },
            actor_id,
        )
        changed = True
    return changed


async def prepare(conn: Connection, spec: FleetSpec, current: FleetRec | None) -> list[dict[str, Any]] | None:
    """The hosts' connections of an SSH fleet spec after every check (400s); None for a cloud fleet."""
    if not spec.is_ssh:
        return None
    connections = check(spec.configuration)
    await check_not_in_other_fleets(conn, connections, current.id if current is not None else None)
    return connections


def plan_action(current: FleetRec | None, spec: FleetSpec) -> str:
    """``update`` when applying ``spec`` changes the fleet in place, ``create`` when it re-creates it."""
    if current is None:
        return "create"
    if (spec.is_ssh or is_ssh(current.spec)) and update_problem(current.spec, spec.as_dict()) is not None:
        return "create"
    return "update"
