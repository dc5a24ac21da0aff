"""A private ACME CA for tests: Debian's ``pebble`` and ``pebble-challtestsrv``, started for real, offline.

The recipe is the one of the gateway lab (pebble 2.4.0): the harness claims a /24 of its own with ``bridge_net``
(bridge ``cpb<N>br``, 10.77.N.0/24, the bridge at ``.1``; creating the bridge is the atomic claim, and a pid file
under /run/corral-pebble lets the next start remove what a crashed run left), makes a throwaway CA with
``cryptography`` and a certificate for pebble's API (pebble's API speaks HTTPS only; its IP SAN is the bridge's
address), starts ``pebble-challtestsrv`` as the DNS server (A questions get no answer until told with
:meth:`PebbleLab.set_default_ipv4` or :meth:`PebbleLab.add_a`), and ``pebble`` resolving through it and validating
HTTP-01 on port 80 of the address it resolves. ``PEBBLE_VA_NOSLEEP=1`` (else it sleeps up to 15 s before
validating); ``PEBBLE_WFE_NONCEREJECT`` is 0 unless ``nonce_reject`` says otherwise (``None``: pebble's default, a
share of requests answered ``badNonce``). ``eab_keys`` turns on ``externalAccountBindingRequired`` with those MAC
keys (key id -> base64url key).

Pebble makes a new issuing root at every start: :meth:`PebbleLab.root_pem` fetches it from the management API
(``/roots/0``); :meth:`PebbleLab.restart` restarts pebble (new root, accounts and orders forgotten);
:meth:`PebbleLab.stop_ca` and :meth:`PebbleLab.start_ca` do the same in two steps, the CA unreachable between them.

Hosts that answer the CA's HTTP-01 fetches are network namespaces on the bridge (:meth:`PebbleLab.add_host`),
each with its own address; a test runs its server there with :meth:`PebbleLab.spawn_in`. A gateway on a fake
SSH host (``fakehosts``) is reachable from pebble too: its /24 is routed on this machine. ``http_port`` moves the
port pebble validates on (its ``httpPort``), for a gateway on this machine that must not take its real port 80.

Needs root (namespaces, a bridge, port 80) and the Debian package ``pebble`` (``scripts/test.sh`` installs it).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import bridge_net

OWNERS = pathlib.Path("/run/corral-pebble")
TAG = "cpb"  # bridge cpb<N>br, namespaces cpb<N>h<name> (bridge_net)
FIRST_NET, LAST_NET = 40, 250
ACME_PORT, MANAGEMENT_PORT, DNS_PORT, DNS_MANAGEMENT_PORT = 14000, 15000, 8053, 8055


def require() -> None:
    """Fail (never skip) with what to do when the lab cannot run here."""
    if os.geteuid() != 0:
        raise RuntimeError("the pebble lab needs root (network namespaces, a bridge, port 80): run the tests as root")
    missing = [b for b in ("pebble", "pebble-challtestsrv", "ip") if shutil.which(b) is None]
    if missing:
        raise RuntimeError(
            f"the pebble lab needs {', '.join(missing)}: apt-get install pebble iproute2 (scripts/test.sh does)"
        )


def _remove_net(n: int) -> None:
    bridge_net.remove(TAG, n)
    (OWNERS / str(n)).unlink(missing_ok=True)


def reap_stale() -> None:
    """Remove the nets of labs whose process died without cleaning up."""
    for n in bridge_net.stale_nets(TAG, OWNERS):
        # pebble and challtestsrv listen on the bridge's address: kill them by the pids they recorded
        for pidfile in OWNERS.glob(f"{n}.*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            pidfile.unlink(missing_ok=True)
        _remove_net(n)


def throwaway_ca(base: pathlib.Path, ip: str) -> pathlib.Path:
    """A CA (``ca.pem``) and a certificate for ``ip`` and 127.0.0.1 signed by it (``api.pem``, ``api.key``)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral test CA for pebble's API")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.IPAddress(ipaddress.ip_address(a)) for a in (ip, "127.0.0.1")]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pebble")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (base / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (base / "api.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (base / "api.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return base / "ca.pem"


@dataclass
class LabHost:
    """A network namespace on the lab's bridge: an address with its own port 80."""

    name: str
    ns: str
    ip: str


class PebbleLab:
    def __init__(
        self,
        base: pathlib.Path,
        *,
        eab_keys: dict[str, str] | None = None,
        nonce_reject: int | None = 0,
        http_port: int = 80,
    ) -> None:
        self.base = pathlib.Path(base)
        #: The port pebble's HTTP-01 validation connects to (its ``httpPort``): 80, as a public CA's, unless a
        #: test's gateway listens elsewhere on this machine (a forward from port 80 stood in for).
        self.http_port = http_port
        self.eab_keys = eab_keys
        self.nonce_reject = nonce_reject
        self.n = -1
        self.hosts: dict[str, LabHost] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._spawned: list[subprocess.Popen[bytes]] = []

    # -- addresses ------------------------------------------------------------------------------
    @property
    def subnet(self) -> str:
        return f"10.77.{self.n}"

    @property
    def bridge_ip(self) -> str:
        return f"{self.subnet}.1"

    @property
    def directory_url(self) -> str:
        return f"https://{self.bridge_ip}:{ACME_PORT}/dir"

    @property
    def ca_bundle(self) -> pathlib.Path:
        """The PEM that pebble's API (the ACME directory) is verified against."""
        return self.base / "ca.pem"

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> PebbleLab:
        require()
        reap_stale()
        self.base.mkdir(parents=True, exist_ok=True)
        self.n = bridge_net.claim(TAG, "10.77", OWNERS, range(FIRST_NET, LAST_NET), "the pebble lab")
        try:
            throwaway_ca(self.base, self.bridge_ip)
            self._start_dns()
            self._write_config()
            self._start_pebble()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, role: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.base / f"{role}.log", "ab")  # noqa: SIM115 (the child keeps it)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self._procs[role] = proc
        (OWNERS / f"{self.n}.{role}.pid").write_text(str(proc.pid))

    def _start_dns(self) -> None:
        self._spawn(
            "challtestsrv",
            [
                "pebble-challtestsrv",
                "-defaultIPv4", "",
                "-defaultIPv6", "",
                "-dns01", f"{self.bridge_ip}:{DNS_PORT}",
                "-management", f"{self.bridge_ip}:{DNS_MANAGEMENT_PORT}",
                "-http01", "",
                "-https01", "",
                "-tlsalpn01", "",
            ],
        )  # fmt: skip
        self._wait(lambda: self._dns_post("/clear-a", {"host": "ready.probe."}), "pebble-challtestsrv")

    def _write_config(self) -> None:
        config: dict[str, object] = {
            "listenAddress": f"{self.bridge_ip}:{ACME_PORT}",
            "managementListenAddress": f"{self.bridge_ip}:{MANAGEMENT_PORT}",
            "certificate": str(self.base / "api.pem"),
            "privateKey": str(self.base / "api.key"),
            "httpPort": self.http_port,
            "tlsPort": 443,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": self.eab_keys is not None,
        }
        if self.eab_keys is not None:
            config["externalAccountMACKeys"] = self.eab_keys
        (self.base / "pebble.json").write_text(json.dumps({"pebble": config}))

    def _start_pebble(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEBBLE_")}
        env["PEBBLE_VA_NOSLEEP"] = "1"
        if self.nonce_reject is not None:
            env["PEBBLE_WFE_NONCEREJECT"] = str(self.nonce_reject)
        self._spawn(
            "pebble",
            ["pebble", "-config", str(self.base / "pebble.json"), "-dnsserver", f"{self.bridge_ip}:{DNS_PORT}"],
            env,
        )
        self._wait(lambda: self._https_get(f"https://{self.bridge_ip}:{MANAGEMENT_PORT}/roots/0"), "pebble")

    def _wait(self, probe: object, what: str, timeout: float = 20.0) -> None:
        assert callable(probe)
        deadline = time.monotonic() + timeout
        while True:
            try:
                probe()
                return
            except OSError as e:
                role = "pebble" if what == "pebble" else "challtestsrv"
                proc = self._procs.get(role)
                if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                    log = (self.base / f"{role}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{what} did not start ({e}); its log:\n{log}") from None
                time.sleep(0.05)

    def _stop_proc(self, role: str) -> None:
        proc = self._procs.pop(role, None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        (OWNERS / f"{self.n}.{role}.pid").unlink(missing_ok=True)

    def restart(self) -> None:
        """Restart pebble: a new issuing root, and every account, order and nonce forgotten."""
        self.stop_ca()
        self.start_ca()

    def stop_ca(self) -> None:
        """Stop pebble alone: the CA is unreachable until :meth:`start_ca`."""
        self._stop_proc("pebble")

    def start_ca(self) -> None:
        """Start pebble again after :meth:`stop_ca`: as after :meth:`restart`, a new root and no account known."""
        self._start_pebble()

    def stop(self) -> None:
        for proc in self._spawned:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        self._spawned.clear()
        for role in list(self._procs):
            self._stop_proc(role)
        if self.n >= 0:
            _remove_net(self.n)
        self.hosts.clear()

    # -- the CA ---------------------------------------------------------------------------------
    def _https_get(self, url: str) -> bytes:
        ctx = ssl.create_default_context(cafile=str(self.ca_bundle))
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            body: bytes = resp.read()
        return body

    def root_pem(self) -> str:
        """The root that pebble's certificates chain to in this run (a new one at every start)."""
        return self._https_get(f"https://{self.bridge_ip}:{MANAGEMENT_PORT}/roots/0").decode("ascii")

    # -- DNS ------------------------------------------------------------------------------------
    def _dns_post(self, path: str, body: dict[str, object]) -> None:
        req = urllib.request.Request(
            f"http://{self.bridge_ip}:{DNS_MANAGEMENT_PORT}{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()

    def set_default_ipv4(self, ip: str) -> None:
        """Answer every A question with ``ip`` (a ``*`` record for every name)."""
        self._dns_post("/set-default-ipv4", {"ip": ip})

    def add_a(self, host: str, addresses: list[str]) -> None:
        """Answer A questions for exactly ``host`` with ``addresses`` (wins over the default)."""
        self._dns_post("/add-a", {"host": host.rstrip(".") + ".", "addresses": addresses})

    def clear_a(self, host: str) -> None:
        self._dns_post("/clear-a", {"host": host.rstrip(".") + "."})

    # -- hosts on the bridge --------------------------------------------------------------------
    def add_host(self, name: str) -> LabHost:
        """A namespace at the next address of the /24 (``.11`` first); ``name`` at most 4 characters."""
        assert len(name) <= 4 and name not in self.hosts
        ip = f"{self.subnet}.{11 + len(self.hosts)}"
        ns = f"{TAG}{self.n}h{name}"
        bridge_net.plug(ns, f"{TAG}{self.n}v{name}", f"{TAG}{self.n}br", ip)
        host = LabHost(name=name, ns=ns, ip=ip)
        self.hosts[name] = host
        return host

    def spawn_in(self, host: LabHost, argv: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``'s namespace (killed by :meth:`stop` at the latest)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", host.ns, *argv], stdout=out, stderr=subprocess.STDOUT)
        self._spawned.append(proc)
        return proc
