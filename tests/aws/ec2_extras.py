"""What moto's EC2 answers 500 to, played in memory by the fault proxy: placement groups
(Create/Describe/DeletePlacementGroup) and capacity reservations (DescribeCapacityReservations), answered in
EC2's query-protocol XML. A group that an instance not yet terminated was launched into (RunInstances with
``Placement.GroupName``, seen by the proxy) cannot be deleted (``InvalidPlacementGroup.InUse``), as on EC2."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
ACTIONS = ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup", "DescribeCapacityReservations")


@dataclass
class Reservation:
    reservation_id: str
    instance_type: str
    zone: str
    available: int
    state: str = "active"
    #: ``default`` or ``capacity-block`` (EC2 API reference, CapacityReservation ``reservationType``).
    reservation_type: str = "default"


@dataclass
class EC2Extras:
    #: States of instances by id (asks moto; set by the proxy).
    states: Callable[[list[str]], dict[str, str]] = lambda ids: {}
    groups: dict[str, str] = field(default_factory=dict)  # name -> strategy
    group_tags: dict[str, dict[str, str]] = field(default_factory=dict)
    members: dict[str, set[str]] = field(default_factory=dict)  # name -> instance ids launched into it
    deleted: list[str] = field(default_factory=list)
    reservations: dict[str, Reservation] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def launched(self, form: dict[str, list[str]], reply: bytes) -> None:
        """A RunInstances moto made: remember its instances in their placement group."""
        group = (form.get("Placement.GroupName") or [""])[0]
        if group:
            ids = set(re.findall(r"<instanceId>(i-[0-9a-f]+)</instanceId>", reply.decode(errors="replace")))
            with self.lock:
                self.members.setdefault(group, set()).update(ids)

    def handle(self, action: str, form: dict[str, list[str]]) -> tuple[int, bytes]:
        def one(key: str) -> str:
            return (form.get(key) or [""])[0]

        with self.lock:
            if action == "CreatePlacementGroup":
                name = one("GroupName")
                if name in self.groups:
                    return _error("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
                self.groups[name] = one("Strategy") or "cluster"
                self.group_tags[name] = _tags(form)
                return _ok(action, _group_xml(name, self.groups[name], "placementGroup", self.group_tags[name]))
            if action == "DescribePlacementGroups":
                names = [v[0] for k, v in form.items() if k.startswith("GroupName.")] or list(self.groups)
                wanted = _tag_filters(form)
                items = "".join(
                    _group_xml(n, self.groups[n], "item", self.group_tags.get(n, {}))
                    for n in names
                    if n in self.groups and all(self.group_tags.get(n, {}).get(k) in v for k, v in wanted.items())
                )
                return _ok(action, f"<placementGroupSet>{items}</placementGroupSet>")
            if action == "DeletePlacementGroup":
                name = one("GroupName")
                if name not in self.groups:
                    return _error("InvalidPlacementGroup.Unknown", f"The placement group '{name}' is unknown.")
                members = sorted(self.members.get(name, set()))
        if action == "DeletePlacementGroup":
            states = self.states(members) if members else {}
            if any(states.get(i, "terminated") != "terminated" for i in members):
                return _error("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use.")
            with self.lock:
                self.groups.pop(name, None)
                self.group_tags.pop(name, None)
                self.deleted.append(name)
            return _ok(action, "<return>true</return>")
        ids = [v[0] for k, v in form.items() if k.startswith("CapacityReservationId.")]
        with self.lock:
            missing = [i for i in ids if i not in self.reservations]
            if missing:
                return _error(
                    "InvalidCapacityReservationId.NotFound", f"The reservation ID '{missing[0]}' does not exist"
                )
            chosen = [self.reservations[i] for i in ids] if ids else list(self.reservations.values())
            items = "".join(_reservation_xml(r) for r in chosen)
        return _ok(action, f"<capacityReservationSet>{items}</capacityReservationSet>")


def _tags(form: dict[str, list[str]]) -> dict[str, str]:
    """``TagSpecification.1.Tag.N.Key/Value`` of a create call."""
    keys = {k.split(".")[3]: v[0] for k, v in form.items() if re.fullmatch(r"TagSpecification\.1\.Tag\.\d+\.Key", k)}
    return {key: (form.get(f"TagSpecification.1.Tag.{n}.Value") or [""])[0] for n, key in keys.items()}


def _tag_filters(form: dict[str, list[str]]) -> dict[str, list[str]]:
    """``Filter.N.Name=tag:K`` with ``Filter.N.Value.M``: K -> the values asked for."""
    out = {}
    for k, v in form.items():
        m = re.fullmatch(r"Filter\.(\d+)\.Name", k)
        if m and v[0].startswith("tag:"):
            out[v[0][4:]] = [val[0] for kk, val in form.items() if kk.startswith(f"Filter.{m.group(1)}.Value.")]
    return out


def _group_xml(name: str, strategy: str, tag: str, tags: dict[str, str]) -> str:
    tag_set = "".join(f"<item><key>{k}</key><value>{v}</value></item>" for k, v in tags.items())
    return (
        f"<{tag}><groupName>{name}</groupName><state>available</state><strategy>{strategy}</strategy>"
        f"<groupId>pg-{abs(hash(name)) % 10**17:017x}</groupId><tagSet>{tag_set}</tagSet></{tag}>"
    )


def _reservation_xml(r: Reservation) -> str:
    return (
        f"<item><capacityReservationId>{r.reservation_id}</capacityReservationId>"
        f"<instanceType>{r.instance_type}</instanceType><instancePlatform>Linux/UNIX</instancePlatform>"
        f"<availabilityZone>{r.zone}</availabilityZone><tenancy>default</tenancy>"
        f"<totalInstanceCount>{r.available}</totalInstanceCount>"
        f"<availableInstanceCount>{r.available}</availableInstanceCount><state>{r.state}</state>"
        f"<instanceMatchCriteria>targeted</instanceMatchCriteria><reservationType>{r.reservation_type}</reservationType>"
        "</item>"
    )


def _ok(action: str, inner: str) -> tuple[int, bytes]:
    return (
        200,
        f'<{action}Response xmlns="{EC2_XMLNS}"><requestId>ec2-extras</requestId>{inner}</{action}Response>'.encode(),
    )


def _error(code: str, message: str) -> tuple[int, bytes]:
    return 400, (
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        "<RequestID>ec2-extras</RequestID></Response>"
    ).encode()
