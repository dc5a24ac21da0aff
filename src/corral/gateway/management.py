"""The management API the corral server drives (HTTP/1.1 JSON on a loopback address): every request carries
``Authorization: Bearer <token>`` (else 401); a bad body is a 400 ``{"detail": "..."}`` naming the field."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging

import corral

from . import statefile
from .core import model
from .httpio import Head, HttpError, parse_request, read_head, simple_response
from .live import Gateway

log = logging.getLogger("corral.gateway")
BODY_LIMIT = 1024 * 1024
HEAD_TIMEOUT = 60.0

Reply = tuple[int, object]


def _ok(value: object = None) -> Reply:
    return 200, {} if value is None else value


def _health(gw: Gateway) -> Reply:
    return _ok({"version": getattr(corral, "__version__", "unknown"), "started_at": gw.started_at})


def _services(gw: Gateway) -> Reply:
    items = [
        {"project": s.project, "run": s.run, "host": s.host, "https": s.https}
        for _, s in sorted(gw.state.services.items())
    ]
    return _ok({"services": items})


def _certificates(gw: Gateway) -> Reply:
    items = [{"host": h, "not_after": t} for h, t in sorted(gw.state.certificates.items())]
    return _ok({"certificates": items})


def _stats(gw: Gateway) -> Reply:
    now = gw.clock()
    items = [{"project": p, "run": r, "stats": stats.summary(now)} for (p, r), stats in sorted(gw.stats.items())]
    return _ok({"services": items})


def _put(gw: Gateway, state: model.State, what: str) -> Reply:
    if state != gw.state:
        gw.commit(state)
        log.info("%s", what)
    return _ok()


def _put_certificate(gw: Gateway, host: str, body: object) -> Reply:
    host = model.check_host(host, "certificate host")
    fullchain, key = model.parse_certificate(body)
    not_after, ctx = statefile.store_certificate(gw.state_dir, host, fullchain, key)
    gw.commit(model.put_certificate(gw.state, host, not_after))
    gw.contexts[host] = ctx
    log.info("certificate of %s stored (valid until %s)", host, not_after)
    return _ok({"not_after": not_after})


def _config(gw: Gateway, method: str, _: list[str], body: object) -> Reply:
    s = gw.state
    config = model.parse_config(body)
    return _put(gw, model.State(config, s.services, s.entrypoints, s.challenges, s.certificates), "configured")


def _service(gw: Gateway, method: str, names: list[str], body: object) -> Reply:
    project, run = names
    if method == "DELETE":
        return _put(gw, model.delete_service(gw.state, project, run), f"service {project}/{run} removed")
    svc = model.parse_service(project, run, body)
    return _put(gw, model.put_service(gw.state, svc), f"service {project}/{run} at {svc.host} (https: {svc.https})")


def _entrypoint(gw: Gateway, method: str, names: list[str], body: object) -> Reply:
    if method == "DELETE":
        return _put(gw, model.delete_entrypoint(gw.state, names[0].lower()), f"entrypoint {names[0]} removed")
    ep = model.parse_entrypoint(names[0], body)
    return _put(gw, model.put_entrypoint(gw.state, ep), f"entrypoint {ep.host} of project {ep.project}")


def _challenge(gw: Gateway, method: str, names: list[str], body: object) -> Reply:
    token = model.check_token(names[0])
    if method == "DELETE":
        return _put(gw, model.delete_challenge(gw.state, token), f"challenge {token} withdrawn")
    state = model.put_challenge(gw.state, token, model.parse_challenge(body))
    return _put(gw, state, f"challenge {token} published")


def _certificate(gw: Gateway, method: str, names: list[str], body: object) -> Reply:
    return _put_certificate(gw, names[0], body)


_READS = {"health": _health, "services": _services, "certificates": _certificates, "stats": _stats}
#: (first path segment, how many names follow) -> the methods it takes and its handler
_WRITES = {
    ("config", 0): (("PUT",), _config),
    ("services", 2): (("PUT", "DELETE"), _service),
    ("entrypoints", 1): (("PUT", "DELETE"), _entrypoint),
    ("challenges", 1): (("PUT", "DELETE"), _challenge),
    ("certificates", 1): (("PUT",), _certificate),
}


def _route(gw: Gateway, method: str, parts: list[str], body: object) -> Reply:
    if method == "GET" and len(parts) == 1 and parts[0] in _READS:
        return _READS[parts[0]](gw)
    entry = _WRITES.get((parts[0], len(parts) - 1)) if parts else None
    if entry is not None and method in entry[0]:
        return entry[1](gw, method, parts[1:], body)
    return 404, {"detail": f"no route {method} /api/{'/'.join(parts)}"}


def _authorized(gw: Gateway, head: Head) -> bool:
    given = head.get("authorization") or ""
    return hmac.compare_digest(given.encode(), f"Bearer {gw.token}".encode())


async def _read_body(reader: asyncio.StreamReader, head: Head) -> object:
    length = head.get("content-length")
    if head.get("transfer-encoding") is not None:
        raise HttpError(400, "send the body with Content-Length")
    if not length or length == "0":
        return None
    if not length.isdigit() or int(length) > BODY_LIMIT:
        raise HttpError(400, "the body must have a Content-Length of at most 1 MiB")
    data = await asyncio.wait_for(reader.readexactly(int(length)), HEAD_TIMEOUT)
    try:
        return json.loads(data)
    except ValueError as e:
        raise HttpError(400, f"the body is not JSON: {e}") from None


async def _answer_one(gw: Gateway, reader: asyncio.StreamReader, head: Head) -> tuple[int, object, bool]:
    """(status, JSON answer, whether the request's body was read whole, so the connection can go on)."""
    if not _authorized(gw, head):
        return 401, {"detail": "Authorization: Bearer <the gateway's management token> is required"}, False
    try:
        body = await _read_body(reader, head)
    except HttpError as e:
        return e.status, {"detail": e.message}, False
    path = head.target.split("?", 1)[0]
    if not path.startswith("/api/"):
        return 404, {"detail": f"no route {head.method} {path}"}, True
    try:
        status, value = _route(gw, head.method, [p for p in path[5:].split("/") if p], body)
    except model.BadRequest as e:
        return 400, {"detail": str(e)}, True
    except OSError as e:
        log.error("cannot write the state directory %s: %s", gw.state_dir, e)
        return 500, {"detail": f"the gateway cannot write its state directory: {e}"}, True
    return status, value, True


async def handle_management(gw: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    gw.track()
    try:
        while True:
            try:
                raw = await read_head(reader, HEAD_TIMEOUT)
                if raw is None:
                    return
                head = parse_request(raw)
            except HttpError as e:
                writer.write(_json(e.status, {"detail": e.message}, close=True))
                await writer.drain()
                return
            status, value, whole = await _answer_one(gw, reader, head)
            keep = whole and head.version == "HTTP/1.1" and "close" not in head.tokens("connection")
            writer.write(_json(status, value, close=not keep))
            await writer.drain()
            if not keep:
                return
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        return
    except Exception:  # a bug must not take the gateway down: say it and close this connection
        log.exception("management API")
    finally:
        writer.close()


def _json(status: int, value: object, close: bool) -> bytes:
    return simple_response(status, json.dumps(value).encode(), "application/json", close=close)
