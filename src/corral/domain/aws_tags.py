"""The tags corral puts on what it creates in EC2 (instances, volumes, placement and security groups): its own
keys, AWS's limits on tags, and how an admin's and a fleet's tags join corral's within them.

Pure: nothing of corral, no I/O. The aws backend writes these tags; ``config`` (a backend's ``tags``) and the
fleet service (a fleet's ``tags``) check them against the limits before anything is launched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# AWS's tag restrictions (EC2 User Guide, "Tag your Amazon EC2 resources", Tag restrictions):
#: at most 50 tags per resource,
TAGS_PER_RESOURCE = 50
#: keys of 1 to 128 characters, values of at most 256,
KEY_LIMIT = 128
VALUE_LIMIT = 256
#: and the ``aws:`` prefix (in any case) is reserved for AWS.
RESERVED_PREFIX = "aws:"

#: The keys corral writes on an instance (and reads back: adoption, the reaper). ``Name`` is EC2's display name.
NAME = "Name"
OWNER = ("owner", "corral")
TAG_SERVER = "corral_server"
TAG_PROJECT = "corral_project"
TAG_FLEET = "corral_fleet"
TAG_INSTANCE = "corral_instance"
#: On every instance of a gang (a multi-node run's new instances, launched together): its lead row's id.
TAG_GANG = "corral_gang"
#: On every instance of a gang in a cluster placement group: the group's name.
TAG_PLACEMENT = "corral_placement_group"
#: On a gateway's VM: the gateway's id (its ``corral_instance`` holds the same id, which the reaper reads).
TAG_GATEWAY = "corral_gateway"
#: Every key corral may write on one resource: a gang member in a placement group has them all (volumes,
#: placement and security groups have fewer).
CORRAL_KEYS = (NAME, OWNER[0], TAG_SERVER, TAG_PROJECT, TAG_FLEET, TAG_INSTANCE, TAG_GANG, TAG_PLACEMENT)
#: How many tags of its own an admin and a fleet may add together: what AWS's limit leaves beside corral's.
USER_TAG_LIMIT = TAGS_PER_RESOURCE - len(CORRAL_KEYS)

#: Characters AWS allows in tags across its services: letters, digits, spaces and ``+ - = . _ : / @``.
_ALLOWED = re.compile(r"^[\w\s+\-=.:/@]*$")


def problem(tags: Mapping[str, str], field: str) -> str | None:
    """Why ``tags`` (the ``field`` of a configuration) cannot go on EC2 resources beside corral's own; None
    when they can."""
    own = [k for k in tags if k in CORRAL_KEYS]
    if own:
        return f"{field}: {', '.join(own)} is corral's own tag: use another key"
    if len(tags) > USER_TAG_LIMIT:
        return (
            f"{field}: {len(tags)} tags, at most {USER_TAG_LIMIT}: AWS allows {TAGS_PER_RESOURCE} per resource "
            f"and corral writes {len(CORRAL_KEYS)} of its own"
        )
    for key, value in tags.items():
        if not 1 <= len(key) <= KEY_LIMIT or len(value) > VALUE_LIMIT:
            return f"{field}: tag {key!r}: keys are 1-{KEY_LIMIT} characters, values at most {VALUE_LIMIT}"
        if key.lower().startswith(RESERVED_PREFIX) or value.lower().startswith(RESERVED_PREFIX):
            return f"{field}: tag {key!r}: the {RESERVED_PREFIX} prefix is reserved for AWS"
        if not _ALLOWED.match(key) or not _ALLOWED.match(value):
            return f"{field}: tag {key!r}: use letters, digits, spaces and + - = . _ : / @ only"
    return None


def joined(admin: Mapping[str, str] | None, fleet: Mapping[str, str] | None) -> dict[str, str]:
    """The tags a fleet's resources get besides corral's: the backend's (the admin's), then the fleet's, which
    win where both name a key (as in dstack)."""
    return {**(admin or {}), **(fleet or {})}


def name_tag(project: str, name: str) -> str:
    """The ``Name`` of an instance: ``corral-<project>-<instance name>``, cut to AWS's 256 characters."""
    return f"corral-{project}-{name}"[:VALUE_LIMIT]
