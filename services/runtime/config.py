"""Configuration layering shared by every service: defaults, then `KEY`, then `SERVICE_KEY`.

Each service has one frozen dataclass; every field has a default and a one-line doc in
`field(metadata={"doc": ...})`. `load(Config, "learner")` reads `LEARNER_KAFKA_BOOTSTRAP`, then
`KAFKA_BOOTSTRAP`, then the default, and converts to the field's type.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value or combination is invalid; the message says how to fix it."""


def doc(default: Any, text: str) -> Any:
    """A dataclass field with a default and a one-line doc."""
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"doc": text})
    return dataclasses.field(default=default, metadata={"doc": text})


def _convert(raw: str, kind: Any, name: str) -> Any:
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={raw!r} is not a boolean; use true or false")
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a {kind.__name__}") from None
    if kind is Path:
        return Path(raw)
    return raw


def load(cls: type[T], service: str, overrides: dict[str, Any] | None = None,
         environ: typing.Mapping[str, str] | None = None) -> T:
    """Build `cls` from defaults, environment variables and explicit overrides (highest)."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        for key in (f"{service.upper()}_{f.name.upper()}", f.name.upper()):
            if key in environ:
                kind = hints[f.name]
                base = typing.get_args(kind)[0] if typing.get_origin(kind) in (typing.Union, None.__class__) else kind
                values[f.name] = _convert(environ[key], base if base is not type(None) else str, key)
                break
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    return cls(**values)


def describe(cls: type) -> list[tuple[str, Any, str]]:
    """(name, default, doc) for every field, for --help texts and docs."""
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((f.name, default, f.metadata.get("doc", "")))
    return rows
