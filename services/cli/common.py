"""What every `coevolve` subcommand shares: the app, the broker flag, flags made from a config's fields,
and loading a service's settings."""
from __future__ import annotations

import functools
import inspect
import os
import typing
from typing import Any, Callable, Optional

import typer

from coevolve.services.runtime import log as logs
from coevolve.services.runtime.config import ConfigError, assemble, fields_doc, owners, parts

app = typer.Typer(help="CoEvolve: train LLM agents whose training data evolves with them.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
BootstrapOpt = typer.Option(None, "--bootstrap", help="Kafka bootstrap address HOST:PORT. A service reads "
                            "$<SERVICE>_KAFKA_BOOTSTRAP, then $KAFKA_BOOTSTRAP, without it; a tool $KAFKA_BOOTSTRAP; "
                            "run and check start an embedded broker.")


def flag(cls: type, name: str, *decls: str) -> Any:
    """A flag that overrides one setting of `cls` (a config or a Settings bundle); its help is the field's."""
    default, text = fields_doc(cls)[name]
    shown = f"{default}" if default not in ("", None) else "empty"
    return typer.Option(None, *decls, help=f"{text} (default: {shown})", show_default=False)


def settings_flags(cls: type, *names: str, **decls: str | tuple[str, ...]) -> Callable:
    """Give a command one flag per named setting of `cls` (its type, help and default from the dataclass,
    its name --the-field unless `decls` names it); the command receives them as `flags`, by field name."""
    hints = {name: typing.get_type_hints(parts(cls)[part])[name] for name, part in owners(cls).items()}

    def option(name: str) -> Any:
        if name == "kafka_bootstrap":
            return BootstrapOpt
        names = decls.get(name, ())
        return flag(cls, name, *((names,) if isinstance(names, str) else names))

    def wrap(command: Callable) -> Callable:
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "flags"]
        extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=option(n), annotation=Optional[hints[n]])
                 for n in names]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            return command(flags={n: kwargs.pop(n) for n in names}, **kwargs)

        run.__signature__ = inspect.Signature(own + extra)  # type: ignore[attr-defined]
        run.__annotations__ = {**typing.get_type_hints(command), **{p.name: p.annotation for p in extra}}
        run.__annotations__.pop("flags", None)
        return run

    return wrap


def load(cls, service: str, overrides: dict):
    """A service's settings from defaults, environment and flags; a bad value is a usage error."""
    try:
        return assemble(cls, service, {k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.callback()
def _root(log_level: str = typer.Option("info", help="Log level: debug, info, warning or error.")) -> None:
    logs.configure(log_level)


def require(bootstrap: Optional[str]) -> str:
    """A tool's broker: --bootstrap, then $KAFKA_BOOTSTRAP."""
    bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise typer.BadParameter("no broker address: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP "
                                 "(start one with `coevolve broker`)", param_hint="--bootstrap")
    return bootstrap
