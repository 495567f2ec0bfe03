"""BFCL's executable backends, where they run: loading a task's instances, one call, and state comparison.

Everything here acts on instances in the current process: directly for an unbounded workspace, or
inside the tool host (`host.py`), which runs these same functions in a process of its own.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import json
import threading
from functools import lru_cache
from typing import Any, Callable

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task
from coevolve.services.envs.calls import Call, Rejected

_BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
_MODULES = {name: file.removesuffix(".json") for name, file in bfcl_data.DOC_FILES.items()}
_STATELESS = frozenset({"MathAPI"})

# Some backends write process-wide state while they run (mpmath's precision, a module-level dict in
# the vehicle backend), so calls into them are serialized; each call takes microseconds.
_BACKEND_LOCK = threading.Lock()


class InvalidTask(ValueError):
    """The task cannot run here (unknown tool class, unloadable initial state, no turns)."""


@lru_cache(maxsize=None)
def backend_class(name: str) -> type:
    if name not in _MODULES:
        raise InvalidTask(f"unknown tool class {name!r}; BFCL multi-turn has {', '.join(_MODULES)}")
    return getattr(importlib.import_module(f"{_BACKEND_PACKAGE}.{_MODULES[name]}"), name)


@lru_cache(maxsize=None)
def public_methods(name: str) -> frozenset[str]:
    return frozenset(n for n, _ in inspect.getmembers(backend_class(name), inspect.isfunction)
                     if not n.startswith("_"))


def _arg(bound: inspect.BoundArguments, name: str) -> Any:
    return bound.arguments.get(name)


def _power_guard(b: inspect.BoundArguments) -> str | None:
    base, exp = _arg(b, "base"), _arg(b, "exponent")
    if isinstance(base, int) and isinstance(exp, int) and abs(exp) * max(abs(base).bit_length(), 1) > 1 << 20:
        return "the result would have more than a million bits"
    return None


def _precision_guard(b: inspect.BoundArguments) -> str | None:
    precision = _arg(b, "precision")
    if isinstance(precision, int) and precision > 10_000:
        return "precision above 10000 digits is not supported"
    return None


# Arguments that would make a backend compute for minutes; a literal can be short and still huge work.
_COST_GUARDS: dict[tuple[str, str], Callable[[inspect.BoundArguments], str | None]] = {
    ("MathAPI", "power"): _power_guard,
    ("MathAPI", "square_root"): _precision_guard,
    ("MathAPI", "logarithm"): _precision_guard,
}


def render_result(value: Any) -> str:
    """A call's result as the agent sees it; the same text form as BFCL's executor."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class LocalWorkspace:
    """Fresh backend instances for one task, in this process, and the only way to call them."""

    def __init__(self, task: Task):
        self.instances: dict[str, Any] = {}
        self.owner: dict[str, str] = {}
        for name in task.involved_classes:
            instance = backend_class(name)()
            if name not in _STATELESS:
                config = task.initial_state.get(name, {})
                if not isinstance(config, dict):
                    raise InvalidTask(f"initial state of {name} must be an object")
                try:
                    instance._load_scenario(copy.deepcopy(config), long_context=task.long_context)
                except Exception as exc:
                    raise InvalidTask(f"cannot load the initial state of {name}: {exc}") from exc
            self.instances[name] = instance
            for method in public_methods(name):
                self.owner[method] = name

    def run(self, call: Call | Rejected) -> str:
        """Run one call; every failure comes back as text, never as an exception."""
        if isinstance(call, Rejected):
            return f"Invalid action: {call.reason}. Got: {call.source}"
        owner = self.owner.get(call.name)
        if owner is None:
            return (f"Invalid action: {call.name!r} is not a function of this task's tools "
                    f"({', '.join(self.instances)}).")
        method = getattr(self.instances[owner], call.name)
        args, kwargs = copy.deepcopy((call.args, dict(call.kwargs)))
        guard = _COST_GUARDS.get((owner, call.name))
        if guard is not None:
            try:
                refusal = guard(inspect.signature(method).bind(*args, **kwargs))
            except TypeError:
                refusal = None
            if refusal:
                return f"Invalid action: {call.name}: {refusal}."
        try:
            with _BACKEND_LOCK:
                return render_result(method(*args, **kwargs))
        except Exception as exc:
            return f"Error during execution: {exc}"

    def state_differences(self, reference: "LocalWorkspace") -> dict[str, list[str]]:
        """Per class, the public attributes of the reference instance this one does not equal."""
        diffs: dict[str, list[str]] = {}
        for name, ref in reference.instances.items():
            mine = self.instances[name]
            for attr, value in vars(ref).items():
                if attr.startswith("_"):
                    continue
                try:
                    same = hasattr(mine, attr) and not (getattr(mine, attr) != value)
                except Exception:
                    same = False
                if not same:
                    diffs.setdefault(name, []).append(attr)
        return diffs
