"""A job's scheduling facts: what the scheduler needs of a queued job, derived once when the job is written
(``config.job_facts.derive``, at apply) and stored beside it (``jobs.scheduling_facts``) as a small versioned
JSON document, so that a scheduling pass reads a job without parsing its run's configuration.

The options are kept as the run gave them (``backends`` in dstack's names, ``spot_policy`` as a word): the
scheduler turns them into its offer filter (``scheduler.offer_filters.from_options``). A document of a version
this code does not know reads as None, and its job's facts are derived again from its stored specs.

Pure: the standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from corral.domain.resources import GpuSpec, Range, Requirements
from corral.domain.selectors import FleetRef, Selector

#: The version of the stored document this code writes and reads.
VERSION = 1
#: How a stored document of this version starts (``encode`` writes ``v`` first, compactly): the store reads a
#: job's specs only where its document does not.
PREFIX = f'{{"v":{VERSION},'


@dataclass(frozen=True)
class WaitRule:
    """How long a job may wait for capacity, from its ``retry`` (docs/dev/architecture.md, queue semantics)."""

    #: False: it fails at once when nothing fits.
    waits: bool = True
    #: How long after its submission (None: no bound of its own).
    seconds: float | None = None
    #: Whether the server's bound (``CORRAL_MAX_QUEUE_WAIT``) applies (a run that sets no ``retry``).
    server_bound: bool = False

    def deadline(self, submitted_at: float, server_max: float | None) -> float | None:
        """The time the job waits until (None: unbounded)."""
        if self.seconds is not None:
            return submitted_at + self.seconds
        if self.server_bound and server_max is not None:
            return submitted_at + server_max
        return None


@dataclass(frozen=True)
class JobFacts:
    """The scheduling facts of one job (its run's options and its own resources)."""

    requirements: Requirements
    #: The run's ``fleets`` (None: any fleet of its project, or imported).
    fleet_names: tuple[str, ...] | None
    creation_policy: str
    wait: WaitRule
    #: Jobs per replica (a multi-node task's nodes).
    nodes: int
    #: The run's ``instances`` selectors (None: no restriction).
    selectors: tuple[Selector, ...] | None
    #: The offer options, as the run gives them.
    backends: tuple[str, ...] | None
    regions: tuple[str, ...] | None
    instance_types: tuple[str, ...] | None
    max_price: float | None
    spot_policy: str | None
    reservation: str | None
    #: The network volumes the run mounts: per mount point, its alternatives by name (placement follows them).
    volumes: tuple[tuple[str, ...], ...]
    #: Whether the run names an image of its own (a host-process job otherwise, unless the server has one).
    has_image: bool
    #: The run's type (``task``, ``service``, ``dev-environment``).
    run_type: str


def _range(r: Range[Any] | None) -> list[Any] | None:
    return None if r is None else [r.min, r.max]


def _int_range(v: list[Any]) -> Range[int]:
    return Range(v[0], v[1])


def _float_range(v: list[Any] | None) -> Range[float] | None:
    return None if v is None else Range(v[0], v[1])


def _gpu_json(g: GpuSpec | None) -> dict[str, Any] | None:
    if g is None:
        return None
    return {
        "vendor": g.vendor,
        "names": None if g.names is None else list(g.names),
        "count": _range(g.count),
        "memory": _range(g.memory),
        "total_memory": _range(g.total_memory),
        "cc": None if g.compute_capability is None else list(g.compute_capability),
    }


def _gpu(d: dict[str, Any] | None) -> GpuSpec | None:
    if d is None:
        return None
    cc = d["cc"]
    return GpuSpec(
        vendor=d["vendor"],
        names=None if d["names"] is None else tuple(d["names"]),
        count=_int_range(d["count"]),
        memory=_float_range(d["memory"]),
        total_memory=_float_range(d["total_memory"]),
        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
    )


def requirements_json(r: Requirements) -> dict[str, Any]:
    return {
        "arch": r.cpu_arch,
        "cpu": _range(r.cpu_count),
        "memory": _range(r.memory),
        "disk": _range(r.disk),
        "shm": r.shm_size,
        "gpu": _gpu_json(r.gpu),
    }


def requirements_from_json(d: dict[str, Any]) -> Requirements:
    return Requirements(
        cpu_arch=d["arch"],
        cpu_count=_int_range(d["cpu"]),
        memory=Range(d["memory"][0], d["memory"][1]),
        disk=_float_range(d["disk"]),
        shm_size=d["shm"],
        gpu=_gpu(d["gpu"]),
    )


def _selector_json(s: Selector) -> list[Any]:
    if s.name is not None:
        return ["name", s.name]
    if s.hostname is not None:
        return ["hostname", s.hostname]
    assert s.fleet is not None
    return ["fleet", s.fleet.name, s.fleet.project, s.instance_num]


def _selector(v: list[Any]) -> Selector:
    if v[0] == "name":
        return Selector(name=v[1])
    if v[0] == "hostname":
        return Selector(hostname=v[1])
    return Selector(fleet=FleetRef(v[1], v[2]), instance_num=v[3])


def _names(v: tuple[str, ...] | None) -> list[str] | None:
    return None if v is None else list(v)


def _tuple(v: list[str] | None) -> tuple[str, ...] | None:
    return None if v is None else tuple(v)


def encode(f: JobFacts) -> str:
    """The stored document: compact JSON with its version."""
    doc = {
        "v": VERSION,
        "req": requirements_json(f.requirements),
        "fleets": _names(f.fleet_names),
        "creation": f.creation_policy,
        "wait": [f.wait.waits, f.wait.seconds, f.wait.server_bound],
        "nodes": f.nodes,
        "sel": None if f.selectors is None else [_selector_json(s) for s in f.selectors],
        "backends": _names(f.backends),
        "regions": _names(f.regions),
        "types": _names(f.instance_types),
        "price": f.max_price,
        "spot": f.spot_policy,
        "resv": f.reservation,
        "vols": [names[0] if len(names) == 1 else list(names) for names in f.volumes],
        "image": f.has_image,
        "type": f.run_type,
    }
    return json.dumps(doc, separators=(",", ":"))


def decode(text: str | None) -> JobFacts | None:
    """The facts of a stored document; None for none, or for a version this code does not know (the caller
    derives them again from the job's specs). Raises ``ValueError``/``KeyError`` for a damaged one."""
    if text is None:
        return None
    d = json.loads(text)
    if not isinstance(d, dict) or d.get("v") != VERSION:
        return None
    waits, seconds, server_bound = d["wait"]
    sel = d["sel"]
    return JobFacts(
        requirements=requirements_from_json(d["req"]),
        fleet_names=_tuple(d["fleets"]),
        creation_policy=d["creation"],
        wait=WaitRule(bool(waits), None if seconds is None else float(seconds), bool(server_bound)),
        nodes=int(d["nodes"]),
        selectors=None if sel is None else tuple(_selector(s) for s in sel),
        backends=_tuple(d["backends"]),
        regions=_tuple(d["regions"]),
        instance_types=_tuple(d["types"]),
        max_price=d["price"],
        spot_policy=d["spot"],
        reservation=d["resv"],
        volumes=tuple((v,) if isinstance(v, str) else tuple(v) for v in d["vols"]),
        has_image=bool(d["image"]),
        run_type=d["type"],
    )
