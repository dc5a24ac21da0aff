"""The web UI's sessions: a login with a user's token opens one (a random id for the cookie, stored hashed),
a page request resolves it to its user, logout ends it; refreshing the user's token ends all of the user's
sessions (a session is bound to the token hash it was opened with, :mod:`corral.store.ui_sessions`)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from corral.domain.records import UserRec
from corral.services.errors import Forbidden
from corral.store import accounts as accounts_store
from corral.store import ui_sessions as store
from corral.store.db import Database

#: How long a session lasts without a new login.
SESSION_TTL_S = 12 * 3600.0
#: The session cookie's name (HttpOnly, ``SameSite=Strict``).
COOKIE = "corral_session"


async def login(db: Database, token: str, now: float | None = None) -> tuple[str, UserRec]:
    """A new session for the user whose token this is: (the session id for the cookie, the user).
    Forbidden("Invalid token") for a token of no active user."""
    token = token.strip()
    if not token:
        raise Forbidden("Invalid token")
    now = time.time() if now is None else now
    session_id = secrets.token_urlsafe(32)
    async with db.write() as conn:
        user = await accounts_store.get_user_by_token(conn, token)
        if user is None or not user.active:
            raise Forbidden("Invalid token")
        await store.create(conn, session_id, user, accounts_store.token_hash(token), now, SESSION_TTL_S)
    return session_id, user


async def resolve(db: Database, session_id: str, now: float | None = None) -> UserRec | None:
    """The session's user, or None (no such session, expired, or the user's token was refreshed)."""
    if not session_id or len(session_id) > 100:
        return None
    async with db.read() as conn:
        return await store.resolve(conn, session_id, time.time() if now is None else now)


async def logout(db: Database, session_id: str) -> None:
    if session_id and len(session_id) <= 100:
        async with db.write() as conn:
            await store.delete(conn, session_id)


def csrf_token(session_id: str) -> str:
    """The session's CSRF token: derived from the session id (which only the cookie holds), so it needs no
    storage and cannot be computed by a page that cannot read the cookie."""
    return hmac.new(session_id.encode(), b"corral-ui-csrf", hashlib.sha256).hexdigest()


def csrf_ok(session_id: str, given: str) -> bool:
    return bool(given) and hmac.compare_digest(csrf_token(session_id), given)
