"""dstack's built-in ``rest_plugin``: for each apply, a ``POST`` to the policy service with the user, the project
and the spec; the answer is the spec to apply, or an error that refuses the apply.

The wire shape is dstack 0.22.5's (``dstack/plugins/builtin/rest_plugin/_models.py`` and ``_plugin.py``):

* ``POST {DSTACK_PLUGIN_SERVICE_URI}/apply_policies/on_{run,fleet,volume,gateway}_apply`` with
  ``{"user": <user name>, "project": <project name>, "spec": <the RunSpec, FleetSpec, VolumeSpec or
  GatewaySpec as JSON>}`` (``SpecApplyRequest``);
* the answer ``{"spec": <the spec to apply>, "error": <null, or a non-empty message that refuses>}``
  (``SpecApplyResponse``; ``spec`` is required, also with an error).

dstack refuses the apply (a 400) when the service cannot be reached, answers an HTTP error or an invalid
body: the policy fails closed, and so does this one. Each message names the policy and where it answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    import httpx

#: What a policy is asked about, as the endpoint names it (``on_<kind>_apply``).
SpecKind = Literal["run", "fleet", "volume", "gateway"]

#: A spec as JSON: the policy service's to read and rewrite; the services parse what comes back.
SpecDocument = Mapping[str, object]


class PolicyError(Exception):
    """An apply a policy refused, or that could not be put to it: a 400 whose message names the policy."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


class _SpecApplyRequest(BaseModel):
    model_config = ConfigDict(defer_build=True)

    user: str
    project: str
    spec: dict[str, object]


class _SpecApplyResponse(BaseModel):
    # the spec is dstack's whole model, with fields a newer client adds: kept as sent, parsed by the services
    model_config = ConfigDict(extra="ignore", defer_build=True)

    spec: dict[str, object]
    error: Optional[str] = Field(default=None, min_length=1)


@dataclass(frozen=True)
class RestPolicy:
    """One policy service: ``config.yml``'s ``plugins: [rest_plugin]`` with the URL it answers at."""

    #: The plugin's name in ``config.yml`` (``rest_plugin``), which every message names.
    name: str
    uri: str
    timeout: float

    @property
    def who(self) -> str:
        return f"policy {self.name} ({self.uri})"

    async def on_apply(self, kind: SpecKind, user: str, project: str, spec: SpecDocument) -> dict[str, object]:
        """The spec to apply: ``spec`` as the service answers it (as sent, or changed); :class:`PolicyError`
        when it refuses, cannot be reached in time, or answers something that is not dstack's response."""
        endpoint = f"/apply_policies/on_{kind}_apply"
        body = _SpecApplyRequest(user=user, project=project, spec=dict(spec)).model_dump(mode="json")
        try:
            answer = await asyncio.wait_for(self._post(endpoint, body), self.timeout)
        except asyncio.TimeoutError:
            raise PolicyError(self._down(f"no answer within {self.timeout:g} s")) from None
        try:
            parsed = _SpecApplyResponse.model_validate_json(answer)
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "the body"
            raise PolicyError(
                f"The {self.who} returned an invalid response to {endpoint}: {where}: {first['msg']} "
                '(it must answer {"spec": ..., "error": null or a message}, as dstack\'s rest_plugin expects)'
            ) from None
        if parsed.error is not None:
            raise PolicyError(f"Apply request rejected by the {self.who}: {parsed.error}")
        return parsed.spec

    async def _post(self, endpoint: str, body: dict[str, object]) -> bytes:
        import httpx  # on the first apply that a policy sees, not at start-up

        headers = {"accept": "application/json", "Content-Type": "application/json"}
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                r = await client.post(self.uri + endpoint, json=body, headers=headers)
        except httpx.TimeoutException:
            raise PolicyError(self._down(f"no answer within {self.timeout:g} s")) from None
        except httpx.HTTPError as e:
            raise PolicyError(self._down(_reason(e))) from None
        if r.status_code >= 400:
            raise PolicyError(
                f"The {self.who} answered HTTP {r.status_code} to {endpoint}: {_excerpt(r)}; "
                "the apply is refused until it answers"
            )
        return r.content

    def _down(self, reason: str) -> str:
        return (
            f"Could not reach the {self.who}: {reason}. Applies are refused while it is down (policies fail "
            f"closed): start it, or remove `{self.name}` from `plugins` in the server's config.yml"
        )


def _reason(e: httpx.HTTPError) -> str:
    return str(e) or type(e).__name__


def _excerpt(r: httpx.Response) -> str:
    text = r.text.strip().replace("\n", " ")
    return (text[:200] + "...") if len(text) > 200 else (text or "(no body)")


async def apply_all(
    policies: tuple[RestPolicy, ...], kind: SpecKind, user: str, project: str, spec: SpecDocument
) -> dict[str, object]:
    """``spec`` through every policy in turn (each gets the previous one's answer), as dstack chains them."""
    out = dict(spec)
    for policy in policies:
        out = await policy.on_apply(kind, user, project, out)
    return out
