"""Stored JSON documents (run and job specs) that are parsed only when someone reads into them.

A page of ``runs/list`` carries hundreds of specs that the API only copies from the database to the
response: ``LazyJSON`` keeps the stored text, the serialisers embed it as is (``orjson.Fragment``), and
a service that does look inside gets the parsed mapping on first access. Read-only, like the records
holding it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson


class LazyJSON(Mapping[str, Any]):
    __slots__ = ("_value", "raw")

    def __init__(self, raw: str | bytes) -> None:
        self.raw = raw.encode() if isinstance(raw, str) else raw
        self._value: dict[str, Any] | None = None

    def _parsed(self) -> dict[str, Any]:
        if self._value is None:
            self._value = orjson.loads(self.raw)
        return self._value

    def __getitem__(self, key: str) -> Any:
        return self._parsed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyJSON):
            return self.raw == other.raw or self._parsed() == other._parsed()
        return self._parsed() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LazyJSON({self.raw[:60]!r}...)"


def spec_configuration(spec: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The configuration (JSON) a stored run or fleet spec document holds: empty where it holds none."""
    conf = None if spec is None else spec.get("configuration")
    return conf if isinstance(conf, Mapping) else {}


def json_default(obj: Any) -> Any:
    """``orjson`` hook: embed a lazy document's stored text without parsing it."""
    if isinstance(obj, LazyJSON):
        return orjson.Fragment(obj.raw)
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")
