"""gpuhunt's published AWS catalogue, fetched into the server's state directory and used instead of the
shipped snapshot; and ``CatalogSource``, which says which catalogue the AWS backend prices offers from.

gpuhunt (the library dstack takes its offers from) publishes one catalogue per provider:
``<base>/aws/version`` holds the current version and ``<base>/aws/<version>/catalog.zip`` holds
``aws.csv`` in gpuhunt's v2 CSV format (gpuhunt ``_internal/catalog.py``: ``Catalog.load``), the format
corral's shipped ``catalog.csv`` already has. corral reads that format itself rather than depending on
gpuhunt: the loader is ours already (``catalog.load``), the package would bring ``requests`` and its own
cache and reload policy (every 15 minutes) onto the server, and its data would still have to be fetched
from the same bucket, which a server without internet cannot reach -- the shipped snapshot is what it
falls back to either way.

The fetch (``fetch``) is blocking I/O (``urllib``, so ``file://`` bases work too) and runs in a thread,
from the refresher worker (``workers.aws_catalog``), never on start-up. The cache is ``<server
dir>/aws-catalog/``: ``aws.csv`` and ``meta.json`` (version, URL, when fetched), each replaced whole.

Imports ``backends.aws.catalog`` and the standard library (the default URL is ``settings.GPUHUNT_CATALOG_URL``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from corral.backends.aws import catalog

#: A cached catalogue younger than this is used without asking for a newer one (at most daily).
MAX_AGE = 24 * 3600.0
#: After a failed fetch, the next try waits this long.
RETRY_AFTER = 3600.0
#: Seconds one request may take before the fetch gives up.
TIMEOUT = 60.0
#: The largest ``catalog.zip`` accepted (gpuhunt's AWS catalogue is well under a megabyte).
MAX_ZIP_BYTES = 64 * 1024 * 1024


class FetchError(RuntimeError):
    """The published catalogue could not be fetched or used; the message says which URL and why."""


@dataclass(frozen=True)
class Meta:
    """What the cache holds: gpuhunt's ``version``, fetched from ``url`` at ``fetched_at`` (epoch)."""

    version: str
    url: str
    fetched_at: float

    @property
    def info(self) -> catalog.CatalogInfo:
        day = datetime.fromtimestamp(self.fetched_at, tz=timezone.utc).date().isoformat()
        return catalog.CatalogInfo(f"gpuhunt AWS catalogue {self.version} ({self.url})", day)


def cache_dir(server_dir: Path) -> Path:
    return server_dir / "aws-catalog"


def due(meta: Meta | None, now: float, max_age: float = MAX_AGE) -> bool:
    """Whether the cache (``meta``; None: none) is old enough to ask for a newer catalogue."""
    return meta is None or now - meta.fetched_at >= max_age


def read_meta(directory: Path) -> Meta | None:
    """The cache's ``meta.json``, or None when there is no usable cache."""
    try:
        raw = json.loads((directory / "meta.json").read_text())
        meta = Meta(str(raw["version"]), str(raw["url"]), float(raw["fetched_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta if (directory / "aws.csv").is_file() else None


def _get(url: str, limit: int) -> bytes:
    import urllib.request  # on the first fetch, in the refresher's thread (it pulls in http and ssl)

    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:  # the operator's URL, file:// included
            data: bytes = r.read(limit + 1)
    except (OSError, ValueError) as e:
        raise FetchError(f"{url}: {e}") from None
    if len(data) > limit:
        raise FetchError(f"{url}: larger than {limit} bytes")
    return data


def _replace(path: Path, data: bytes) -> None:
    """Write ``path`` whole: a temporary file in the same directory, then an atomic rename."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _unzip(url: str, data: bytes) -> bytes:
    import io
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return z.read("aws.csv")
    except (zipfile.BadZipFile, KeyError) as e:
        raise FetchError(f"{url}: not a gpuhunt catalogue archive with aws.csv ({e})") from None


def fetch(base_url: str, directory: Path, now: float | None = None) -> Meta:
    """Ask ``base_url`` for its AWS catalogue's version; download and check it when it differs from the
    cache's; record the fetch. Raises ``FetchError`` (the cache is left as it was)."""
    now = time.time() if now is None else now
    base = base_url.rstrip("/")
    version = _get(f"{base}/aws/version", 1024).decode(errors="replace").strip()
    if not version or "/" in version:
        raise FetchError(f"{base}/aws/version: {version!r} is not a catalogue version")
    directory.mkdir(parents=True, exist_ok=True)
    old = read_meta(directory)
    if old is None or old.version != version or old.url != base:
        url = f"{base}/aws/{version}/catalog.zip"
        csv_bytes = _unzip(url, _get(url, MAX_ZIP_BYTES))
        check = directory / ".aws.csv.check"
        check.write_bytes(csv_bytes)
        try:
            catalog.load(check)
        except catalog.CatalogError as e:
            raise FetchError(f"{url}: {e}") from None
        finally:
            check.unlink(missing_ok=True)
        _replace(directory / "aws.csv", csv_bytes)
    meta = Meta(version, base, now)
    _replace(directory / "meta.json", json.dumps(meta.__dict__).encode())
    return meta


class CatalogSource:
    """The catalogue the AWS backend prices offers from: ``explicit`` (``CORRAL_AWS_CATALOG``) when set,
    else the fetched gpuhunt catalogue in ``live_dir`` when there is one, else the shipped snapshot.
    Read on first use and again after ``reload``."""

    def __init__(self, explicit: Path | None = None, live_dir: Path | None = None) -> None:
        self.explicit = explicit
        self.live_dir = live_dir
        self._current: catalog.Catalog | None = None

    def current(self) -> catalog.Catalog:
        if self._current is None:
            self._current = self._read()
        return self._current

    def reload(self) -> None:
        self._current = None

    def _read(self) -> catalog.Catalog:
        if self.explicit is not None:
            return catalog.read(self.explicit, f"CORRAL_AWS_CATALOG={self.explicit}")
        meta = read_meta(self.live_dir) if self.live_dir is not None else None
        if meta is not None and self.live_dir is not None:
            try:
                rows = catalog.load(self.live_dir / "aws.csv")
            except catalog.CatalogError:
                pass  # a damaged cache: the snapshot until the next fetch replaces it
            else:
                return catalog.Catalog(rows, meta.info)
        return catalog.read()
