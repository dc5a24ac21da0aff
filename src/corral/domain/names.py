"""dstack 0.22.5's name rules, with its messages: resources (runs, fleets, volumes, gateways, exports),
usernames and project names.

dstack checks them with ``re.match(pattern, name)``, whose ``$`` also matches before a final newline;
here the whole string must match (``fullmatch``), so that ``"name\\n"`` is refused too. Pure: imports
nothing of corral.
"""

from __future__ import annotations

import random
import re

RESOURCE_NAME = "^[a-z][a-z0-9-]{1,40}$"
USERNAME = "^[a-zA-Z0-9-_]{1,60}$"
PROJECT_NAME = "^[a-zA-Z0-9-_]{1,50}$"

_RESOURCE = re.compile(RESOURCE_NAME[1:-1])
_USERNAME = re.compile(USERNAME[1:-1])
_PROJECT = re.compile(PROJECT_NAME[1:-1])


#: The words of generated names (``adjective-animal``), each of which follows the resource name rule.
ADJECTIVES = (
    "brave",
    "calm",
    "eager",
    "fancy",
    "gentle",
    "happy",
    "jolly",
    "kind",
    "lively",
    "nice",
    "proud",
    "quiet",
    "shy",
    "silly",
    "witty",
    "zealous",
    "bold",
    "bright",
    "clever",
    "cool",
    "swift",
    "wise",
    "keen",
    "lucky",
)
NOUNS = (
    "swan",
    "turkey",
    "otter",
    "panda",
    "lynx",
    "heron",
    "moose",
    "yak",
    "gecko",
    "koala",
    "bison",
    "crane",
    "falcon",
    "badger",
    "beaver",
    "camel",
    "dingo",
    "eagle",
    "ferret",
    "gopher",
    "hare",
    "ibis",
    "jackal",
    "lemur",
)


def random_words() -> str:
    """``adjective-animal``: the start of a generated fleet, volume or run name."""
    return f"{random.choice(ADJECTIVES)}-{random.choice(NOUNS)}"


def _ok(pattern: re.Pattern[str], name: object) -> bool:
    return isinstance(name, str) and pattern.fullmatch(name) is not None


def resource_name_error(name: object) -> str | None:
    """dstack's message when ``name`` is not a valid run, fleet, volume, gateway or export name."""
    return None if _ok(_RESOURCE, name) else f"Resource name should match regex '{RESOURCE_NAME}'"


def username_error(name: object) -> str | None:
    return None if _ok(_USERNAME, name) else f"Username should match regex '{USERNAME}'"


def project_name_error(name: object) -> str | None:
    return None if _ok(_PROJECT, name) else f"Project name should match regex '{PROJECT_NAME}'"
