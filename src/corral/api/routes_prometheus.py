"""``GET /metrics``: the Prometheus endpoint, as dstack's ``routers/prometheus.py``.

Off unless ``Settings.enable_prometheus_metrics`` (``CORRAL_ENABLE_PROMETHEUS_METRICS`` or dstack's
``DSTACK_ENABLE_PROMETHEUS_METRICS``): a 404 then. With ``Settings.prometheus_auth_token`` set, the caller
needs ``Authorization: Bearer <it>`` (compared in constant time), checked first as dstack's dependency is: none
is a 403 "Access denied", another a 403 "Invalid token". The body is the text exposition format
(:mod:`corral.services.prometheus`, imported on the first scrape).
"""

from __future__ import annotations

import hmac
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from corral.api.deps import ctx_of
from corral.api.routing import RouteTable

router = RouteTable()
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _denied(msg: str) -> JSONResponse:
    return JSONResponse({"detail": {"msg": msg, "code": None}}, status_code=403)


@router.get("/metrics", response="PrometheusText", public=True)
async def prometheus_metrics(request: Request) -> Response:
    ctx = ctx_of(request)
    token = ctx.settings.prometheus_auth_token
    if token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            return _denied("Access denied")
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            return _denied("Invalid token")
    if not ctx.settings.enable_prometheus_metrics:
        return JSONResponse({"detail": {"msg": "Not found", "code": None}}, status_code=404)
    from corral.services import prometheus  # on the first scrape: not on the server's start path

    return PlainTextResponse(await prometheus.render_metrics(ctx, time.time()), media_type=CONTENT_TYPE)
