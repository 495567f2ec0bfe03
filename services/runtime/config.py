"""Configuration layering shared by every service: defaults, then `KEY`, then `SERVICE_KEY`, then flags.

A config is a frozen dataclass; every field has a default and a one-line doc in
`field(metadata={"doc": ...})`. `load(Config, "learner")` reads `LEARNER_KAFKA_BOOTSTRAP`, then
`KAFKA_BOOTSTRAP`, then the default, and converts to the field's type. A service's settings are one
config or a `Settings` bundle of them, built by `assemble`; what services share is declared once here
(`ServiceConfig`, `ConsumerConfig`) or in the part they have in common.
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


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """What every service process shares: its broker and its /healthz and /metrics endpoint."""

    kafka_bootstrap: str = doc("127.0.0.1:9092", "Kafka bootstrap address HOST:PORT.")
    metrics_host: str = doc("127.0.0.1", "Address /healthz and /metrics listen on (0.0.0.0 in a pod).")
    metrics_port: int = doc(-1, "Port of /healthz and /metrics; 0 picks one, -1 disables.")


@dataclasses.dataclass(frozen=True)
class ConsumerConfig(ServiceConfig):
    """A service that reads its topics in a consumer group and can stop when idle."""

    group_id: str = doc("", "Consumer group; its committed offsets are the service's progress. Empty: "
                            "coevolve-<service>.")
    idle_exit_seconds: float = doc(0.0, "Stop after this long with nothing to read or do; 0 runs until signalled.")
    poll_records: int = doc(200, "Records one poll takes at most: the work between two commits is bounded by it, "
                                 "so a backlog is worked off in committed batches.")

    def __post_init__(self) -> None:
        if self.poll_records < 1:
            raise ConfigError(f"poll_records={self.poll_records} must be at least 1")

    def group(self, service: str) -> str:
        """The consumer group of `service`: group_id, or coevolve-<service>."""
        return self.group_id or f"coevolve-{service}"


class Settings:
    """A service's settings: a frozen dataclass whose fields are its config dataclasses (the parts).

    Every part loads with the service's prefix, so each key (`<SERVICE>_<FIELD>`, a preset's
    `<section>.<field>`, a flag) names one field of one part; two parts declaring one name is an error.
    A part's field the service does not read is in `refused`, with why: setting it is an error.
    A subclass declares its parts as annotations (`learner: LearnerConfig`); each defaults to its
    dataclass's defaults.
    """

    refused: typing.ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, kind in typing.get_type_hints(cls).items():
            if typing.get_origin(kind) is not typing.ClassVar and name in cls.__dict__.get("__annotations__", {}):
                setattr(cls, name, dataclasses.field(default_factory=kind))
        dataclasses.dataclass(frozen=True)(cls)


def parts(cls: type) -> dict[str, type]:
    """The config dataclasses of a Settings bundle by part name; a plain config is its only part."""
    if not issubclass(cls, Settings):
        return {"": cls}
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def owners(cls: type) -> dict[str, str]:
    """Each settable field of `cls` (a config or a Settings bundle), mapped to the part declaring it."""
    owner: dict[str, str] = {}
    refused = getattr(cls, "refused", {})
    for part, kind in parts(cls).items():
        for f in dataclasses.fields(kind):
            if f.name in refused:
                continue
            if f.name in owner:
                raise ConfigError(f"{cls.__name__}: {f.name} is declared by both {owner[f.name] or cls.__name__} "
                                  f"and {part}; one key must set one field")
            owner[f.name] = part
    return owner


def assemble(cls: type[T], service: str, overrides: dict[str, Any] | None = None,
             environ: typing.Mapping[str, str] | None = None) -> T:
    """A service's settings: each part from defaults, then environment, then `overrides` by field name.

    The one way a service's settings are built, by its command and by `coevolve run`'s plan alike.
    """
    owner = owners(cls)
    environ = os.environ if environ is None else environ
    for key, why in getattr(cls, "refused", {}).items():
        if key in (overrides or {}) or f"{service.upper()}_{key.upper()}" in environ:
            raise ConfigError(f"{service}.{key} ({service.upper()}_{key.upper()}) is not read: {why}")
    unknown = sorted(set(overrides or {}) - set(owner))
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not a setting of {service}")
    split: dict[str, dict[str, Any]] = {part: {} for part in parts(cls)}
    for key, value in (overrides or {}).items():
        split[owner[key]][key] = value
    built = {part: load(kind, service, split[part], environ) for part, kind in parts(cls).items()}
    return built[""] if "" in built else cls(**built)


def fields_doc(cls: type) -> dict[str, tuple[Any, str]]:
    """(default, doc) of every settable field of a config or a Settings bundle."""
    return {name: (default, text) for kind in parts(cls).values() for name, default, text in describe(kind)}
