"""``corral server backup`` and ``corral server restore``: the offline and online care of a server's state.

A backup is the database alone (SQLite's online backup API, taken while the server runs) and never the
encryption key: whoever holds a backup cannot open the secrets sealed in it without the key, kept apart.
A restore goes onto a fresh state directory only, checks that the backup's schema is one this corral can
migrate, that the key it is given is the one the backup's values were sealed with (saying which key id
it needs when not), and opens every sealed value before it puts the database in place. On Postgres both
say to use ``pg_dump``/``pg_restore`` (docs/postgres.md).

Imports: settings, store (backup, encryption, migrate) and the server's state-directory lock.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from corral.server import StateDirLocked, lock_state_dir
from corral.settings import Settings
from corral.store.backup import BackupError, backup_sqlite, inspect, restore_sqlite, sealed_values, sqlite_path
from corral.store.encryption import EncryptionError, cipher_for, has_key, key_location
from corral.store.migrate import head_revisions, known_revisions

Echo = Callable[[str], None]
#: A database of more pages than this reports its progress as it is copied.
_PROGRESS_FROM_PAGES = 25_000


class AdminError(Exception):
    """The command cannot be done; the message says why and what to do."""


def _postgres(settings: Settings, verb: str) -> AdminError:
    head = ", ".join(sorted(head_revisions()))
    return AdminError(
        f"The database is not SQLite ({settings.database_url.split('://', 1)[0]}): {verb} it with pg_dump / "
        f"pg_restore as docs/postgres.md shows (this corral's schema version is {head}). The encryption key is "
        f"not in the database either way: keep {key_location(settings)} apart from the dump."
    )


def backup(settings: Settings, dest: Path, echo: Echo) -> None:
    """A consistent copy of the server's database in ``dest``, taken while the server may be running."""
    source = sqlite_path(settings.database_url)
    if source is None:
        raise _postgres(settings, "back")
    if dest.exists() and dest.is_dir():
        dest = dest / "corral-backup.db"
    if dest.exists():
        raise AdminError(f"{dest} exists already: give a new file name")
    shown = [0]

    def progress(done: int, total: int) -> None:
        percent = done * 100 // max(total, 1)
        if total >= _PROGRESS_FROM_PAGES and percent >= shown[0] + 10:
            shown[0] = percent
            echo(f"  {percent}% ({done}/{total} pages)")

    try:
        backup_sqlite(source, dest, progress)
        info = inspect(dest)
    except (BackupError, OSError) as e:
        raise AdminError(str(e)) from None
    echo(f"Backed up {source} to {dest} ({info.size / 2**20:.1f} MiB, schema version {info.revision}).")
    ids = ", ".join(sorted(info.key_ids)) or "none"
    echo(
        f"The backup holds no encryption key. Its {info.sealed} sealed values (tokens, keys, credentials, "
        f"secrets) need the key with id {ids}, kept at {key_location(settings)}: store it apart from the backup."
    )


def restore(settings: Settings, source: Path, echo: Echo) -> None:
    """The backup at ``source`` put in place as this (fresh) server's database, every sealed value opened
    with this server's key first."""
    dest = sqlite_path(settings.database_url)
    if dest is None:
        raise _postgres(settings, "restore")
    try:
        info = inspect(source)
    except BackupError as e:
        raise AdminError(str(e)) from None
    if info.revision not in known_revisions():
        raise AdminError(
            f"{source} has schema version {info.revision}, which this corral does not know: it was made by a "
            "newer corral. Restore it with that version (or a later one)."
        )
    try:
        lock = lock_state_dir(settings)  # no server may start on the state directory meanwhile
    except StateDirLocked as e:
        raise AdminError(f"{e} A restore needs the server stopped.") from None
    with lock:
        _check_key(settings, info.key_ids)
        opened = _open_every_sealed_value(settings, source)
        try:
            restore_sqlite(source, dest)
        except (BackupError, OSError) as e:
            raise AdminError(str(e)) from None
    behind = "" if info.revision in head_revisions() else " (an older schema: the server migrates it when it starts)"
    echo(f"Restored {source} to {dest}, schema version {info.revision}{behind}.")
    echo(f"Opened all {opened} sealed values with the key at {key_location(settings)}. Start the server: corral server")


def _check_key(settings: Settings, needed: frozenset[str]) -> None:
    ids = ", ".join(sorted(needed))
    if needed and not has_key(settings):
        raise AdminError(
            f"The backup's secrets are sealed with the key id {ids}, and this server has no key: put that key "
            f"file at {settings.encryption_key_file} (or set CORRAL_SERVER_ENCRYPTION_KEY_FILE or "
            "CORRAL_SERVER_ENCRYPTION_KEY), then restore again."
        )
    if not needed:
        return
    try:
        ours = cipher_for(settings).key_id
    except EncryptionError as e:
        raise AdminError(f"Cannot use the encryption key at {key_location(settings)}: {e}") from None
    if needed != {ours}:
        raise AdminError(
            f"The backup's secrets are sealed with the key id {ids}, and this server's key ({key_location(settings)}) "
            f"has the id {ours}: give it the key the backup was made with."
        )


def _open_every_sealed_value(settings: Settings, source: Path) -> int:
    count = 0
    for where, value in sealed_values(source):
        try:
            cipher_for(settings).decrypt(value)
        except EncryptionError as e:
            raise AdminError(f"A sealed value in {where} cannot be opened: {e}. The backup is not restored.") from None
        count += 1
    return count
