"""A small client of the Docker Engine API: ``http.client`` over the engine's unix socket (stdlib only).

The endpoint is ``unix:///path`` (default ``unix:///var/run/docker.sock``), ``tcp://host:port`` (plain
HTTP) or a bare socket path; the agent takes it from ``--docker-host``, else ``DOCKER_HOST``. Paths are
unversioned, so the engine speaks its own API version (1.40+ is needed for GPU device requests).

Two errors: :class:`DockerUnavailable` (no connection, or no answer in time) and :class:`DockerError`
(the engine answered with an error; ``status`` is the HTTP status and the message is the engine's own).
Streams (pull progress, logs) are read as they arrive, with no timeout.
"""

from __future__ import annotations

import base64
import calendar
import http.client
import json
import os
import socket
import struct
import time
from collections.abc import Generator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

DEFAULT_HOST = "unix:///var/run/docker.sock"
_FRAME = struct.Struct(">BxxxL")
_SOURCES = {1: "stdout", 2: "stderr"}


class DockerError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class DockerUnavailable(DockerError):
    """The engine could not be reached (no socket, refused, timed out)."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def resolve_host(host: str | None) -> str:
    return host or os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def registry_auth_header(username: str, password: str, registry: str) -> str:
    """The ``X-Registry-Auth`` header value (base64url of the auth JSON)."""
    data = json.dumps({"username": username, "password": password, "serveraddress": registry})
    return base64.urlsafe_b64encode(data.encode()).decode("ascii")


def parse_timestamp(text: str) -> float:
    """Docker's RFC 3339 UTC timestamp with nanoseconds (``2024-05-01T12:00:00.123456789Z``) -> epoch."""
    base, _, frac = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + (float("0." + frac) if frac else 0.0)


class Docker:
    def __init__(self, host: str | None = None, timeout: float = 30.0) -> None:
        self.host = resolve_host(host)
        self.timeout = timeout
        url = urlsplit(self.host)
        self._unix: str | None = None
        self._netloc = ""
        self._unsupported = False
        if url.scheme == "unix" or (not url.scheme and self.host.startswith("/")):
            self._unix = url.path if url.scheme else self.host
        elif url.scheme in ("tcp", "http") and url.netloc:
            self._netloc = url.netloc
        else:
            self._unsupported = True  # every call says so (an agent must start even with an odd DOCKER_HOST)

    # ---- transport --------------------------------------------------------------------------
    def _open(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = -1.0,
        raw: Any = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request (``body``: JSON; ``raw``: bytes or a file, with its Content-Length in
        ``headers``) and return the open response; an error status raises :class:`DockerError`."""
        if self._unsupported:
            raise DockerUnavailable(f"unsupported Docker host {self.host!r}: use unix:///path or tcp://host:port")
        t = self.timeout if timeout == -1.0 else timeout
        conn: http.client.HTTPConnection
        conn = _UnixConnection(self._unix, t) if self._unix else http.client.HTTPConnection(self._netloc, timeout=t)
        url = path + ("?" + urlencode(query) if query else "")
        hdrs = dict(headers or {})
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        try:
            conn.request(method, url, body=data, headers=hdrs)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise DockerUnavailable(f"cannot reach the Docker engine at {self.host}: {e}") from None
        if resp.status >= 400:
            try:
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                raw = b""
            finally:
                conn.close()
            raise DockerError(_error_message(raw, resp.status), resp.status)
        return conn, resp

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; the decoded JSON reply (None when empty)."""
        conn, resp = self._open(method, path, **kwargs)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise DockerUnavailable(f"the Docker engine at {self.host} broke off: {e}") from None
        finally:
            conn.close()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    # ---- engine and images ------------------------------------------------------------------
    def version(self, timeout: float = 3.0) -> str:
        data = self.call("GET", "/version", timeout=timeout)
        return str(data.get("Version") or "?") if isinstance(data, dict) else "?"

    def image(self, ref: str) -> dict[str, Any] | None:
        """The image's inspect document, or None if the engine does not have it."""
        try:
            data = self.call("GET", f"/images/{_q(ref)}/json")
        except DockerError as e:
            if e.status == 404:
                return None
            raise
        return data if isinstance(data, dict) else {}

    def pull(self, name: str, tag: str, auth: str | None = None) -> Generator[dict[str, Any], None, None]:
        """The engine's progress messages; an error in the stream raises :class:`DockerError`."""
        headers = {"X-Registry-Auth": auth} if auth else None
        conn, resp = self._open(
            "POST", "/images/create", query={"fromImage": name, "tag": tag}, headers=headers, timeout=None
        )
        try:
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise DockerUnavailable(f"the Docker engine at {self.host} broke off the pull: {e}") from None
                if not line:
                    return
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("error") or event.get("errorDetail"):
                    detail = event.get("errorDetail") or {}
                    raise DockerError(str(detail.get("message") or event.get("error")), 500)
                yield event
        finally:
            conn.close()

    # ---- containers -------------------------------------------------------------------------
    def create(self, name: str, config: dict[str, Any]) -> str:
        data = self.call("POST", "/containers/create", query={"name": name}, body=config)
        return str(data["Id"])

    def put_archive(self, cid: str, path: str, tar: Any, size: int) -> None:
        """Unpack a tar archive (a file object of ``size`` bytes) at ``path`` in a container."""
        headers = {"Content-Type": "application/x-tar", "Content-Length": str(size)}
        self.call("PUT", f"/containers/{_q(cid)}/archive", query={"path": path}, raw=tar, headers=headers)

    def start(self, cid: str) -> None:
        self.call("POST", f"/containers/{_q(cid)}/start")

    def kill(self, cid: str, signal: str) -> None:
        self.call("POST", f"/containers/{_q(cid)}/kill", query={"signal": signal})

    def wait(self, cid: str) -> int:
        """Block until the container is not running; its exit code."""
        data = self.call("POST", f"/containers/{_q(cid)}/wait", query={"condition": "not-running"}, timeout=None)
        return int(data.get("StatusCode", -1)) if isinstance(data, dict) else -1

    def inspect(self, cid: str) -> dict[str, Any] | None:
        try:
            data = self.call("GET", f"/containers/{_q(cid)}/json")
        except DockerError as e:
            if e.status == 404:
                return None
            raise
        return data if isinstance(data, dict) else None

    def remove(self, cid: str) -> None:
        try:
            self.call("DELETE", f"/containers/{_q(cid)}", query={"force": "1", "v": "1"})
        except DockerError as e:
            if e.status != 404:
                raise

    def containers(self, label: str) -> list[dict[str, Any]]:
        """All containers (running or not) that carry ``label`` (``key`` or ``key=value``)."""
        data = self.call("GET", "/containers/json", query={"all": "1", "filters": json.dumps({"label": [label]})})
        return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []

    def has_network(self, name: str) -> bool:
        try:
            self.call("GET", f"/networks/{_q(name)}")
        except DockerError as e:
            if e.status == 404:
                return False
            raise
        return True

    def logs(
        self, cid: str, since: float | None = None, follow: bool = True
    ) -> Generator[tuple[str, float, bytes], None, None]:
        """``(source, timestamp, bytes)`` per log message (a line, or a piece of a long one); with
        ``follow`` it ends when the container stops."""
        query = {"stdout": "1", "stderr": "1", "timestamps": "1", "follow": "1" if follow else "0"}
        if since is not None:
            query["since"] = f"{since:.9f}"
        conn, resp = self._open("GET", f"/containers/{_q(cid)}/logs", query=query, timeout=None)
        try:
            while True:
                try:
                    header = resp.read(_FRAME.size)
                    if len(header) < _FRAME.size:
                        return
                    stream, size = _FRAME.unpack(header)
                    payload = resp.read(size)
                except (OSError, http.client.HTTPException):
                    return
                stamp, sep, message = payload.partition(b" ")
                try:
                    ts = parse_timestamp(stamp.decode("ascii")) if sep else time.time()
                except ValueError:
                    ts, message = time.time(), payload
                if message:
                    yield _SOURCES.get(stream, "stdout"), ts, message
        finally:
            conn.close()


def _q(part: str) -> str:
    return quote(part, safe="/:@")


def _error_message(raw: bytes, status: int) -> str:
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"]).strip()
    text = raw.decode("utf-8", "replace").strip()
    return text or f"HTTP {status}"
