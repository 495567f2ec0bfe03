"""Parse an agent's output into tool calls without running any of it.

Two syntaxes are accepted: BFCL's Python-call lists (`[cd(folder='document'), ls()]`) and JSON tool
calls (`{"name": ..., "arguments": {...}}`, alone, in a list, or in `<tool_call>` tags as chat templates
emit them). Python syntax is read with `ast` and only literal arguments are kept; nothing is evaluated.
Output that is neither is a plain message, which ends the turn. Output that tries to be a call but is
not a plain call with literal arguments yields `Rejected` entries that explain why.
"""
from __future__ import annotations

import ast
import json
import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from coevolve.services.runtime.config import doc


@dataclass(frozen=True)
class CallLimits:
    """Bounds on what one action may contain."""

    max_chars: int = doc(20_000, "Longest action text accepted, in characters.")
    max_depth: int = doc(16, "Deepest nesting of containers inside one argument.")
    max_nodes: int = doc(5_000, "Most literal values (containers and scalars) in one action.")


@dataclass(frozen=True)
class Call:
    """A function name and its literal arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        """The call in BFCL's call syntax, e.g. `cd(folder='document')`."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


@dataclass(frozen=True)
class Rejected:
    """Something that looked like a call but cannot run; `reason` is shown to the agent."""

    source: str
    reason: str
    name: str = ""


@dataclass(frozen=True)
class Action:
    """A parsed agent output: tool calls (some possibly rejected) or a turn-ending message."""

    calls: tuple[Call | Rejected, ...] = ()
    message: str | None = None

    @property
    def ends_turn(self) -> bool:
        return self.message is not None


class _Invalid(ValueError):
    pass


_CALL_START = re.compile(r"^\[?\s*\(?\s*[A-Za-z_][\w.]*\s*\(")
_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_BFCL_TAG = re.compile(r"<TOOLCALL>(.*?)</TOOLCALL>", re.DOTALL)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)
_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL)


def _snippet(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class _Budget:
    def __init__(self, limits: CallLimits):
        self.limits = limits
        self.nodes = 0

    def spend(self, depth: int) -> None:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise _Invalid(f"too many values (more than {self.limits.max_nodes})")
        if depth > self.limits.max_depth:
            raise _Invalid(f"arguments nested deeper than {self.limits.max_depth} levels")


def _literal(node: ast.AST, budget: _Budget, depth: int = 0) -> Any:
    """The value of a literal expression; anything that would need evaluation raises `_Invalid`."""
    budget.spend(depth)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (str, int, float, bool)) or node.value is None:
            return node.value
        raise _Invalid(f"{type(node.value).__name__} literals are not accepted")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = node.operand
        if (isinstance(inner, ast.Constant) and isinstance(inner.value, (int, float))
                and not isinstance(inner.value, bool)):
            return -inner.value if isinstance(node.op, ast.USub) else inner.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_literal(e, budget, depth + 1) for e in node.elts]
        if isinstance(node, ast.List):
            return items
        if isinstance(node, ast.Tuple):
            return tuple(items)
        try:
            return set(items)
        except TypeError:
            raise _Invalid("set elements must be hashable") from None
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise _Invalid("'**' unpacking is not accepted")
            key = _literal(k, budget, depth + 1)
            try:
                out[key] = _literal(v, budget, depth + 1)
            except TypeError:
                raise _Invalid("dict keys must be hashable") from None
        return out
    if isinstance(node, ast.Name):
        raise _Invalid(f"'{node.id}' is a name, not a literal value")
    raise _Invalid(f"{type(node).__name__.lower()} expressions are not accepted, only literal values")


def _python_call(node: ast.AST, source: str, budget: _Budget) -> Call | Rejected:
    text = _snippet(ast.get_source_segment(source, node) or source)
    if isinstance(node, ast.Lambda):
        return Rejected(text, "lambda expressions are not tool calls")
    if not isinstance(node, ast.Call):
        return Rejected(text, "not a function call")
    if not isinstance(node.func, ast.Name):
        kind = "attribute access" if isinstance(node.func, ast.Attribute) else type(node.func).__name__.lower()
        return Rejected(text, f"only plain function names can be called, not {kind}")
    name = node.func.id
    try:
        args = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise _Invalid("'*' unpacking is not accepted")
            args.append(_literal(arg, budget, 1))
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise _Invalid("'**' unpacking is not accepted")
            if kw.arg in kwargs:
                raise _Invalid(f"argument '{kw.arg}' given twice")
            kwargs[kw.arg] = _literal(kw.value, budget, 1)
    except _Invalid as exc:
        return Rejected(text, str(exc), name)
    return Call(name, tuple(args), kwargs)


def _python_calls(text: str, budget: _Budget) -> tuple[Call | Rejected, ...]:
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return (Rejected(_snippet(text), f"could not parse the tool calls: {getattr(exc, 'msg', exc)}"),)
    body = tree.body
    nodes = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    return tuple(_python_call(node, text, budget) for node in nodes)


def _check_json_value(value: Any, budget: _Budget, depth: int) -> None:
    budget.spend(depth)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Invalid("object keys must be strings")
            _check_json_value(v, budget, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_json_value(v, budget, depth + 1)
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise _Invalid(f"{type(value).__name__} is not a JSON value")


def _json_call(obj: Any, budget: _Budget) -> Call | Rejected:
    text = _snippet(json.dumps(obj, default=str))
    if not isinstance(obj, dict):
        return Rejected(text, "a JSON tool call must be an object")
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name", obj.get("function"))
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        return Rejected(text, "a JSON tool call needs a 'name' that is a plain function name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return Rejected(text, "'arguments' is a string that is not valid JSON", name)
    if not isinstance(arguments, dict):
        return Rejected(text, "'arguments' must be a JSON object", name)
    try:
        _check_json_value(arguments, budget, 1)
    except _Invalid as exc:
        return Rejected(text, str(exc), name)
    return Call(name, (), arguments)


def _json_calls(text: str, budget: _Budget) -> tuple[Call | Rejected, ...]:
    try:
        value = json.loads(text)
    except RecursionError:
        return (Rejected(_snippet(text), "JSON nested too deeply"),)
    except ValueError as exc:
        return (Rejected(_snippet(text), f"malformed JSON tool call: {exc}"),)
    items = value if isinstance(value, list) else [value]
    return tuple(_json_call(item, budget) for item in items)


def _looks_like_code(text: str) -> bool:
    """Whether text that is not call-shaped still parses as an expression holding calls or lambdas."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(n, (ast.Call, ast.Lambda)) for n in ast.walk(tree))


def _parse_text(text: str, budget: _Budget) -> Action:
    limit = budget.limits.max_chars
    if len(text) > limit:
        return Action((Rejected(_snippet(text), f"the output is {len(text)} characters, over the "
                                                f"limit of {limit}"),))
    text = _THINKING.sub("", text)
    blocks = _TOOL_CALL_TAG.findall(text)
    if blocks:
        calls: list[Call | Rejected] = []
        for block in blocks:
            calls.extend(_json_calls(block.strip(), budget))
        return Action(tuple(calls))
    tagged = _BFCL_TAG.search(text)
    body = (tagged.group(1) if tagged else text).strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if body in ("", "[]"):
        return Action(message=text)
    if body.startswith("{") or re.match(r"^\[\s*\{", body):
        return Action(_json_calls(body, budget))
    if _CALL_START.match(body) or _looks_like_code(body):
        return Action(_python_calls(body, budget))
    return Action(message=text)


def parse_action(action: str | Sequence[str | Mapping[str, Any]],
                 limits: CallLimits | None = None) -> Action:
    """Parse model output, or a list of single calls (call strings or JSON-call objects)."""
    budget = _Budget(limits or CallLimits())
    if isinstance(action, str):
        return _parse_text(action, budget)
    if not action:
        return Action(message="")
    calls: list[Call | Rejected] = []
    for item in action:
        if isinstance(item, Mapping):
            calls.append(_json_call(dict(item), budget))
        elif isinstance(item, str):
            parsed = _parse_text(item, budget)
            if parsed.ends_turn or len(parsed.calls) != 1:
                calls.append(Rejected(_snippet(item), "expected exactly one function call"))
            else:
                calls.append(parsed.calls[0])
        else:
            calls.append(Rejected(_snippet(repr(item)), "a call must be a string or a JSON object"))
    return Action(tuple(calls))
