"""A task's instructions in a user's words, and the check that none spells out a call.

BFCL's users say what they want done with the values they have ("Go into Documents and list everything
there"), never a call. A model that copies a call out of its prompt learns nothing that carries over to
them, so every proposed turn is checked (`leaked_call`) whoever wrote it. Where the abstraction's model is
too small to write an instruction (SmolLM2-135M wrote "[1]" and "Train 2 (trading_logout())"),
`describe_turn` writes one from the tools' and parameters' own descriptions in BFCL's function docs:
`cd(folder='Documents')` becomes `Change the current working directory to the specified folder (the
folder of the directory to change to: "Documents").`
"""
from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping, Sequence

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.calls import Call, parse_action

_CALL = re.compile(r"\b[A-Za-z_]\w*\(")
_ASSIGNMENT = re.compile(r"\b[A-Za-z_]\w*\s*=\s*[^\s=]")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def leaked_call(instruction: str, tools: Iterable[str] = ()) -> str:
    """Why `instruction` spells out a call: a function name followed by "(" (a tool's name even with a
    space before it), or `name=value` syntax; "" when it reads as a request. Text in double quotes is a
    value the user gives (a file's content may hold `x=1`) and is not read."""
    instruction = _QUOTED.sub('""', instruction)
    names = sorted(set(tools), key=len, reverse=True)
    tool_call = re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")\s*\(") if names else None
    found = (tool_call.search(instruction) if tool_call else None) or _CALL.search(instruction)
    if found:
        return f"it spells out a call ({found.group(0).strip()!r}); say what to achieve, with the values, instead"
    found = _ASSIGNMENT.search(instruction)
    if found:
        return f"it uses name=value syntax ({found.group(0)!r}); say the value in words instead"
    return ""


def _sentence(text: str) -> str:
    """The first sentence of a doc string, without its full stop."""
    first = re.split(r"(?<=[.!?])\s+", " ".join(text.split()), maxsplit=1)[0]
    return first.rstrip(".").strip()


def _lower(text: str) -> str:
    """The text to go mid-sentence: its first letter lowered unless it starts an acronym ("ID of ...")."""
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def _doc(name: str, classes: Sequence[str]) -> Mapping[str, Any] | None:
    for cls in classes:
        for doc in bfcl_data.function_docs(cls):
            if doc["name"] == name:
                return doc
    return None


def say_value(value: Any) -> str:
    """A literal argument as a user would give it: text in double quotes, yes/no, numbers as written."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return ", ".join(say_value(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{k} {say_value(v)}" for k, v in value.items()) if value else "none"
    return str(value)


def describe_call(call: Call, classes: Sequence[str]) -> str:
    """What one call asks for, in the words of its tool's doc: the tool's description, then each argument's
    description with its value."""
    doc = _doc(call.name, classes) or {}
    what = _sentence(bfcl_data.tool_description(doc)) if doc else ""
    what = what or call.name.replace("_", " ")
    properties = (doc.get("parameters") or {}).get("properties") or {}
    named = {**dict(zip(properties, call.args)), **call.kwargs}
    parts = []
    for name, value in named.items():
        said = _sentence(str((properties.get(name) or {}).get("description", ""))) or name.replace("_", " ")
        parts.append(f"{_lower(said)}: {say_value(value)}")
    return what + (f" ({'; '.join(parts)})" if parts else "")


def describe_turn(calls: Sequence[str], classes: Sequence[str]) -> str:
    """A user's instruction for one turn of reference calls: each call described, in order, as one sentence."""
    parts = []
    for source in calls:
        parsed = parse_action([source]).calls
        call = parsed[0] if len(parsed) == 1 and isinstance(parsed[0], Call) else None
        parts.append(describe_call(call, classes) if call else source)
    text = ", then ".join([parts[0], *map(_lower, parts[1:])])
    return text[:1].upper() + text[1:] + "."
