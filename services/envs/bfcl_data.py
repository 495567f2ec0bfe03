"""BFCL multi-turn tasks, their tool schemas and the fixed train/test split, read from `bfcl-eval`.

The data ships inside the installed `bfcl_eval` package (installed with `--no-deps`); nothing here
imports its inference or evaluation code.
"""
from __future__ import annotations

import itertools
import json
import random
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

from coevolve.services.envs.base import Task

CATEGORIES = ("multi_turn_base", "multi_turn_miss_param", "multi_turn_miss_func",
              "multi_turn_long_context")
SPLIT_CATEGORY = "multi_turn_base"
SPLIT_SEED = 2604
"""Seed of the held-out split; changing it changes which tasks evaluation sees."""

ADDED_TOOLS_PROMPT = "I have updated some more functions you can choose from. What about now?"
"""The user message of a miss_func turn that only brings new tools (BFCL's wording)."""

DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json", "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json", "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json", "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json", "VehicleControlAPI": "vehicle_control.json",
}
"""The multi-turn tool classes and the file holding each one's function docs."""

_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def data_dir() -> Path:
    return Path(str(resources.files("bfcl_eval") / "data"))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def category_of(task_id: str) -> str:
    return task_id.rsplit("_", 1)[0]


def index_of(task_id: str) -> int:
    return int(task_id.rsplit("_", 1)[1])


@lru_cache(maxsize=None)
def load_category(category: str) -> tuple[Task, ...]:
    """Every task of one BFCL multi-turn category, with its ground truth as the reference."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose from {', '.join(CATEGORIES)}")
    root = data_dir()
    entries = _read_jsonl(root / f"BFCL_v4_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(root / "possible_answer" / f"BFCL_v4_{category}.json")}
    tasks = []
    for entry in entries:
        added = {int(turn): tuple(names) for turn, names in entry.get("missed_function", {}).items()}
        turns = tuple(messages[0]["content"] if messages else ADDED_TOOLS_PROMPT
                      for messages in entry["question"])
        tasks.append(Task(task_id=entry["id"], turns=turns, initial_state=entry["initial_config"],
                          involved_classes=tuple(entry["involved_classes"]),
                          reference=tuple(tuple(turn) for turn in answers[entry["id"]]),
                          added_tools=added, long_context="long_context" in category))
    return tuple(tasks)


@lru_cache(maxsize=None)
def _task_index() -> dict[str, Task]:
    return {task.task_id: task for category in CATEGORIES for task in load_category(category)}


def get_task(task_id: str) -> Task:
    """The BFCL task with this id, e.g. `multi_turn_base_12`."""
    try:
        return _task_index()[task_id]
    except KeyError:
        raise KeyError(f"no BFCL multi-turn task {task_id!r} (ids look like multi_turn_base_0 ... "
                       f"multi_turn_long_context_199)") from None


@lru_cache(maxsize=None)
def test_indices(seed: int = SPLIT_SEED) -> frozenset[int]:
    """Indices of the held-out half of multi_turn_base: a seeded shuffle, second half."""
    indices = sorted(index_of(t.task_id) for t in load_category(SPLIT_CATEGORY))
    random.Random(seed).shuffle(indices)
    return frozenset(indices[len(indices) // 2:])


def split_of(task_id: str, seed: int = SPLIT_SEED) -> str:
    """`train` or `test`. The other categories are variants of the base task with the same index,
    so they follow its split and a test scenario never leaks into training."""
    return "test" if index_of(task_id) in test_indices(seed) else "train"


def load_tasks(categories: Iterable[str] = (SPLIT_CATEGORY,), split: str = "all",
               seed: int = SPLIT_SEED) -> list[Task]:
    """Tasks of the given categories; `split` is `train`, `test` (evaluation) or `all`."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be train, test or all, not {split!r}")
    return [t for c in categories for t in load_category(c)
            if split == "all" or split_of(t.task_id, seed) == split]


def seed_pool(categories: Sequence[str], count: int = 0) -> list[Task]:
    """The train tasks of `categories`, interleaved so that the first `count` (0: all) keep each
    category's share: the learner's seed pool, and what random exploration draws from."""
    by_category = [load_tasks([c], split="train") for c in categories]
    seeds = [t for group in itertools.zip_longest(*by_category) for t in group if t is not None]
    return seeds[:count] if count else seeds


@lru_cache(maxsize=None)
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one tool class."""
    if class_name not in DOC_FILES:
        raise ValueError(f"unknown BFCL tool class {class_name!r}; known: {', '.join(DOC_FILES)}")
    return tuple(_read_jsonl(data_dir() / "multi_turn_func_doc" / DOC_FILES[class_name]))


def _json_schema(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _json_schema(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = _JSON_TYPES.get(out["type"], out["type"])
        return out
    if isinstance(schema, list):
        return [_json_schema(v) for v in schema]
    return schema


def tool_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """One function doc as an OpenAI-style tool (JSON Schema types), the form chat templates take."""
    return {"type": "function", "function": {"name": doc["name"], "description": doc["description"],
                                             "parameters": _json_schema(doc["parameters"])}}


@lru_cache(maxsize=None)
def _class_tools(class_name: str) -> tuple[dict[str, Any], ...]:
    return tuple(tool_schema(doc) for doc in function_docs(class_name))


def tools_at(task: Task, turn: int) -> list[dict[str, Any]]:
    """The tools offered at `turn`: every function of the involved classes, minus those withheld
    until a later turn. The schemas are shared between episodes: treat them as read-only."""
    withheld = {name for t, names in task.added_tools.items() if t > turn for name in names}
    return [tool for cls in task.involved_classes for tool in _class_tools(cls)
            if tool["function"]["name"] not in withheld]


def tools_added_at(task: Task, turn: int) -> list[dict[str, Any]]:
    names = set(task.added_tools.get(turn, ()))
    return [tool for cls in task.involved_classes for tool in _class_tools(cls)
            if tool["function"]["name"] in names]


TOOL_DOCS = ("full", "signatures")


def tool_description(function: dict[str, Any]) -> str:
    """What a function does, from its BFCL doc, the class preamble ("This tool belongs to...") dropped."""
    return function.get("description", "").split("Tool description:")[-1].strip()


def _signature(function: dict[str, Any]) -> str:
    """`name(arg: type, optional: type = None): what it does` from BFCL's doc."""
    params = function.get("parameters") or {}
    required = set(params.get("required") or ())
    args = [f"{name}: {spec.get('type', 'any')}" + ("" if name in required else " = None")
            for name, spec in (params.get("properties") or {}).items()]
    return f"{function['name']}({', '.join(args)}): {tool_description(function)}"


def tool_listing(tools: list[dict[str, Any]], docs: str = "full") -> str:
    """The tools as a prompt lists them: `full` is BFCL's JSON doc per function (2.7-4.5k tokens for a
    task's classes with SmolLM2's tokenizer), `signatures` one line per function with its arguments'
    names and types and its own description (about a fifth of that)."""
    if docs == "signatures":
        return "\n".join(_signature(t["function"]) for t in tools)
    if docs == "full":
        return "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    raise ValueError(f"tool_docs={docs!r}: choose one of {', '.join(TOOL_DOCS)}")


def system_prompt(tools: list[dict[str, Any]], docs: str = "full") -> str:
    listing = tool_listing(tools, docs)
    return (
        "You are an agent that completes the user's requests by calling functions. Each turn, call "
        "the functions needed, read their results, and keep calling until the request is done; then "
        "reply without a function call to end the turn. If a request cannot be done with these "
        "functions, or lacks a required value, say so instead of calling.\n\n"
        "Write calls either as a Python-style list, e.g. [func_a(x=1, y='b'), func_b()], or as JSON "
        "tool calls, e.g. {\"name\": \"func_a\", \"arguments\": {\"x\": 1, \"y\": \"b\"}}. Arguments "
        "must be literal values.\n\n"
        f"Available functions:\n{listing}\n"
    )
