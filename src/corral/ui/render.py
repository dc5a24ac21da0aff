"""The UI's HTML: the Jinja2 environment (autoescaped, templates from the package), its filters (times
shown relative and absolute, sizes), and the security headers every UI response carries."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse

HERE = Path(__file__).parent

#: The UI's Content-Security-Policy: scripts, styles and connections from this origin only, no inline
#: script or style, no framing, forms posted only here.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def _epoch(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def absolute(value: Any) -> str:
    ts = _epoch(value)
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: Any) -> str:
    ts = _epoch(value)
    return "" if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def relative(value: Any, now: float | None = None) -> str:
    ts = _epoch(value)
    if ts is None:
        return "—"
    delta = (time.time() if now is None else now) - ts
    ahead = delta < 0
    d = abs(delta)
    if d < 45:
        words = "just now" if not ahead else "in a few seconds"
        return words
    for size, unit in ((86400 * 365, "year"), (86400 * 30, "month"), (86400, "day"), (3600, "hour"), (60, "min")):
        if d >= size:
            n = int(d // size)
            text = f"{n} {unit}{'s' if n != 1 and unit != 'min' else ''}"
            return f"in {text}" if ahead else f"{text} ago"
    return "just now"


def mib(value: Any) -> str:
    if value is None:
        return "—"
    v = float(value)
    return f"{v / 1024:.0f} GB" if v >= 1024 else f"{v:.0f} MB"


def dollars(value: Any) -> str:
    """``$0.1234`` (trailing zeros dropped; ``$0`` for nothing spent), as ``dstack ps`` writes prices."""
    amount = float(value or 0.0)
    return f"${amount:.4f}".rstrip("0").rstrip(".")


def time_html(value: Any) -> Markup:
    """A time as the pages show it: relative, with the absolute UTC time beside it and in its tooltip."""
    if not value:
        return Markup("—")
    when, stamp, ago = escape(absolute(value)), escape(iso(value)), escape(relative(value))
    return Markup(f'<time datetime="{stamp}" title="{when}">{ago}</time> <span class="abs">{when}</span>')


def status_html(value: Any, message: Any = None, live: Any = None) -> Markup:
    """A status badge, and its message beside it when it says more (both updated live when ``live``)."""
    v = escape(value)
    attr = Markup(f' data-live-status="{escape(live)}"') if live else Markup("")
    out = Markup(f'<span class="status s-{v}"{attr}>{v}</span>')
    text = message if message and message != value else ""
    if live or text:
        mattr = Markup(f' data-live-message="{escape(live)}"') if live else Markup("")
        out += Markup(f' <span class="msg"{mattr}>{escape(text)}</span>')
    return out


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters["ago"] = relative
    env.filters["when"] = absolute
    env.filters["iso"] = iso
    env.filters["mib"] = mib
    env.globals["time"] = time_html
    env.globals["status"] = status_html
    env.globals["dollars"] = dollars
    return env


def page(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
    """A whole page: ``values`` plus who is looking (``me``), their CSRF token and the current path."""
    session = request.scope.get("corral.ui_session")
    values.setdefault("me", session.user if session else None)
    values.setdefault("csrf", session.csrf if session else "")
    values.setdefault("path", request.url.path)
    html = environment().get_template(template).render(**values)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
