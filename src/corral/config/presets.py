"""The `preset` type (dstack 0.22's agent-driven LLM serving recipe). corral only validates it,
with dstack's rules, so that such files are accepted or rejected exactly as dstack does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, PositiveInt, field_validator, model_validator
from typing_extensions import Self

from corral.config.common import CoreModel, EntityReference, Env
from corral.config.profiles import ProfileParams

DEFAULT_INPUT_TOKENS = 1024
MAX_PROMPT_LENGTH = 10_000


def _non_empty(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"Preset model {what} must be a non-empty string")
    return value


class PresetModelRepo(CoreModel):
    repo: str
    name: Optional[str] = None

    @field_validator("repo", "name")
    @classmethod
    def _strings(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else _non_empty(value, "repo/name")


class PresetModelBase(CoreModel):
    base: str

    @field_validator("base")
    @classmethod
    def _base(cls, value: str) -> str:
        return _non_empty(value, "base")


class PresetAgentConfig(CoreModel):
    provider: Literal["claude", "codex"]
    model: Optional[str] = None
    effort: Optional[Literal["low", "medium", "high", "xhigh", "max"]] = None

    @model_validator(mode="after")
    def _effort(self) -> Self:
        if self.provider == "codex" and self.effort == "max":
            raise ValueError("effort `max` is not supported by `codex`")
        return self


class PresetPromptFile(CoreModel):
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("Prompt path must be a non-empty string")
        return value


class PresetConfiguration(ProfileParams):
    type: Literal["preset"] = "preset"
    name: Optional[str] = None
    model: Union[PresetModelRepo, PresetModelBase]
    base: Optional[str] = None
    repo: Optional[str] = None
    prompt: Optional[Union[str, PresetPromptFile]] = None
    min_context_length: Optional[PositiveInt] = None
    max_ttft: Optional[PositiveInt] = None
    trials: Optional[PositiveInt] = None
    previous: Optional[list[str]] = None
    concurrency: Optional[PositiveInt] = None
    input_tokens: Optional[PositiveInt] = None
    output_tokens: Optional[Annotated[int, Field(ge=2)]] = None
    shared_prefix_tokens: Optional[Annotated[int, Field(ge=0)]] = None
    dataset: Optional[str] = None
    baseline: Optional[bool] = None
    gateway: Annotated[Optional[Union[bool, EntityReference, str]], Field(union_mode="left_to_right")] = None
    agent: Optional[PresetAgentConfig] = None
    env: Env = {}

    @model_validator(mode="before")
    @classmethod
    def _model_shorthand(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        base, repo = data.get("base"), data.get("repo")
        if base and repo:
            raise ValueError("`base` and `repo` are mutually exclusive")
        if base or repo:
            if data.get("model") is not None:
                raise ValueError("`model` cannot be combined with the `base`/`repo` shorthand")
            data = {k: v for k, v in data.items() if k not in ("base", "repo")}
            data["model"] = {"base": base} if base else {"repo": repo}
        return data

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> Any:
        return {"repo": _non_empty(value, "model")} if isinstance(value, str) else value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("Prompt must be a non-empty string")
            if len(value) > MAX_PROMPT_LENGTH:
                raise ValueError(f"Prompt must be at most {MAX_PROMPT_LENGTH} characters")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        value = value.strip()
        if not value:
            raise ValueError("dataset must be a non-empty string")
        if value == "random":
            raise ValueError("`random` is not a dataset; omit `dataset` for synthetic prompts")
        return value

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.dataset is not None:
            set_fields = [
                n for n in ("input_tokens", "output_tokens", "shared_prefix_tokens") if getattr(self, n) is not None
            ]
            if set_fields:
                raise ValueError(
                    f"{', '.join(set_fields)} shape synthetic prompts and cannot be set together with "
                    "`dataset`; a dataset defines its own request shape"
                )
        if self.shared_prefix_tokens is not None:
            input_tokens = self.input_tokens or DEFAULT_INPUT_TOKENS
            if self.shared_prefix_tokens >= input_tokens:
                raise ValueError(f"shared_prefix_tokens must be less than input_tokens ({input_tokens})")
        return self
