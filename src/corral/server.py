"""The composition root of ``corral server``: settings, the state-directory lock, migrations, the
first-start bootstrap, backends, the app and uvicorn. The only module that wires every package."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
import os
import sys
from dataclasses import dataclass
from typing import IO, Any

from corral.config.server_config import ServerConfigError
from corral.settings import Settings


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

    @property
    def admin_token(self) -> str:
        from corral.store.encryption import open_sealed

        return open_sealed(self.ctx.cipher, self.admin_stored_token)


def _check_encryption_key(settings: Settings) -> None:
    """A bad key is a start-up error, not a 500 on the first ``repos/init``."""
    from corral.store.encryption import EncryptionError, cipher_for

    try:
        cipher_for(settings)
    except EncryptionError as e:
        raise ServerConfigError(f"Cannot use the encryption key (tokens, private keys, credentials): {e}") from None


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


async def prepare(settings: Settings) -> Prepared:
    """Migrate, bootstrap and build the app (used by ``corral server`` and by tests)."""
    from corral.api.app import create_app
    from corral.backends.local import LocalCompute
    from corral.backends.ssh import SSHCompute
    from corral.backends.ssh_secrets import KeyOpener
    from corral.config.server_config import load_server_config
    from corral.services import accounts
    from corral.store.db import Database
    from corral.store.encryption import cipher_for
    from corral.store.migrate import upgrade
    from corral.workers.context import Context
    from corral.workers.runtime import Workers

    server_config = load_server_config(settings.server_dir / "config.yml")
    private_state_dir(settings)
    _check_encryption_key(settings)
    db = Database(settings.database_url)
    await upgrade(db)
    cipher = cipher_for(settings)
    boot = await accounts.bootstrap(db, settings.admin_token, cipher=cipher)
    try:
        _check_same_key(settings, boot.admin.token)
    except ServerConfigError:
        await db.dispose()
        raise
    if server_config is not None:
        await accounts.apply_server_config(
            db,
            boot.admin,
            [(p.name, [b.model_dump() for b in p.backends]) for p in server_config.projects],
            cipher=cipher,
        )
    computes: dict[str, Any] = {
        "local": LocalCompute(
            settings.instances_dir,
            settings.provisioning_timeout,
            settings.agent_request_timeout,
            docker_host=settings.docker_host,
            reap_grace=0.0 if db.is_sqlite else 60.0,
            host_cpus=settings.local_cpus,
            host_memory_mib=settings.local_memory_mib,
            host_blocks=settings.local_blocks,
        ),
        "ssh": SSHCompute(
            settings.server_dir,
            settings.provisioning_timeout,
            settings.ssh_connect_timeout,
            settings.agent_request_timeout,
            key_opener=KeyOpener(lambda: cipher_for(settings)),
        ),
    }
    ctx = Context(settings=settings, db=db, computes=computes)
    return Prepared(create_app(ctx, Workers(ctx)), ctx, boot.admin.token, boot.created)


def _write_cli_config(url: str, token: str) -> str | None:
    try:
        from corral.sdk import config_file

        config_file.add_project("main", url, token, default=True)
        return str(config_file.config_path())
    except Exception as e:  # the server works without it; say why
        print(f"Could not write the CLI configuration: {e}", file=sys.stderr)
        return None


def main(host: str = "127.0.0.1", port: int = 3000, log_level: str = "info", **_: Any) -> int:
    # No cyclic collection while start-up imports and builds long-lived objects (modules, models, routes):
    # the collector would walk them again and again for nothing (measured: ~800 unreachable objects of
    # ~95,000 after start-up's imports, and 50-100 ms of collections). Frozen and re-enabled below.
    gc.disable()
    import uvicorn

    settings = Settings.from_env(host=host, port=port, log_level=log_level)
    try:
        lock = lock_state_dir(settings)
    except StateDirLocked as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    async def run() -> None:
        try:
            prepared = await prepare(settings)
        except ServerConfigError as e:
            print(f"Error: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        url = f"http://{host}:{port}"
        if prepared.admin_created:
            print(f"The admin token is {prepared.admin_token}", flush=True)
            if settings.write_cli_config:
                path = _write_cli_config(url, prepared.admin_token)
                if path:
                    print(f"Configured the main project in {path}", flush=True)
        # Start-up made many long-lived objects (modules, models): keep them out of every collection (no
        # collection first: the little garbage start-up leaves is not worth a full pass), and collect less
        # often -- request handling makes many short-lived containers (measured: +15-20% runs/list
        # throughput).
        gc.freeze()
        gc.set_threshold(20_000, 20, 50)
        gc.enable()
        # ws="none": the API has no WebSocket endpoint, so uvicorn need not import a WebSocket library.
        config = uvicorn.Config(
            prepared.app, host=host, port=port, log_level="warning", lifespan="on", access_log=False, ws="none"
        )
        server = uvicorn.Server(config)
        print(f"The corral server {_version()} (dstack API {_api()}) is running at {url}", flush=True)
        try:
            await server.serve()
        finally:
            await prepared.ctx.db.dispose()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    finally:
        lock.close()
    return 0


def _version() -> str:
    from corral import __version__

    return __version__


def _api() -> str:
    from corral import DSTACK_API_VERSION

    return DSTACK_API_VERSION
