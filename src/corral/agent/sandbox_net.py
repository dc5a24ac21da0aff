"""The sandbox's network plumbing: corral's bridge with NAT, and one network namespace per job.

Driven through iproute2's ``ip`` (in batch mode: one process per step) and ``iptables-restore`` (or
``nft`` where iptables is missing), so it works on any Linux host with Python 3.9 and those tools; a job's
own network, made once per job, is made over netlink in the agent's process (:mod:`corral.agent.netlink`),
``ip`` being the fallback.

- **bridge** (:func:`bridge_up`, :func:`bridge_down`): ``corral0`` (configurable) holding the subnet's
  first address as every job's gateway, IPv4 forwarding on, and three rules tagged ``corral-sandbox``:
  masquerade of the subnet's traffic leaving through any other interface, and forwarding accepted from
  the bridge and back to it for established connections (so a host whose FORWARD policy is DROP, as
  Docker leaves it, still lets jobs out). It exists while at least one job holds an address.
- **job network** (:func:`job_net_up`, :func:`job_net_down`): a named namespace ``corral-s<slot>`` with
  ``lo`` and ``eth0`` (one end of a veth pair whose host end ``crv<slot>`` is on the bridge), the job's
  address and a default route through the gateway. Deleting the namespace removes the pair; one its job
  left without a socket (:func:`netns_quiet`) may serve the agent's next job instead.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import subprocess
import threading

from . import netlink

NETNS_DIR = "/run/netns"
RULE_TAG = "corral-sandbox"

log = logging.getLogger("corral.agent")


class NetError(Exception):
    """A network step failed; the message names the tool and its words."""


def netns_name(slot: int) -> str:
    return f"corral-s{slot}"


def veth_name(slot: int) -> str:
    return f"crv{slot}"


def missing_tools() -> list[str]:
    missing = [] if shutil.which("ip") else ["ip (iproute2)"]
    if not shutil.which("iptables-restore") and not shutil.which("nft"):
        missing.append("iptables or nft")
    return missing


def _run(args: list[str], stdin: str = "", check: bool = True) -> str:
    try:
        proc = subprocess.run(args, input=stdin.encode(), capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise NetError(f"{args[0]}: {e}") from None
    if check and proc.returncode != 0:
        words = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise NetError(f"{' '.join(args[:3])} failed: {words}")
    return proc.stdout.decode(errors="replace")


def bridge_exists(bridge: str) -> bool:
    return os.path.exists(f"/sys/class/net/{bridge}")


def _iptables_rules(bridge: str, subnet: str, op: str) -> str:
    tag = f'-m comment --comment "{RULE_TAG}"'
    return (
        "*nat\n"
        f"{op} POSTROUTING -s {subnet} ! -o {bridge} {tag} -j MASQUERADE\n"
        "COMMIT\n*filter\n"
        f"{op} FORWARD -i {bridge} {tag} -j ACCEPT\n"
        f"{op} FORWARD -o {bridge} -m conntrack --ctstate RELATED,ESTABLISHED {tag} -j ACCEPT\n"
        "COMMIT\n"
    )


def _nft_table(bridge: str, subnet: str) -> str:
    return (
        "table ip corral_sandbox {\n"
        "  chain post { type nat hook postrouting priority 100; "
        f'ip saddr {subnet} oifname != "{bridge}" masquerade; }}\n'
        "  chain fwd { type filter hook forward priority -1; "
        f'iifname "{bridge}" accept; oifname "{bridge}" ct state established,related accept; }}\n'
        "}\n"
    )


def bridge_up(bridge: str, network: ipaddress.IPv4Network) -> None:
    gateway = f"{network.network_address + 1}/{network.prefixlen}"
    if not bridge_exists(bridge):
        _run(["ip", "-batch", "-"], f"link add {bridge} type bridge\naddr add {gateway} dev {bridge}\n")
    _run(["ip", "link", "set", bridge, "up"])
    try:
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1\n")
    except OSError as e:
        raise NetError(f"cannot turn on IPv4 forwarding: {e}") from None
    if shutil.which("iptables-restore"):
        _run(["iptables-restore", "-w", "--noflush"], _iptables_rules(bridge, str(network), "-D"), check=False)
        _run(["iptables-restore", "-w", "--noflush"], _iptables_rules(bridge, str(network), "-I"))
    else:
        _run(["nft", "delete", "table", "ip", "corral_sandbox"], check=False)
        _run(["nft", "-f", "-"], _nft_table(bridge, str(network)))


def bridge_down(bridge: str, network: ipaddress.IPv4Network) -> None:
    if shutil.which("iptables-restore"):
        _run(["iptables-restore", "-w", "--noflush"], _iptables_rules(bridge, str(network), "-D"), check=False)
    elif shutil.which("nft"):
        _run(["nft", "delete", "table", "ip", "corral_sandbox"], check=False)
    if bridge_exists(bridge):
        _run(["ip", "link", "del", bridge], check=False)


def job_net_up(slot: int, address: str, bridge: str, network: ipaddress.IPv4Network) -> str:
    """Create the job's namespace; returns its path (for ``setns``). Made in this process over netlink
    (:mod:`corral.agent.netlink`) once ``/run/netns`` is the shared mount ``ip`` makes of it; with ``ip``
    otherwise, where netlink fails (logged), and for good after :data:`NETLINK_TRIES` failures in a row."""
    ns, veth = netns_name(slot), veth_name(slot)
    job_net_down(slot)  # a leftover of the same slot (a crash between steps)
    path = os.path.join(NETNS_DIR, ns)
    gateway = network.network_address + 1
    if _netlink_failures[0] < NETLINK_TRIES and _netns_dir_shared():
        try:
            netlink.make_job_network(path, veth, bridge, job_mac(address), address, network.prefixlen, str(gateway))
            _netlink_failures[0] = 0
            return path
        except netlink.NetlinkError as e:
            _netlink_failures[0] += 1
            gives_up = _netlink_failures[0] >= NETLINK_TRIES
            log.warning(
                "cannot make a job's network over netlink (%s); with ip%s", e, " from now on" if gives_up else ""
            )
            job_net_down(slot)
    _run(
        ["ip", "-batch", "-"],
        f"netns add {ns}\nlink add {veth} type veth peer name eth0 address {job_mac(address)} netns {ns}\n"
        f"link set {veth} master {bridge} up\n"
        # an entry left by an earlier job at this address with another MAC (from before MACs were fixed)
        f"neigh flush to {address} dev {bridge}\n",
    )
    _run(
        ["ip", "-n", ns, "-batch", "-"],
        f"addr add {address}/{network.prefixlen} dev eth0\nlink set eth0 up\nlink set lo up\n"
        f"route add default via {gateway}\n",
    )
    return path


#: Job networks are made with ``ip`` instead of over netlink once netlink failed this many times in a row.
NETLINK_TRIES = 3
_netlink_failures = [0]
_shared_seen = [False]


def _netns_dir_shared() -> bool:
    """Whether ``/run/netns`` is a shared mount (``ip netns add`` makes it one, so that a namespace's mount
    reaches every mount namespace and its removal too). ``os.path.ismount`` cannot tell: ``ip`` binds the
    directory on itself."""
    if not _shared_seen[0]:
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 6 and fields[4] == NETNS_DIR and any(x.startswith("shared:") for x in fields[6:]):
                        _shared_seen[0] = True
        except OSError:
            return False
    return _shared_seen[0]


def job_mac(address: str) -> str:
    """The MAC address of the job's ``eth0``: fixed by its IPv4 address (locally administered, as Docker's
    ``02:42:…``). A slot's address is reused by the next job, and the host keeps the address's neighbour
    entry for up to a minute after the previous job's veth is gone; with a random MAC the host would send
    the next job's connections to the old one's MAC until the entry expired (a service replica unreachable
    for ~30 s after it listens)."""
    return "02:cc:" + ":".join(f"{b:02x}" for b in ipaddress.IPv4Address(address).packed)


def veth_exists(slot: int) -> bool:
    return os.path.exists(f"/sys/class/net/{veth_name(slot)}")


def job_net_down(slot: int, wait: bool = True) -> None:
    """Remove the slot's namespace. The kernel removes its veth pair with it, a moment later (in the
    background); with ``wait`` a veth still there is deleted now (a process, and tens of ms while the kernel
    waits for the namespace's cleanup): what a slot's next job needs before it makes its own."""
    ns = netns_name(slot)
    path = os.path.join(NETNS_DIR, ns)
    if os.path.exists(path) and not _unmount_netns(path):
        _run(["ip", "netns", "del", ns], check=False)
    if wait and veth_exists(slot):
        try:
            netlink.delete_link(veth_name(slot))
        except netlink.NetlinkError:
            _run(["ip", "link", "del", veth_name(slot)], check=False)


def _unmount_netns(path: str) -> bool:
    """What ``ip netns del`` does, without starting it: detach the namespace's bind mount and remove the
    file (the kernel frees the namespace, and its veth pair, once no process is left in it). Every mount
    stacked on the file is detached (one propagated back from another mount namespace would otherwise keep
    the file busy: ``unlink`` refuses a mount point, and the slot's next namespace could not be made)."""
    try:
        c = netlink.libc()
        if c.umount2(path.encode(), netlink.MNT_DETACH) != 0:
            return False
        for _ in range(16):
            if c.umount2(path.encode(), netlink.MNT_DETACH) != 0:  # EINVAL: no mount left on it
                break
        os.unlink(path)
        return True
    except (OSError, AttributeError):
        return False


def netns_quiet(path: str) -> bool:
    """Whether the namespace at ``path`` holds no internet socket: none open, none closing, none in ``TIME_WAIT``.

    Read from its own ``/proc/net/sockstat`` and ``sockstat6`` (the counts of one namespace), in a thread that
    joins it and ends with it. A namespace its job left quiet can be handed to the agent's next job (nothing
    of the last job is left in it: its processes are gone, and a job cannot change the namespace itself, whose
    owner is the host's user namespace); a port in ``TIME_WAIT``, a connection still closing, or a count this
    kernel does not give (no ``tw``), and the namespace goes instead. False where it cannot be read."""
    texts: list[str] = []

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if netlink.libc().setns(fd, netlink.CLONE_NEWNET) != 0:
                    return
            finally:
                os.close(fd)
            for name in ("sockstat", "sockstat6"):
                with open(f"/proc/thread-self/net/{name}") as f:
                    texts.append(f.read())
        except (OSError, AttributeError):
            texts.clear()

    thread = threading.Thread(target=read, name="netns-sockstat", daemon=True)
    thread.start()
    thread.join()
    return len(texts) == 2 and sockstat_quiet("".join(texts))


def sockstat_quiet(text: str) -> bool:
    """Whether ``sockstat`` text counts no internet socket of its namespace (every protocol's ``inuse``, TCP's
    ``tw``). Not looked at: ``orphan``, ``alloc`` and ``mem``, which count the whole host, and ``sockets: used``,
    which counts every family (netlink and unix sockets too, whose count drops only a grace period after
    they close, and which nothing keeps once their processes are gone)."""
    seen_tw = False
    for line in text.splitlines():
        fields = line.partition(":")[2].split()
        for i in range(0, len(fields) - 1, 2):  # "key value" pairs
            key, value = fields[i], fields[i + 1]
            if key in ("inuse", "tw") and value != "0":
                return False
            seen_tw = seen_tw or key == "tw"
    return seen_tw


def leftover_slots() -> list[int]:
    """Slots whose namespace exists (to reap those no record claims)."""
    out = []
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        if name.startswith("corral-s") and name[8:].isdigit():
            out.append(int(name[8:]))
    return out
