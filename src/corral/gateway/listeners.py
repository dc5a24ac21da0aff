"""The public listeners (:80 and :443): read a request, ask :func:`routing.decide`, then answer it directly or
rate-limit (429), check the token (403) and forward it, counting the hit in the service's stats."""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from .core import ratelimit, routing
from .core.model import Config
from .forward import COUNTED_HEADER, Exchange, UpstreamError, check_token, forward
from .httpio import Head, HttpError, parse_request, read_head, request_framing, simple_response
from .live import Gateway

log = logging.getLogger("corral.gateway")
FIRST_HEAD_TIMEOUT = 60.0
KEEPALIVE_TIMEOUT = 75.0  # nginx's keepalive_timeout default (nginx.org docs, ngx_http_core_module)


def _peer_ip(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if peer else ""


async def handle_client(gw: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, https: bool) -> None:
    gw.track()
    client_ip = _peer_ip(writer)
    timeout = FIRST_HEAD_TIMEOUT
    try:
        while True:
            try:
                raw = await read_head(reader, timeout)
                if raw is None:
                    return
                head = parse_request(raw)
            except HttpError as e:
                writer.write(simple_response(e.status, f"{e.message}\n".encode(), close=True))
                await writer.drain()
                return
            if not await _serve_one(gw, head, reader, writer, https, client_ip):
                return
            timeout = KEEPALIVE_TIMEOUT
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError):
        return
    except Exception:  # a bug must not take the gateway down: say it and close this connection
        log.exception("a request from %s", client_ip)
    finally:
        writer.close()


def _keepalive(head: Head) -> bool:
    return head.version == "HTTP/1.1" and "close" not in head.tokens("connection")


async def _answer(writer: asyncio.StreamWriter, answer: routing.Answer, keep: bool) -> bool:
    extra = [("Location", answer.location)] if answer.location else []
    writer.write(simple_response(answer.status, answer.body, answer.content_type, extra, close=not keep))
    await writer.drain()
    return keep


async def _serve_one(
    gw: Gateway, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, https: bool, client_ip: str
) -> bool:
    """Answer one request; returns whether the connection may carry another."""
    started = gw.clock()
    try:
        body = request_framing(head)
    except HttpError as e:
        return await _answer(writer, routing.Answer(e.status, f"{e.message}\n".encode()), False)
    keep = _keepalive(head) and body.kind == "none"  # an unread body: close after answering directly
    host = routing.host_of(head.get("host"))
    decision = routing.decide(gw.table, gw.state.challenges, https, host, head.target)
    if isinstance(decision, routing.Answer):
        return await _answer(writer, decision, keep)
    config = gw.state.config
    if config is None:
        return await _answer(writer, routing.Answer(503, b"The gateway is not configured yet\n"), keep)
    limit = decision.client_max_body_size
    if limit and body.kind == "length" and body.length > limit:
        return await _answer(writer, _too_large(), False)
    if not _within_rate(gw, decision, head, client_ip, started):
        return await _answer(writer, routing.Answer(429, b"Too Many Requests\n"), keep)
    if decision.auth:
        refusal = await _check_auth(gw, config, decision.project, head.get("authorization"), started)
        if refusal is not None:
            return await _answer(writer, refusal, keep)
    if "100-continue" in head.tokens("expect"):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    websocket = "upgrade" in head.tokens("connection") and head.get("upgrade") is not None
    exchange = Exchange(head, decision.target, client_ip, body, limit, float(decision.read_timeout), websocket)
    stats = gw.stats_of(decision.service)
    answers: list[Head] = []  # the server's answer: one it counted itself is not counted again
    try:
        return await forward(config, exchange, reader, writer, _keepalive(head), gw.upstream, answers.append)
    except UpstreamError as e:
        log.warning("%s %s%s: %s", head.method, host, head.target.split("?", 1)[0], e)
        return await _answer(writer, routing.Answer(e.status, f"{e}\n".encode()), False)
    except HttpError as e:  # a chunked body past client_max_body_size, or malformed
        return await _answer(writer, _too_large() if e.status == 413 else routing.Answer(e.status, b""), False)
    finally:
        if stats is not None and not (answers and answers[0].get(COUNTED_HEADER.lower()) is not None):
            stats.record(gw.clock(), gw.clock() - started)


def _too_large() -> routing.Answer:
    return routing.Answer(413, b"Request body larger than the service's client_max_body_size\n")


def _within_rate(gw: Gateway, decision: routing.Forward, head: Head, client_ip: str, now: float) -> bool:
    limit = ratelimit.pick(decision.rate_limits, head.target.split("?", 1)[0])
    if limit is None or decision.service is None:
        return True
    key = client_ip if limit.header is None else (head.get(limit.header.lower()) or "")
    if not key:
        return True
    rule = ratelimit.rule_of(limit)
    return gw.buckets.allow((*decision.service, limit.prefix, key), rule, int(now * 1000))


async def _check_auth(
    gw: Gateway, config: Config, project: str, authorization: Optional[str], now: float
) -> Optional[routing.Answer]:
    """None when allowed, else the answer: 403 as dstack words it, or 502 when the server cannot be asked."""
    denied = routing.Answer(403, f"Unauthenticated or unauthorized to access project {project}\n".encode())
    if not authorization:
        return denied
    allowed = gw.auth.get(project, authorization, now)
    if allowed is None:
        key = (project, authorization)
        check = gw.auth_checks.get(key)
        if check is None:  # one question to the server, however many requests with this token wait for it
            check = asyncio.ensure_future(check_token(config, project, authorization))
            gw.auth_checks[key] = check
            check.add_done_callback(lambda _: gw.auth_checks.pop(key, None))
        try:
            allowed = await asyncio.shield(check)
        except UpstreamError as e:
            log.warning("token check for project %s: %s", project, e)
            return routing.Answer(e.status, f"{e}\n".encode())
        gw.auth.put(project, authorization, allowed, now)
    return None if allowed else denied
