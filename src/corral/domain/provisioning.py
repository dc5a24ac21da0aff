"""Why an instance could not be provisioned, as a kind the user is shown: no capacity (the cloud had no room;
``retry`` on ``no-capacity`` waits for it), or a reason that waiting does not change -- a quota, no image, the
network's configuration, credentials or permissions, a refused launch. A job that failed to start carries the
kind's words in its ``status_message`` (what ``ps`` shows) and the cloud's own reason in its
``termination_reason_message``.

Pure values.
"""

from __future__ import annotations

from typing import Literal

FailureKind = Literal["no_capacity", "quota", "image", "network", "credentials", "refused"]

#: What ``ps`` shows of a job whose instance failed for that kind (dstack's words for no capacity).
STATUS_WORDS: dict[FailureKind, str] = {
    "no_capacity": "no capacity",
    "quota": "quota reached",
    "image": "no image",
    "network": "network misconfigured",
    "credentials": "credentials refused",
    "refused": "launch refused",
}
