"""Who is looking at the UI: the session cookie (HttpOnly, ``SameSite=Strict``) resolved to its user,
login with a user token and logout, and the checks every state-changing form passes (the request's
``Origin`` is this server's, and its CSRF token is the session's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from corral.api.deps import ctx_of
from corral.domain.records import UserRec
from corral.services import ui_sessions
from corral.services.errors import Forbidden
from corral.ui.render import page

COOKIE = ui_sessions.COOKIE


@dataclass(frozen=True)
class Session:
    id: str
    user: UserRec
    csrf: str


class LoginRequired(Exception):
    """No valid session: a page redirects to the login form, anything else answers 401."""


class BadForm(Exception):
    """A state-changing request without this server's ``Origin`` or without the session's CSRF token."""


async def session_of(request: Request) -> Session | None:
    sid = request.cookies.get(COOKIE, "")
    if not sid:
        return None
    user = await ui_sessions.resolve(ctx_of(request).db, sid)
    if user is None:
        return None
    s = Session(sid, user, ui_sessions.csrf_token(sid))
    request.scope["corral.ui_session"] = s
    return s


async def require(request: Request) -> Session:
    s = await session_of(request)
    if s is None:
        raise LoginRequired
    return s


def same_origin(request: Request) -> bool:
    """The request comes from a page of this server: its ``Origin`` (else its ``Referer``) names the host
    and port the request was sent to (``Host``; a proxy in front must pass it on), over HTTP or HTTPS."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        origin = request.headers.get("referer") or ""
    parts = urlsplit(origin)
    host = request.headers.get("host", "")
    return bool(host) and parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


FORM_LIMIT = 64 * 1024


async def form_of(request: Request, session: Session | None) -> dict[str, list[str]]:
    """The posted form (urlencoded, at most ``FORM_LIMIT`` bytes, read no further), after the ``Origin``
    check and, with a session, the CSRF check."""
    if not same_origin(request):
        raise BadForm("This form did not come from a page of this server (Origin). Reload the page and try again.")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > FORM_LIMIT:
        raise BadForm("The form is too large.")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > FORM_LIMIT:
            raise BadForm("The form is too large.")
    try:
        form = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=1000)
    except ValueError:
        raise BadForm("The form has too many fields.") from None
    if session is not None and not ui_sessions.csrf_ok(session.id, (form.get("csrf") or [""])[0]):
        raise BadForm("The form's CSRF token is missing or stale. Reload the page and try again.")
    return form


def login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


_SAFE_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9/_.~%?=&+-]*")


def _safe_next(value: str) -> str:
    """Only a path of this server (never ``//host``, a URL, or anything a browser could read as one) is
    followed after login."""
    return value if _SAFE_PATH.fullmatch(value) else "/runs"


async def login_form(request: Request) -> Response:
    if await session_of(request) is not None:
        return RedirectResponse(_safe_next(request.query_params.get("next", "/runs")), status_code=303)
    return page(request, "login.html", next=_safe_next(request.query_params.get("next", "/runs")), error=None)


async def login(request: Request) -> Response:
    form = await form_of(request, None)
    token = (form.get("token") or [""])[0]
    nxt = _safe_next((form.get("next") or ["/runs"])[0])
    try:
        sid, _user = await ui_sessions.login(ctx_of(request).db, token)
    except Forbidden:
        return page(request, "login.html", status=401, next=nxt, error="Invalid token: no active user has it.")
    response = RedirectResponse(nxt, status_code=303)
    response.set_cookie(
        COOKIE,
        sid,
        max_age=int(ui_sessions.SESSION_TTL_S),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(request: Request) -> Response:
    s = await session_of(request)
    await form_of(request, s)
    if s is not None:
        await ui_sessions.logout(ctx_of(request).db, s.id)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
