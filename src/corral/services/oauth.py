"""dstack's OAuth2 helpers that work without a provider: the state parameter's next redirect.

dstack's server puts ``base64(json({"value", "local_port"}))`` in the OAuth2 ``state``; after the
provider's redirect, the UI asks ``auth/get_next_redirect`` whether to send the browser on to the CLI's
local callback (``http://localhost:{local_port}/auth/callback?code=…&state=…``). corral registers no
providers, but answers this helper as dstack does. Imports: the standard library and ``services.errors``.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse

from corral.services.errors import ServiceError


def _local_port(state: str) -> int | None:
    """The state's ``local_port`` (None: none); ServiceError if the state is not one of dstack's."""
    try:
        decoded = json.loads(base64.b64decode(state, validate=True).decode())
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ServiceError("Invalid state token") from None
    if (
        not isinstance(decoded, dict)
        or not isinstance(decoded.get("value"), str)
        or set(decoded)
        - {
            "value",
            "local_port",
        }
    ):
        raise ServiceError("Invalid state token")
    port = decoded.get("local_port")
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServiceError("Invalid state token")
    return port


def next_redirect_url(code: str, state: str) -> str | None:
    """dstack's ``get_next_redirect_url``: the CLI's local callback, or None when the state has no port."""
    port = _local_port(state)
    if port is None:
        return None
    query = urllib.parse.urlencode({"code": code, "state": state})
    return f"http://localhost:{port}/auth/callback?{query}"
