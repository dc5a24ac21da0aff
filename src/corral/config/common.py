"""Building blocks shared by the configuration models: the strict base model, durations, memory,
env, tags, entity references, cron expressions, and the backend names dstack knows.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, PlainValidator

from corral.domain.durations import parse_duration, parse_idle_duration, parse_off_duration
from corral.domain.resources import parse_memory


class CoreModel(BaseModel):
    """Strict like dstack: unknown keys are errors; YAML numbers are accepted where text is expected."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, defer_build=True)


class BackendType(str, Enum):
    AMDDEVCLOUD = "amddevcloud"
    AWS = "aws"
    AZURE = "azure"
    CLOUDRIFT = "cloudrift"
    CRUSOE = "crusoe"
    CUDO = "cudo"
    DATACRUNCH = "datacrunch"
    DAYTONA = "daytona"
    DIGITALOCEAN = "digitalocean"
    DSTACK = "dstack"
    GCP = "gcp"
    HOTAISLE = "hotaisle"
    JARVISLABS = "jarvislabs"
    KUBERNETES = "kubernetes"
    LAMBDA = "lambda"
    LIUM = "lium"
    REMOTE = "remote"
    NEBIUS = "nebius"
    OCI = "oci"
    RUNPOD = "runpod"
    SEEWEB = "seeweb"
    TENSORDOCK = "tensordock"
    VASTAI = "vastai"
    VERDA = "verda"
    VULTR = "vultr"
    SLURM = "slurm"


def _duration(value: object) -> int:
    return parse_duration(value)


def _memory(value: object) -> float:
    return parse_memory(value)


Duration = Annotated[int, PlainValidator(_duration), PlainSerializer(int, return_type=int)]
"""Seconds, written as `90`, `30m`, `2h`, `1d` or `1w`."""

Memory = Annotated[float, PlainValidator(_memory), PlainSerializer(float, return_type=float)]
"""GB, written as a number or `512MB`, `16GB`, `1TB`."""

OffableDuration = Annotated[Optional[Union[Literal["off"], int]], BeforeValidator(parse_off_duration)]
"""None (default), "off" (from `off`/`false`) or seconds >= 0."""

IdleDuration = Annotated[Optional[int], BeforeValidator(parse_idle_duration)]
"""None (default), -1 (from `off`/`false`/-1) or seconds."""


class EntityReference(CoreModel):
    """`name` or `project/name`, normalised to `{"project": ..., "name": ...}`."""

    project: Optional[str] = None
    name: str

    @classmethod
    def parse(cls, value: Union[str, EntityReference]) -> EntityReference:
        if isinstance(value, EntityReference):
            return value
        parts = value.split("/")
        if any(not part for part in parts) or len(parts) > 2:
            raise ValueError(f"invalid reference {value!r}: use `<name>` or `<project>/<name>`")
        if len(parts) == 1:
            return cls(project=None, name=parts[0])
        return cls(project=parts[0], name=parts[1])

    def format(self) -> str:
        return self.name if self.project is None else f"{self.project}/{self.name}"


class RegistryAuth(CoreModel):
    username: str
    password: str


# ---------------------------------------------------------------- env

_ENV_ITEM = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*(=.*)?")


class EnvSentinel(CoreModel):
    """An env var listed without a value (`- HF_TOKEN`): the client fills it from its own env."""

    key: str


EnvValue = Union[str, EnvSentinel]


def parse_env(value: Any) -> Any:
    """`KEY=VAL`/`KEY` list -> mapping; duplicates rejected. Mappings pass through to validation."""
    if value is None:
        raise ValueError("env must be a mapping or a list of KEY=VALUE strings, not null")
    if not isinstance(value, list):
        return value
    env: dict[str, Any] = {}
    for index, item in enumerate(value):
        text = str(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else item
        if not isinstance(text, str) or not _ENV_ITEM.fullmatch(text):
            raise ValueError(
                f"env item {index} ({item!r}) is invalid: use KEY=VALUE or KEY (a name of letters, "
                "digits and _ that does not start with a digit)"
            )
        key, sep, val = text.partition("=")
        if key in env:
            raise ValueError(f"duplicate environment variable: {text}")
        env[key] = val if sep else EnvSentinel(key=key)
    return env


Env = Annotated[dict[str, EnvValue], BeforeValidator(parse_env)]


# ---------------------------------------------------------------- tags

_TAG_KEY = re.compile(r"^[_\-a-zA-Z0-9]{1,60}$")
_TAG_VALUE = re.compile(r"^[a-zA-Z0-9 .:/=_\-+@]{0,256}$")


def validate_tags(value: Any) -> Any:
    if value is None or not isinstance(value, dict):
        return value
    for key, val in value.items():
        if not isinstance(key, str) or not _TAG_KEY.match(key):
            raise ValueError(f"invalid tag key {key!r}: it must match {_TAG_KEY.pattern}")
        if not isinstance(val, str) or not _TAG_VALUE.match(val):
            raise ValueError(f"invalid tag value {val!r}: it must be a string matching {_TAG_VALUE.pattern}")
    return value


Tags = Annotated[Optional[dict[str, str]], BeforeValidator(validate_tags)]


# ---------------------------------------------------------------- cron

_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day", 1, 31), ("month", 1, 12), ("day_of_week", 0, 6))
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_ALL = re.compile(r"\*(?:/(\d+))?$")
_NUM_RANGE = re.compile(r"(\d+)(?:-(\d+))?(?:/(\d+))?$")
_NAME_RANGE = re.compile(r"([a-z]+)(?:-([a-z]+))?$", re.IGNORECASE)
_DAY_SPECIAL = re.compile(r"(last|(1st|2nd|3rd|4th|5th|last) +[a-z]+)$", re.IGNORECASE)


def validate_cron(expression: str) -> str:
    """Accepts the 5-field crontab grammar the dstack server accepts (APScheduler's dialect, UTC)."""
    values = expression.split()
    if len(values) != 5:
        raise ValueError(
            f"invalid cron expression {expression!r}: wrong number of fields; got {len(values)}, expected 5 "
            "(minute hour day month day_of_week)"
        )
    for (name, lo, hi), value in zip(_CRON_FIELDS, values, strict=True):
        for part in value.split(","):
            _validate_cron_part(expression, name, lo, hi, part.strip())
    return expression


def _validate_cron_part(expression: str, name: str, lo: int, hi: int, part: str) -> None:
    def fail(why: str) -> ValueError:
        return ValueError(f"invalid cron expression {expression!r}: field {name} {part!r}: {why}")

    if match := _ALL.match(part):
        step = match.group(1)
        if step is not None and (int(step) == 0 or int(step) > hi - lo):
            raise fail("step out of range")
        return
    if match := _NUM_RANGE.match(part):
        first, last, step = match.groups()
        if not lo <= int(first) <= hi or (last is not None and not lo <= int(last) <= hi):
            raise fail(f"value out of range {lo}-{hi}")
        if last is not None and int(first) > int(last):
            raise fail("range start is after its end")
        if step is not None and int(step) == 0:
            raise fail("step must be higher than 0")
        return
    names = {"month": _MONTHS, "day_of_week": _WEEKDAYS}.get(name)
    if names is not None and (match := _NAME_RANGE.match(part)):
        if any(v is not None and v.lower() not in names for v in match.groups()):
            raise fail(f"unknown name; use one of {', '.join(names)}")
        return
    if name == "day" and (match := _DAY_SPECIAL.match(part)):
        weekday = part.split()[-1].lower()
        if match.group(2) is not None and weekday not in _WEEKDAYS:
            raise fail(f"unknown weekday {weekday!r}; use one of {', '.join(_WEEKDAYS)}")
        return
    raise fail("unrecognized expression")


__all__ = [
    "BackendType",
    "CoreModel",
    "Duration",
    "EntityReference",
    "Env",
    "EnvSentinel",
    "EnvValue",
    "IdleDuration",
    "Memory",
    "OffableDuration",
    "RegistryAuth",
    "Tags",
    "validate_cron",
]
