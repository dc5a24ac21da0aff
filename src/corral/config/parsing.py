"""Entry points: parse a configuration dict by its `type` (volumes also by `backend`), parse a
profile, and load a `.dstack.yml` file with readable one-line-per-problem errors.

Dispatch is by hand rather than through a pydantic tagged union, so an error's `loc` is the
field path in the user's file (`resources.gpu`), not prefixed with the union tag.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import ValidationError

from corral.config.common import CoreModel
from corral.config.fleets import FleetConfiguration
from corral.config.gateways_volumes import VOLUME_MODELS, AnyVolumeConfiguration, GatewayConfiguration
from corral.config.presets import PresetConfiguration
from corral.config.profiles import UTILIZATION_MIN_WINDOW_KEY, Profile
from corral.config.runs import DevEnvironmentConfiguration, TaskConfiguration
from corral.config.services import ServiceConfiguration

AnyRunConfiguration = Union[TaskConfiguration, ServiceConfiguration, DevEnvironmentConfiguration]
AnyConfiguration = Union[
    AnyRunConfiguration,
    FleetConfiguration,
    GatewayConfiguration,
    AnyVolumeConfiguration,
    PresetConfiguration,
]

RUN_MODELS: dict[str, type[CoreModel]] = {
    "task": TaskConfiguration,
    "service": ServiceConfiguration,
    "dev-environment": DevEnvironmentConfiguration,
}
CONFIGURATION_MODELS: dict[str, type[CoreModel]] = {
    **RUN_MODELS,
    "fleet": FleetConfiguration,
    "gateway": GatewayConfiguration,
    "preset": PresetConfiguration,
}


class _RunType(CoreModel):
    model_config = {"extra": "ignore"}
    type: Literal["task", "service", "dev-environment"]


class _AnyType(CoreModel):
    model_config = {"extra": "ignore"}
    type: Literal["task", "service", "dev-environment", "fleet", "gateway", "volume", "preset"]


class _VolumeBackend(CoreModel):
    model_config = {"extra": "ignore"}
    backend: Literal["aws", "gcp", "runpod", "kubernetes", "daytona", "lium"]


def _as_dict(data: Any) -> dict[str, Any]:
    if isinstance(data, Mapping):
        return dict(data)
    # Let pydantic produce the standard "must be a dictionary" error.
    _AnyType.model_validate(data)
    raise AssertionError("unreachable")  # pragma: no cover


def _window_context(utilization_min_window: Optional[float]) -> Optional[dict[str, float]]:
    return None if utilization_min_window is None else {UTILIZATION_MIN_WINDOW_KEY: utilization_min_window}


def parse_run_configuration(data: object, *, utilization_min_window: Optional[float] = None) -> AnyRunConfiguration:
    """A task, service or dev-environment; raises pydantic.ValidationError (for one that is not a mapping too).
    ``utilization_min_window``: the least ``utilization_policy.time_window`` accepted (None: dstack's 5 minutes)."""
    data = _as_dict(data)
    kind = _RunType.model_validate(data).type
    context = _window_context(utilization_min_window)
    conf: AnyRunConfiguration = RUN_MODELS[kind].model_validate(data, context=context)  # type: ignore[assignment]
    return conf


def parse_fleet_configuration(data: Mapping[str, Any]) -> FleetConfiguration:
    return FleetConfiguration.model_validate(dict(data))


def parse_gateway_configuration(data: Mapping[str, Any]) -> GatewayConfiguration:
    return GatewayConfiguration.model_validate(dict(data))


def parse_volume_configuration(data: Mapping[str, Any]) -> AnyVolumeConfiguration:
    """A volume, by `backend`; raises pydantic.ValidationError."""
    data = _as_dict(data)
    backend = _VolumeBackend.model_validate(data).backend
    conf: AnyVolumeConfiguration = VOLUME_MODELS[backend].model_validate(data)  # type: ignore[assignment]
    return conf


def parse_configuration(data: Mapping[str, Any]) -> AnyConfiguration:
    """Any `.dstack.yml` configuration, by `type`; raises pydantic.ValidationError."""
    data = _as_dict(data)
    kind = _AnyType.model_validate(data).type
    if kind == "volume":
        return parse_volume_configuration(data)
    conf: AnyConfiguration = CONFIGURATION_MODELS[kind].model_validate(data)  # type: ignore[assignment]
    return conf


def parse_profile(data: Optional[Mapping[str, Any]], *, utilization_min_window: Optional[float] = None) -> Profile:
    """A `Profile` (`run_spec.profile`, a `profiles.yml` entry); None gives the empty profile.
    ``utilization_min_window`` as for :func:`parse_run_configuration`."""
    if data is None:
        return Profile()
    return Profile.model_validate(dict(data), context=_window_context(utilization_min_window))


class ConfigError(ValueError):
    """A configuration file that cannot be used.

    `str()` is one line per problem, each `field.path: what is wrong` (`resources.gpu: invalid GPU
    spec 'A100:xx': ...`); `problems` holds the lines and `path` the file.
    """

    def __init__(self, problems: list[str], path: Optional[Path] = None) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        self.path = path


def _format_loc(loc: tuple[Union[int, str], ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text or "(top level)"


def format_validation_error(error: ValidationError) -> list[str]:
    """`["resources.gpu: invalid GPU spec 'A100:xx': ...", ...]`, one entry per problem."""
    problems = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field; remove it or check its spelling"
        elif item["type"] == "missing":
            message = "required field is missing"
        problems.append(f"{_format_loc(item['loc'])}: {message}")
    return problems


def load_configuration_file(path: Union[str, Path]) -> AnyConfiguration:
    """Read and parse a `.dstack.yml`; raises ConfigError naming the file and each bad field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError([f"cannot read {path}: {e.strerror or e}"], path) from e
    import yaml  # here, not at module level: the server never reads a `.dstack.yml` file

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"invalid YAML in {path}: {where}{problem}"], path) from e
    if not isinstance(data, dict):
        raise ConfigError([f"{path} must contain a mapping with a `type` key"], path)
    try:
        return parse_configuration(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e), path) from e


_WARM_SAMPLES: tuple[dict[str, Any], ...] = (
    {"type": "task", "commands": ["true"], "resources": {"gpu": "1..", "cpu": "1.."}, "retry": True},
    {"type": "service", "port": 8000, "commands": ["true"]},
    {"type": "dev-environment", "ide": "vscode"},
    {"type": "fleet", "name": "f", "nodes": "0..1"},
    {"type": "fleet", "name": "s", "ssh_config": {"user": "u", "hosts": ["h"]}},
    {"type": "gateway", "name": "g", "backend": "aws", "region": "r", "domain": "example.com"},
    {"type": "volume", "name": "v", "backend": "aws", "region": "r", "size": "1GB"},
)


def warm_up() -> None:
    """Build the models now (they are built lazily so that start-up stays short): called off the event
    loop right after the server starts, so the first request does not pay for it."""
    for sample in _WARM_SAMPLES:
        parse_configuration(sample)
    parse_profile({})
