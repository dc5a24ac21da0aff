"""Per-project quotas as values: the policy (weight, nominal and max limits), what a job holds, and the
arithmetic over them -- usage, what is borrowed beyond nominal, the weighted dominant share and the
entitlement (Kueue's fair-sharing counts).

A usage is a mapping of dimensions to amounts: ``gpu:<MODEL>`` (GPUs of one model), ``gpu`` (GPUs of any
model), ``cpu``, ``memory`` (GB), ``instances`` and ``price_per_hour``. A limit's ``gpu`` is a count of any
model (``gpu: 8`` is ``{any: 8}``) or a map of models, ``any`` capping the total. A dimension a limit does
not name is not limited. Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: The dimensions of a usage other than the per-model GPU ones, in the order messages list them.
PLAIN_DIMENSIONS = ("gpu", "cpu", "memory", "instances", "price_per_hour")
GPU_MODEL_PREFIX = "gpu:"

Usage = dict[str, float]


@dataclass(frozen=True)
class Limits:
    """Amounts per dimension (see the module docstring); an absent dimension is unlimited."""

    amounts: Mapping[str, float] = field(default_factory=dict)

    def get(self, dim: str) -> float | None:
        return self.amounts.get(dim)

    def is_empty(self) -> bool:
        return not self.amounts


@dataclass(frozen=True)
class QuotaPolicy:
    weight: float = 1.0
    nominal: Limits = field(default_factory=Limits)
    max: Limits = field(default_factory=Limits)
    #: Runs of the project with a priority at most this may be preempted (None: none of its runs).
    preemptible_max_priority: int | None = None
    #: The run types ``preemptible_max_priority`` covers (empty: tasks only; services and dev
    #: environments are preempted only where named here).
    preemptible_run_types: tuple[str, ...] = ()

    def is_default(self) -> bool:
        return (
            self.weight == 1.0
            and self.nominal.is_empty()
            and self.max.is_empty()
            and self.preemptible_max_priority is None
            and not self.preemptible_run_types
        )


def limits_from_doc(doc: Mapping[str, object] | None) -> Limits:
    """Limits from their document form (``{gpu: 8 | {H100: 8, any: 16}, cpu, memory, ...}``)."""
    out: dict[str, float] = {}
    for key, value in (doc or {}).items():
        if value is None:
            continue
        if key == "gpu":
            models = value if isinstance(value, Mapping) else {"any": value}
            for model, count in models.items():
                if count is None:
                    continue
                out["gpu" if str(model).lower() == "any" else GPU_MODEL_PREFIX + str(model).upper()] = float(
                    count  # type: ignore[arg-type]
                )
        else:
            out[key] = float(value)  # type: ignore[arg-type]
    return Limits(out)


def limits_to_doc(limits: Limits) -> dict[str, object]:
    """The document form of ``limits`` (GPUs as a map of models, ``any`` for the total)."""
    doc: dict[str, object] = {}
    gpus: dict[str, float] = {}
    for dim, amount in limits.amounts.items():
        if dim == "gpu":
            gpus["any"] = amount
        elif dim.startswith(GPU_MODEL_PREFIX):
            gpus[dim[len(GPU_MODEL_PREFIX) :]] = amount
        else:
            doc[dim] = amount
    if gpus:
        doc["gpu"] = {k: _num(v) for k, v in sorted(gpus.items(), key=lambda kv: (kv[0] == "any", kv[0]))}
    return {k: _num(v) if isinstance(v, float) else v for k, v in doc.items()}


def _num(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v


def charge(gpus: Iterable[str], cpus: int, memory_mib: int, price: float, blocks: int, total_blocks: int) -> Usage:
    """What a job holds on an instance with these GPUs (model names), CPUs, memory and price when it takes
    ``blocks`` of its ``total_blocks``: its share of each (GPUs charged per model), no instance count."""
    total = max(total_blocks, 1)
    part = min(max(blocks, 1), total) / total
    out: Usage = {}
    models = [g.upper() for g in gpus]
    for model in models:
        out[GPU_MODEL_PREFIX + model] = out.get(GPU_MODEL_PREFIX + model, 0.0) + part
    if models:
        out["gpu"] = len(models) * part
    out["cpu"] = cpus * part
    out["memory"] = memory_mib / 1024 * part
    out["price_per_hour"] = price * part
    return out


def add(a: Mapping[str, float], b: Mapping[str, float]) -> Usage:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


def exceeded(used: Mapping[str, float], extra: Mapping[str, float], limits: Limits) -> str | None:
    """The first dimension of ``limits`` that ``used`` plus ``extra`` would go above, as ``"gpu 8/8"``
    (what is held of what is allowed), or None when it stays within every limit."""
    eps = 1e-9
    for dim in _ordered(limits.amounts):
        cap = limits.amounts[dim]
        if extra.get(dim, 0.0) <= 0:
            continue
        if used.get(dim, 0.0) + extra.get(dim, 0.0) > cap + eps:
            return f"{label(dim)} {_fmt(used.get(dim, 0.0))}/{_fmt(cap)}"
    return None


def label(dim: str) -> str:
    if dim.startswith(GPU_MODEL_PREFIX):
        return f"gpu {dim[len(GPU_MODEL_PREFIX) :]}"
    return dim


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v - round(v)) > 1e-9 else str(round(v))


def _ordered(dims: Iterable[str]) -> list[str]:
    def key(d: str) -> tuple[int, str]:
        if d.startswith(GPU_MODEL_PREFIX):
            return (0, d)
        return (1 + PLAIN_DIMENSIONS.index(d) if d in PLAIN_DIMENSIONS else 99, d)

    return sorted(dims, key=key)


def borrowed(used: Mapping[str, float], nominal: Limits) -> Usage:
    """What ``used`` holds above ``nominal``, per dimension (all of it where nominal names nothing)."""
    return {d: max(0.0, v - (nominal.get(d) or 0.0)) for d, v in used.items() if v > 0}


def weighted_share(used: Mapping[str, float], policy: QuotaPolicy, capacity: Mapping[str, float]) -> float:
    """Kueue's weighted dominant resource share: the largest fraction, over the dimensions the pool has
    capacity in, of that capacity held above nominal, divided by the weight (0 while within nominal). A
    dimension the nominal quota does not name has a nominal of 0; GPUs of one model are counted apart
    only where the nominal names that model (``gpu`` counts them all), and instances only where it names
    them (a job on a block of an instance holds the whole instance in that count: one GPU on each of
    eight hosts would be all of an eight-host pool)."""
    above = borrowed(used, policy.nominal)
    named = policy.nominal.amounts
    share = max(
        (
            above.get(d, 0.0) / c
            for d, c in capacity.items()
            # GPUs of one model, and instances, count only where the nominal quota names them
            if c > 0 and (not d.startswith(GPU_MODEL_PREFIX) or d in named) and (d != "instances" or d in named)
        ),
        default=0.0,
    )
    return share / policy.weight if policy.weight > 0 else share


def entitlement(
    project: str, policies: Mapping[str, QuotaPolicy], capacity: Mapping[str, float], active: Iterable[str]
) -> Usage:
    """What ``project`` is entitled to of the pool's ``capacity``: its nominal quota plus a weighted part
    of what the nominal quotas of the projects sharing the pool leave, shared among the ``active`` ones
    (those holding or waiting for capacity), capped by its max."""
    own = policies.get(project, QuotaPolicy())
    sharing = set(active) | {project}
    weights = sum(policies.get(p, QuotaPolicy()).weight for p in sharing)
    out: Usage = {}
    for dim, cap in capacity.items():
        reserved = sum(policies.get(p, QuotaPolicy()).nominal.get(dim) or 0.0 for p in policies)
        spare = max(0.0, cap - reserved)
        mine = min(cap, (own.nominal.get(dim) or 0.0) + (spare * own.weight / weights if weights > 0 else 0.0))
        limit = own.max.get(dim)
        out[dim] = min(mine, limit) if limit is not None else mine
    return out


def usage_doc(usage: Mapping[str, float]) -> dict[str, object]:
    """A usage in the limits' document form, zeros left out, amounts rounded to 4 places."""
    return limits_to_doc(Limits({d: round(v, 4) for d, v in usage.items() if abs(v) > 1e-9}))
