"""The composition root of ``corral server``: settings, the state-directory lock, migrations, the
first-start bootstrap, backends, the app and uvicorn. The only module that wires every package."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import gc
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from corral.config.server_config import ServerConfigError
from corral.settings import Settings

if TYPE_CHECKING:
    from corral.backends.aws.compute import AWSCompute
    from corral.backends.base import Compute
    from corral.backends.slurm.compute import SlurmCompute
    from corral.backends.slurm.registry import SlurmRegistry
    from corral.policies.rest import RestPolicy

log = logging.getLogger("corral.server")

# How long an idle kept-alive connection stays open. uvicorn's default is 5 s
# (https://www.uvicorn.org/settings/#timeouts, ``--timeout-keep-alive``), the same as httpx's idle expiry
# (https://www.python-httpx.org/advanced/resource-limits/, ``keepalive_expiry``): a client that comes back
# after about 5 s raced the server's close and got a reset instead of an answer. A server should close idle
# connections later than its clients and any load balancer in front of it do, so that they always close
# first. AWS's Application Load Balancer keeps idle connections 60 s by default and recommends an application
# idle timeout larger than that, or the balancer may send a request on a connection being closed and answer 502
# (https://docs.aws.amazon.com/elasticloadbalancing/latest/application/edit-load-balancer-attributes.html,
# "Connection idle timeout"). An idle connection costs the server a socket and no task.
KEEP_ALIVE_S = 75


class StateDirLocked(RuntimeError):
    pass


def private_state_dir(settings: Settings) -> None:
    """The state directory and its ``data`` directory for this OS user alone (0700), tightened where an
    older corral made them looser; the key file (where it exists) 0600."""
    for d in (settings.server_dir, settings.data_dir):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        if d.stat().st_mode & 0o077:
            d.chmod(0o700)
    key_file = settings.encryption_key_file
    try:
        if key_file.stat().st_mode & 0o077:
            key_file.chmod(0o600)
    except FileNotFoundError:
        pass


def _settle_disk_reserve(settings: Settings) -> None:
    """The state directory's emergency reserve (:func:`corral.diskspace.settle_reserve`), said when it was used."""
    from corral import diskspace

    used = diskspace.settle_reserve(settings.server_dir, settings.disk_reserve, settings.min_free_disk)
    if used is not None:
        log.warning("%s", used, extra={"event": "disk_full"})


def lock_state_dir(settings: Settings) -> IO[str]:
    """Hold an exclusive lock on the state directory for the life of the process."""
    private_state_dir(settings)
    path = settings.server_dir / "server.lock"
    f = open(path, "a+")  # noqa: SIM115 - held until exit
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise StateDirLocked(
            f"Another corral server (pid {holder}) is already using the state directory {settings.server_dir}. "
            "Stop it first, or point CORRAL_SERVER_DIR at another directory."
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


@dataclass
class Prepared:
    app: Any
    ctx: Any
    #: The admin's token as stored (sealed): opened on demand, so that a start with nothing to print
    #: decrypts nothing (and imports no cryptography).
    admin_stored_token: str
    admin_created: bool
    admin_id: str = ""

    @property
    def admin_token(self) -> str:
        from corral.store.encryption import open_sealed

        return open_sealed(self.ctx.cipher, self.admin_stored_token)

    async def is_admin_token(self, token: str) -> bool:
        """Whether ``token`` is the admin's, told by its hash as every request's is (nothing decrypted)."""
        from corral.services import accounts
        from corral.services.errors import Forbidden

        try:
            return (await accounts.authenticate(self.ctx.db, token)).id == self.admin_id
        except Forbidden:
            return False


def _check_encryption_key(settings: Settings) -> None:
    """A bad key is a start-up error, not a 500 on the first ``repos/init``."""
    from corral.store.encryption import EncryptionError, cipher_for

    try:
        cipher_for(settings)
    except EncryptionError as e:
        raise ServerConfigError(f"Cannot use the encryption key (tokens, private keys, credentials): {e}") from None


def _say_where_the_key_is(settings: Settings) -> None:
    """One line at start: where the key is (and its id); a warning while it sits beside the database."""
    from corral.store.encryption import cipher_for, key_in_data_dir, key_location

    where, key_id = key_location(settings), cipher_for(settings).key_id
    log.info("Encryption key: %s (id %s)", where, key_id, extra={"event": "encryption_key", "key_id": key_id})
    if key_in_data_dir(settings):
        new = settings.server_dir / "encryption.key"
        log.warning(
            "The encryption key is in the data directory (%s), beside the database whose secrets it opens: a copy "
            "of that directory would carry both. Stop the server and move it: mv %s %s (or point "
            "CORRAL_SERVER_ENCRYPTION_KEY_FILE at a place outside the state directory)",
            where,
            where,
            new,
            extra={"event": "encryption_key_in_data_dir"},
        )


def _check_same_key(settings: Settings, stored_admin_token: str) -> None:
    """A server given another key than the one the database's values were sealed with (e.g. a Postgres
    replica without the others' key) could read no token, key or credential: it does not start."""
    from corral.store.encryption import cipher_for, key_id_of

    sealed_with, ours = key_id_of(stored_admin_token), cipher_for(settings).key_id
    if sealed_with is not None and sealed_with != ours:
        raise ServerConfigError(
            f"The database's tokens and keys are encrypted with another key (id {sealed_with}) than this server's "
            f"(id {ours}): give every server of this database the same CORRAL_SERVER_ENCRYPTION_KEY (or the same "
            "key file, CORRAL_SERVER_ENCRYPTION_KEY_FILE)"
        )


def _state_paths(settings: Settings) -> tuple[Path, ...]:
    """What no sandboxed job may see: the state dir, and the SQLite database's dir wherever it is."""
    paths = [settings.server_dir]
    scheme, sep, rest = settings.database_url.partition(":///")
    if sep and scheme.startswith("sqlite") and rest and not rest.startswith(":memory:"):
        paths.append(Path(rest.split("?", 1)[0]).parent)
    return tuple(paths)


def _lazy_websocket_protocol(*args: Any, **kwargs: Any) -> Any:
    """uvicorn's WebSocket protocol (wsproto), imported when the first WebSocket upgrade arrives."""
    from uvicorn.protocols.websockets.wsproto_impl import WSProtocol

    return WSProtocol(*args, **kwargs)


async def prepare(settings: Settings) -> Prepared:
    """Migrate, bootstrap and build the app (used by ``corral server`` and by tests)."""
    from corral.api.app import create_app
    from corral.backends.local import LocalCompute
    from corral.backends.slurm.registry import SlurmRegistry
    from corral.backends.ssh import SSHCompute
    from corral.backends.ssh_secrets import KeyOpener
    from corral.config.server_config import load_server_config
    from corral.context import Context
    from corral.services import accounts
    from corral.store.db import Database
    from corral.store.encryption import cipher_for
    from corral.store.migrate import upgrade
    from corral.workers.runtime import Workers

    server_config = load_server_config(settings.server_dir / "config.yml")
    apply_policies = _policies(settings, server_config.plugins if server_config is not None else [])
    private_state_dir(settings)
    _settle_disk_reserve(settings)
    _check_encryption_key(settings)
    _say_where_the_key_is(settings)
    db = Database(settings.database_url, events_ttl=settings.events_ttl)
    await upgrade(db)
    cipher = cipher_for(settings)
    boot = await accounts.bootstrap(db, settings.admin_token, cipher=cipher)
    try:
        _check_same_key(settings, boot.admin.token)
    except ServerConfigError:
        await db.dispose()
        raise
    slurm = SlurmRegistry()
    if server_config is not None:
        try:
            projects = [
                (p.name, await _stored_backends(p.name, p.backends, cipher, slurm)) for p in server_config.projects
            ]
        except ServerConfigError:
            await slurm.aclose()
            await db.dispose()
            raise
        await accounts.apply_server_config(db, boot.admin, projects, cipher=cipher)
        policies = [(p.name, policy) for p in server_config.projects if (policy := p.policy()) is not None]
        if policies:
            from corral.services.quotas import apply_config_policies

            await apply_config_policies(db, policies)
    computes: dict[str, Compute] = {
        "local": LocalCompute(
            settings.instances_dir,
            settings.provisioning_timeout,
            settings.agent_request_timeout,
            docker_host=settings.docker_host,
            reap_grace=0.0 if db.is_sqlite else 60.0,
            hide=_state_paths(settings),
            sandbox_mode=settings.sandbox,
            uid_range=settings.job_uid_range,
            host_cpus=settings.local_cpus,
            host_memory_mib=settings.local_memory_mib,
            host_blocks=settings.local_blocks,
            # half the watermark: below it the server stores no output, below this the agents store none either,
            # so the database keeps room for stops, deletes and jobs' ends (docs/disk-space.md)
            keep_free=settings.min_free_disk // 2,
        ),
        "ssh": SSHCompute(
            settings.server_dir,
            settings.provisioning_timeout,
            settings.ssh_connect_timeout,
            settings.agent_request_timeout,
            key_opener=KeyOpener(lambda: cipher_for(settings)),
            sandbox_mode=settings.sandbox,
            uid_range=settings.job_uid_range,
        ),
        "aws": _aws_compute(settings, db, _aws_regions(server_config)),
        "slurm": await _slurm_compute(settings, db, slurm),
    }
    ctx = Context(
        settings=settings,
        db=db,
        computes=computes,
        slurm=slurm,
        managers_manage_secrets=server_config is not None
        and server_config.default_permissions.allow_managers_manage_secrets,
    )
    if server_config is not None:
        from corral.workers.scheduling_preemption import settings_of

        ctx.preemption = settings_of(server_config.scheduling.preemption)
    ctx.policies = apply_policies
    ctx.ssh_endpoint, ctx.ssh_endpoint_close = _lazy_ssh_endpoint(ctx)
    return Prepared(create_app(ctx, Workers(ctx)), ctx, boot.admin.token, boot.created, boot.admin.id)


async def _stored_backends(
    project: str, backends: list[Any], cipher: Any, slurm: SlurmRegistry
) -> list[dict[str, Any]]:
    """A ``config.yml`` project's backends as stored: a cloud backend's credentials checked (a start-up
    error naming the project when they do not work) and sealed; a slurm backend's clusters handed to ``slurm``."""
    out: list[dict[str, Any]] = []
    for b in backends:
        doc = b.model_dump(exclude_none=True)
        if doc.get("type") == "aws":
            from corral.services import cloud_backends
            from corral.services.errors import ServiceError

            try:
                await cloud_backends.check_aws(doc)
            except ServiceError as e:
                raise ServerConfigError(f"config.yml: project {project}: backend aws: {e.msg}") from None
            doc = cloud_backends.sealed(cipher, doc)
        elif doc.get("type") == "slurm":
            doc = await _checked_slurm(project, doc, cipher, slurm)
        out.append(doc)
    return out


async def _checked_slurm(project: str, doc: dict[str, Any], cipher: Any, slurm: SlurmRegistry) -> dict[str, Any]:
    """A ``config.yml`` slurm backend checked against its clusters (a start-up error naming the project and the
    field when one does not work, or when another project names a cluster alike), sealed as stored."""
    from corral.services import slurm_backends
    from corral.services.errors import ServiceError

    try:
        doc = slurm_backends.parse(doc, from_api=False)
        clusters = await slurm_backends.check(slurm, project, doc)
    except ServiceError as e:
        raise ServerConfigError(f"config.yml: project {project}: backend slurm: {e.msg}") from None
    await slurm_backends.register(slurm, project, clusters)
    return slurm_backends.sealed(cipher, doc)


def _policies(settings: Settings, plugins: list[str]) -> tuple[RestPolicy, ...]:
    """The apply policies ``config.yml``'s ``plugins`` enable: ``rest_plugin`` needs its service's URL, as in
    dstack (which refuses every apply without it; corral refuses to start)."""
    from corral.policies.rest import RestPolicy

    if not plugins:
        return ()
    if settings.plugin_service_uri is None:
        raise ServerConfigError(
            f"config.yml: plugins: {plugins[0]} needs the URL of its policy service: set DSTACK_PLUGIN_SERVICE_URI "
            "(or CORRAL_PLUGIN_SERVICE_URI), e.g. http://127.0.0.1:8000, or remove it from `plugins`"
        )
    return tuple(RestPolicy(name, settings.plugin_service_uri, settings.plugin_request_timeout) for name in plugins)


def _aws_regions(server_config: Any) -> frozenset[str] | None:
    """The regions whose offers the AWS backend lists: those its ``config.yml`` blocks name (None: all)."""
    blocks = [b for p in (server_config.projects if server_config else []) for b in p.backends if b.type == "aws"]
    if not blocks or any(not b.regions for b in blocks):
        return None
    return frozenset(r for b in blocks for r in b.regions)


def _aws_compute(settings: Settings, db: Any, regions: frozenset[str] | None) -> AWSCompute:
    """The AWS backend (boto3 is imported on its first EC2 call, not here)."""
    from corral.backends.aws.compute import AWSCompute
    from corral.backends.aws.live_catalog import cache_dir
    from corral.backends.ssh import SSHCompute
    from corral.backends.ssh_secrets import KeyOpener
    from corral.services import cloud_backends
    from corral.store.encryption import cipher_for

    ssh = SSHCompute(
        settings.server_dir,
        settings.provisioning_timeout,
        settings.ssh_connect_timeout,
        settings.agent_request_timeout,
        key_opener=KeyOpener(lambda: cipher_for(settings)),
        sandbox_mode=settings.sandbox,
        uid_range=settings.job_uid_range,
    )

    async def server_id() -> str:
        return await cloud_backends.server_id(db)

    return AWSCompute(
        ssh,
        cloud_backends.project_loader(db, lambda: cipher_for(settings)),
        server_id,
        fleets=cloud_backends.fleet_loader(db),
        catalog_path=settings.aws_catalog,
        live_catalog_dir=cache_dir(settings.server_dir) if settings.aws_live_catalog else None,
        regions=regions,
        provisioning_timeout=settings.provisioning_timeout,
        unavailable_ttl=settings.aws_unavailable_ttl,
    )


async def _slurm_compute(settings: Settings, db: Any, registry: SlurmRegistry) -> SlurmCompute:
    """The Slurm backend over every project's clusters (stored backends loaded; nothing connects until used)."""
    from corral.backends.slurm.compute import SlurmCompute
    from corral.services import slurm_backends
    from corral.services.slurm_hooks import slurm_hooks
    from corral.store.encryption import cipher_for

    await slurm_backends.load_all(db, lambda: cipher_for(settings), registry)
    await slurm_backends.first_pass(registry)
    return SlurmCompute(
        registry,
        slurm_hooks(db),
        settings.server_dir / "slurm",
        offers=registry.offers,
        max_pending=settings.slurm_max_pending,
    )


def _lazy_ssh_endpoint(ctx: Any) -> tuple[Any, Any]:
    """The SSH endpoint of jobs, imported and started when the first job needs it (not at start-up), and
    what closes it."""
    holder: list[Any] = []

    async def ensure() -> tuple[str, int]:
        if not holder:
            from corral.sshd.endpoint import Endpoint

            s = ctx.settings
            host = s.ssh_host or s.host
            hostname = s.ssh_hostname or ("127.0.0.1" if host in ("0.0.0.0", "::", "") else host)
            holder.append(Endpoint(ctx, host, s.ssh_port, hostname))
        result: tuple[str, int] = await holder[0].ensure()
        return result

    async def close() -> None:
        if holder:
            await holder[0].close()

    return ensure, close


async def _repoint_cli_config(url: str, prepared: Prepared) -> str | None:
    """The CLI's projects that hold this server's admin token but another URL (it was started on another
    port before) are pointed here; returns the file's path if it changed. Costs one file read when nothing
    needs doing (the YAML parser is loaded only when the file lacks the URL); a project's token is told to
    be the admin's by its hash, so the stored token is not decrypted (and cryptography not imported)."""
    try:
        from corral.sdk import config_file

        path = config_file.config_path()
        try:
            text = path.read_text()
        except OSError:
            return None
        if f"url: {url}\n" in text:
            return None
        stale = [
            p for p in config_file.list_projects() if p["url"] != url and await prepared.is_admin_token(p["token"])
        ]
        for p in stale:
            config_file.add_project(p["name"], url, p["token"], default=p["default"])
        return str(path) if stale else None
    except Exception as e:  # the server works without it; say why
        print(f"Could not update the CLI configuration: {e}", file=sys.stderr)
        return None


def _write_cli_config(url: str, token: str) -> str | None:
    try:
        from corral.sdk import config_file

        config_file.add_project("main", url, token, default=True)
        return str(config_file.config_path())
    except Exception as e:  # the server works without it; say why
        print(f"Could not write the CLI configuration: {e}", file=sys.stderr)
        return None


class PortUnavailable(RuntimeError):
    """The address and port cannot be listened on; the message says why and what to do."""


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything is announced or written (uvicorn serves on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, as getaddrinfo gives it: asyncio sets TCP_NODELAY on accepted connections only for
    # such sockets (with proto 0, Nagle's algorithm delays every response: measured, +60% server CPU/apply).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        where = f"{host}:{port}"
        if e.errno == errno.EADDRINUSE:
            raise PortUnavailable(
                f"Port {port} is already in use on {host} (another corral server, or another program). "
                "Stop it, or start on a free port, e.g. "
                f"corral server --port {port + 1} (or CORRAL_SERVER_PORT={port + 1})."
            ) from None
        if e.errno == errno.EACCES:
            raise PortUnavailable(
                f"Not allowed to listen on {where}: ports below 1024 need root. Choose another with --port."
            ) from None
        if e.errno == errno.EADDRNOTAVAIL or isinstance(e, socket.gaierror):
            raise PortUnavailable(
                f"Cannot listen on {where}: {host} is not an address of this machine. Choose another with --host."
            ) from None
        raise PortUnavailable(f"Cannot listen on {where}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock


def _stop_quietly_on_signals() -> None:
    """After a signal-driven shutdown uvicorn re-raises the signal: let that end ``serve`` normally (so the
    database is closed and the shutdown line is logged) instead of killing the process mid-way."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)


def main(host: str = "127.0.0.1", port: int = 3000, log_level: str = "info", access_log: bool = False, **_: Any) -> int:  # noqa: PLR0915
    # No cyclic collection while start-up imports and builds long-lived objects (modules, models, routes):
    # the collector would walk them again and again for nothing (measured: ~800 unreachable objects of
    # ~95,000 after start-up's imports, and 50-100 ms of collections). Frozen and re-enabled below.
    gc.disable()
    from corral import server_logs

    settings = Settings.from_env(host=host, port=port, log_level=log_level, access_log=access_log)
    try:
        server_logs.configure(settings.log_level, settings.log_format)
    except server_logs.LogSetupError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    # Bind first: a port that cannot be used is said at once, before anything is announced or written.
    try:
        sock = bind_socket(host, port)
    except PortUnavailable as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    try:
        lock = lock_state_dir(settings)
    except StateDirLocked as e:
        sock.close()
        print(f"Error: {e}", file=sys.stderr)
        return 1
    import uvicorn

    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def run() -> None:
        try:
            prepared = await prepare(settings)
        except ServerConfigError as e:
            print(f"Error: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        if prepared.admin_created:
            print(f"The admin token is {prepared.admin_token}", flush=True)
            if settings.write_cli_config:
                path = _write_cli_config(url, prepared.admin_token)
                if path:
                    print(f"Configured the main project in {path}", flush=True)
        elif settings.write_cli_config:
            path = await _repoint_cli_config(url, prepared)
            if path:
                print(f"Pointed the CLI's projects of this server at {url} in {path}", flush=True)
        # Start-up made many long-lived objects (modules, models): keep them out of every collection (no
        # collection first: the little garbage start-up leaves is not worth a full pass), and collect less
        # often -- request handling makes many short-lived containers (measured: +15-20% runs/list
        # throughput).
        gc.freeze()
        gc.set_threshold(20_000, 20, 50)
        gc.enable()
        # ws: a WebSocket library is imported on the first upgrade request (a service's WebSocket through the
        # proxy), not at start-up.
        # log_config=None: our handler (server_logs) formats uvicorn's lines too; its access log stays off
        # (the app logs requests itself with --access-log).
        config = uvicorn.Config(
            prepared.app,
            log_config=None,
            log_level="warning",
            lifespan="on",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            ws=_lazy_websocket_protocol,  # type: ignore[arg-type]
        )
        server = uvicorn.Server(config)
        print(f"The corral server {_version()} (dstack API {_api()}) is running at {url}", flush=True)
        _stop_quietly_on_signals()
        try:
            await server.serve(sockets=[sock])
        finally:
            await prepared.ctx.db.dispose()
        log.info("The corral server at %s stopped", url, extra={"event": "server_stopped", "url": url})

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        lock.close()
    # Stopped cleanly: the database is closed and the last line written. The interpreter's own teardown
    # (every module and object, ~0.1 s measured) would only delay the exit a supervisor waits for.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _version() -> str:
    from corral import __version__

    return __version__


def _api() -> str:
    from corral import DSTACK_API_VERSION

    return DSTACK_API_VERSION
