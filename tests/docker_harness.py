"""A real Docker engine and image registries for the container tests, on this machine only.

:class:`DockerEngine` starts Debian's ``dockerd`` with its own data root, exec root, socket, pidfile,
cgroup parent and bridge (a private /24 picked per process), so it never touches a system Docker or
another test session's, and :meth:`DockerEngine.stop` removes all of it again (the recipe's cleanup
list: containers, the nsfs mount, the bridge, cgroup dirs). No image registry can be reached from here,
so images are made with ``docker import`` from a busybox root filesystem (:func:`busybox_rootfs`).
:class:`Registry` is Debian's ``docker-registry`` on loopback (optionally with htpasswd auth) and
:class:`SlowProxy` sits in front of one to make pulls take a while (so ``pulling`` can be observed).
Everything needs root; a missing binary fails loudly with what to install. The daemons die with the
test process even when it is killed, and a session cleans up what a killed one left (:func:`cleanup_stale`).
"""

from __future__ import annotations

import ctypes
import http.client
import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: The images the ``docker_engine`` fixture makes (by ``docker import``; nothing is pulled from the internet).
UBUNTU = "ubuntu:22.04"  # a busybox root filesystem under the seed's image name
CMD_IMAGE = "corral-test/cmd:1"  # WORKDIR /srv and a CMD of its own
DEFAULT_IMAGE = "corral-test/default:1"  # has /bin/bash (a wrapper of busybox sh) and a marker file
REGISTRY_USER = ("bob", "s3cret-pw")

PACKAGES = {"dockerd": "docker.io", "docker-registry": "docker-registry", "busybox": "busybox-static"}


def require_tools() -> None:
    if os.geteuid() != 0:
        raise RuntimeError("the container tests need root (dockerd); CI runs them as root")
    missing = [pkg for tool, pkg in PACKAGES.items() if shutil.which(tool) is None]
    if missing or shutil.which("docker") is None:
        raise RuntimeError(
            f"the container tests need Debian's {', '.join(missing or ['docker.io'])}: "
            "scripts/test.sh installs them (as root)"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def busybox_rootfs(extra: dict[str, bytes] | None = None, executable: tuple[str, ...] = ()) -> bytes:
    """A tar of a minimal root filesystem: static busybox and its applets, /etc/passwd with ``root``,
    ``alice`` (1000) and ``nobody``, /tmp; plus ``extra`` files (paths without a leading slash)."""
    busybox = Path(shutil.which("busybox") or "/bin/busybox").read_bytes()
    applets = subprocess.run(["busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
    files: dict[str, bytes] = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000:alice:/home/alice:/bin/sh\n"
        b"nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
        "etc/group": b"root:x:0:\nalice:x:1000:\nnogroup:x:65534:\n",
        **(extra or {}),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d, mode in (("bin", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777), ("home/alice", 0o755)):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, mode
            if d == "home/alice":
                info.uid = info.gid = 1000
            tar.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(busybox), 0o755
        tar.addfile(info, io.BytesIO(busybox))
        for a in applets:
            if a != "busybox":
                link = tarfile.TarInfo(f"bin/{a}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name in executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


#: What a docker-in-docker image needs of the host's Debian packages (docker.io, containerd, runc): the
#: engine, its CLI, containerd with its runc shim, runc and docker-init.
DIND_BINARIES = (
    "/usr/sbin/dockerd",
    "/usr/bin/docker",
    "/usr/bin/containerd",
    "/usr/bin/containerd-shim-runc-v2",
    "/usr/sbin/runc",
    "/usr/bin/docker-init",
)

#: The image's ``start-dockerd``, as dstack's dind image has one on its PATH (dstack's
#: docker/dind/start-dockerd: it starts dockerd and waits for its API, printing its log and exiting 102 if it
#: does not come up). This one starts it in the background with the vfs storage driver (overlayfs does not nest
#: in the job's own overlay root), no bridge or iptables, and its containers' cgroups under ``@PARENT@`` (where
#: the job's container sees the host's cgroup tree, the test engine's own parent, which its stop removes).
START_DOCKERD = b"""#!/bin/sh
dockerd --storage-driver=vfs --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
  --cgroup-parent=@PARENT@ >/var/log/dockerd.log 2>&1 &
i=0
until docker version >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -gt 150 ]; then echo 'failed to start dockerd:'; tail -20 /var/log/dockerd.log; exit 102; fi
  sleep 0.1
done
echo 'dockerd started'
"""


def _shared_libraries(binary: str) -> list[str]:
    """The shared libraries ``ldd`` says ``binary`` loads (paths as it names them)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) > 2 and parts[2].startswith("/"):
            found.append(parts[2])
        elif parts and parts[0].startswith("/"):
            found.append(parts[0])
    return found


def dind_rootfs() -> bytes:
    """A tar of a docker-in-docker root filesystem: busybox, ``/bin/bash`` (a wrapper of busybox sh, as the
    job's shell is bash), the host's Docker binaries with the libraries they load, ``start-dockerd`` and a
    busybox root filesystem at ``/images/tiny.tar`` for the inner engine to ``docker import``."""
    missing = [b for b in DIND_BINARIES if not Path(b).exists()]
    if missing:
        raise RuntimeError(f"the docker-in-docker image needs {', '.join(missing)}: scripts/test.sh installs docker.io")
    extra: dict[str, bytes] = {
        "bin/bash": b'#!/bin/sh\nexec /bin/sh "$@"\n',
        "usr/local/bin/start-dockerd": START_DOCKERD.replace(
            b"@PARENT@", f"/{CGROUP_PREFIX}{os.getpid()}/dind".encode()
        ),
        "images/tiny.tar": busybox_rootfs(),
        "var/log/.keep": b"",
        "var/lib/docker/.keep": b"",
        "run/.keep": b"",
    }
    executable = ["bin/bash", "usr/local/bin/start-dockerd"]
    for binary in DIND_BINARIES:
        name = "usr/bin/" + os.path.basename(binary)
        extra[name] = Path(binary).read_bytes()
        executable.append(name)
        for lib in _shared_libraries(binary):
            extra[lib.lstrip("/")] = Path(os.path.realpath(lib)).read_bytes()
            executable.append(lib.lstrip("/"))
    return busybox_rootfs(extra, tuple(executable))


BRIDGE_PREFIX = "crldk"
CGROUP_PREFIX = "corral-test-"


def _die_with_parent(sig: int) -> Any:
    """``preexec_fn``: the child gets ``sig`` when the test process dies (even killed), so no daemon
    outlives an interrupted session."""

    def set_pdeathsig() -> None:
        ctypes.CDLL(None).prctl(1, sig)  # PR_SET_PDEATHSIG

    return set_pdeathsig


def cleanup_stale() -> None:
    """Remove the bridges and cgroup dirs of earlier sessions that died without cleaning up (their
    test process is gone and no dockerd uses them any more)."""
    in_use = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"dockerd") and b"--bridge" in args:
            in_use.add(args[args.index(b"--bridge") + 1].decode(errors="replace"))

    def stale(name: str, prefix: str) -> bool:
        pid = name[len(prefix) :]
        return pid.isdigit() and not Path(f"/proc/{pid}").exists() and f"{BRIDGE_PREFIX}{pid}" not in in_use

    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip() if ":" in line else ""
        if name.startswith(BRIDGE_PREFIX) and stale(name, BRIDGE_PREFIX):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    for ctrl in Path("/sys/fs/cgroup").iterdir():
        for d in ctrl.glob(f"{CGROUP_PREFIX}*"):
            if d.is_dir() and stale(d.name, CGROUP_PREFIX):
                _rmdir_tree(d)


def _rmdir_tree(d: Path) -> None:
    for sub in [*sorted(d.rglob("*"), key=lambda p: -len(p.parts)), d]:
        if sub.is_dir():
            try:
                sub.rmdir()
            except OSError:
                pass


def _subnet_in_use(prefix: str) -> bool:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return f" {prefix}." in out


class DockerEngine:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.sock = base / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.bridge = f"{BRIDGE_PREFIX}{os.getpid()}"  # <= 15 characters
        self.cgroup_parent = f"{CGROUP_PREFIX}{os.getpid()}"
        self.subnet = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._key_json_existed = Path("/etc/docker/key.json").exists()

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> DockerEngine:
        require_tools()
        cleanup_stale()
        self.base.mkdir(parents=True, exist_ok=True)
        for third in [os.getpid() % 200 + 20, *range(20, 250)]:
            if not _subnet_in_use(f"10.91.{third}"):
                self.subnet = f"10.91.{third}"
                break
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for cmd in (
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            subprocess.run(cmd, check=True, capture_output=True)
        log = open(self.base / "dockerd.log", "wb")  # noqa: SIM115 - handed to the daemon
        self.proc = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(self.base / "data"),
                "--exec-root",
                str(self.base / "exec"),
                "--pidfile",
                str(self.base / "dockerd.pid"),
                "-H",
                self.host,
                "--bridge",
                self.bridge,
                "--cgroup-parent",
                f"/{self.cgroup_parent}",
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=_die_with_parent(signal.SIGTERM),  # dockerd then stops its containers
        )
        log.close()
        deadline = time.monotonic() + 30
        while self.cli("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.base / "dockerd.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"dockerd did not start: {tail}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for cid in self.cli("ps", "-aq", check=False).stdout.split():
                self.cli("rm", "-f", cid, check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        netns = self.base / "exec" / "netns"
        if netns.is_dir():
            for ns in netns.iterdir():
                subprocess.run(["umount", str(ns)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for ctrl in Path("/sys/fs/cgroup").iterdir():
            if (ctrl / self.cgroup_parent).is_dir():
                _rmdir_tree(ctrl / self.cgroup_parent)
        if not self._key_json_existed:
            Path("/etc/docker/key.json").unlink(missing_ok=True)
        subprocess.run(["umount", "-R", str(self.base / "data")], capture_output=True)  # overlay leftovers
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- helpers ----------------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_HOST": self.host, "DOCKER_CONFIG": str(self.base / "cli-config")}
        out = subprocess.run(
            ["docker", *args],
            input=input.decode("latin-1") if input is not None else None,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {out.stderr.strip()}")
        return out

    def import_image(self, tag: str, rootfs: bytes, *changes: str) -> None:
        """``docker import`` a root filesystem tar as ``tag`` (``changes``: Dockerfile lines like CMD)."""
        args = ["import"]
        for c in changes:
            args += ["--change", c]
        proc = subprocess.run(
            ["docker", *args, "-", tag],
            input=rootfs,
            capture_output=True,
            env={**os.environ, "DOCKER_HOST": self.host},
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"docker import {tag}: {proc.stderr.decode(errors='replace')}")

    def containers(self, label: str | None = None) -> list[str]:
        args = ["ps", "-aq", "--no-trunc"] + (["--filter", f"label={label}"] if label else [])
        return self.cli(*args).stdout.split()

    def login(self, registry: str, user: str, password: str) -> None:
        self.cli("login", "-u", user, "--password-stdin", registry, input=password.encode())

    def push(self, local: str, remote: str) -> None:
        self.cli("tag", local, remote)
        self.cli("push", remote)
        self.cli("rmi", remote)


def bcrypt_htpasswd(user: str, password: str) -> str:
    """An htpasswd line with a bcrypt hash (libcrypt's, as the registry wants), without extra packages."""
    lib = ctypes.CDLL("libcrypt.so.1")
    lib.crypt_gensalt.restype = lib.crypt.restype = ctypes.c_char_p
    salt = lib.crypt_gensalt(b"$2b$", 5, None, 0)
    hashed = lib.crypt(password.encode(), salt)
    return f"{user}:{hashed.decode()}\n"


class Registry:
    """``docker-registry`` on <host>:<free port> (loopback by default); with ``auth`` ((user, password)),
    htpasswd basic auth."""

    def __init__(self, base: Path, auth: tuple[str, str] | None = None, host: str = "127.0.0.1") -> None:
        self.base = base
        self.port = free_port()
        self.host = host
        self.address = f"{host}:{self.port}"
        self.auth = auth
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Registry:
        self.base.mkdir(parents=True, exist_ok=True)
        config = [
            "version: 0.1",
            "log:\n  level: error",
            f"storage:\n  filesystem:\n    rootdirectory: {self.base / 'data'}",
            f"http:\n  addr: {self.address}",
        ]
        if self.auth is not None:
            (self.base / "htpasswd").write_text(bcrypt_htpasswd(*self.auth))
            config.append(f"auth:\n  htpasswd:\n    realm: corral-test\n    path: {self.base / 'htpasswd'}")
        (self.base / "config.yml").write_text("\n".join(config) + "\n")
        log = open(self.base / "registry.log", "wb")  # noqa: SIM115 - handed to the registry
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(self.base / "config.yml")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=_die_with_parent(signal.SIGKILL),
        )
        log.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry did not start: {(self.base / 'registry.log').read_text()}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


class SlowProxy:
    """HTTP proxy to a registry that holds every blob download back by ``delay`` seconds."""

    def __init__(self, target: str, delay: float) -> None:
        self.target, self.delay = target, delay
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._forward("GET")

            def do_HEAD(self) -> None:
                self._forward("HEAD")

            def _forward(self, method: str) -> None:
                if method == "GET" and "/blobs/" in self.path:
                    time.sleep(proxy.delay)
                conn = http.client.HTTPConnection(proxy.target, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(method, self.path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if method == "HEAD" else None
                self.send_header("Content-Length", length or str(len(body)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(body)
                conn.close()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Registries:
    open: Registry
    private: Registry  # htpasswd auth: REGISTRY_USER
    engine: DockerEngine

    def push(self, registry: Registry, name: str, size: int = 256 * 1024) -> str:
        """Build an image with a layer of its own (``size`` random bytes), push it as
        ``<registry>/<name>`` and remove it from the engine, so that using it means a real pull."""
        ref = f"{registry.address}/{name}"
        self.engine.import_image(ref, busybox_rootfs({"payload.bin": os.urandom(size)}))
        if registry.auth is not None:
            self.engine.login(registry.address, *registry.auth)
        self.engine.cli("push", ref)
        self.engine.cli("rmi", ref)
        return ref
