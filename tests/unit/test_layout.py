"""The house rules, checked on the source with `ast`: imports run one way, without cycles, no private
helper crosses a folder, and no function outside SQL text is longer than 80 lines."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"schemas": "coevolve.schemas", "services": "coevolve.services", "streams": "coevolve.streams"}
# Lowest first; a module may import its own layer and those below. The longest matching prefix decides;
# anything else under coevolve.services (envs, archive, analytics, simulate, pipeline, and the
# services to come) is a service.
LAYERS = {
    "coevolve.services.runtime": 0,  # config, logs, health and metrics, the service skeleton
    "coevolve.schemas": 1,  # events and their wire format (imports nothing of the project)
    "coevolve.services.kafka": 2, "coevolve.services.clickhouse": 2,  # infrastructure speaking it
    "coevolve.streams": 3, "coevolve.streams.rules": 3,  # the pure rules
    "coevolve.streams.worker": 4, "coevolve.streams.replay": 4,  # engines and workers that apply them
    "coevolve.services": 5,
    "coevolve.services.cli": 6,
}
INFRASTRUCTURE = 2
SQL = re.compile(r"\b(SELECT|INSERT|CREATE|ALTER)\b")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            out[".".join((package, *parts)).removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every coevolve import in the file, nested ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("coevolve.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coevolve"):
            # `from package import module` depends on the module (as `import package.module` does)
            modules = [n for n in (a.name for a in node.names) if f"{node.module}.{n}" in MODULES]
            names = [a.name for a in node.names if a.name not in modules]
            out += [(f"{node.module}.{n}", []) for n in modules]
            if names:
                out.append((node.module, names))
    return out


def _layer(module: str) -> int:
    match = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[match]


def _folder(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


GRAPH = {m: sorted({t for t, _ in _imports(p) if t in MODULES and t != m}) for m, p in MODULES.items()}


def _cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walk_sees_the_tree():
    assert {"coevolve.streams.rules", "coevolve.services.runtime.service", "coevolve.services.cli"} <= set(MODULES)
    assert "coevolve.streams.rules" in GRAPH["coevolve.streams.worker.attempts"]


def test_no_import_cycle_between_modules():
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH))


def test_no_import_cycle_between_folders():
    folders: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        folders.setdefault(_folder(module), set()).update(_folder(t) for t in targets if _folder(t) != _folder(module))
    graph = {k: sorted(v) for k, v in folders.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_imports_run_down_the_layers():
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in GRAPH.items() for t in targets if _layer(t) > _layer(m)]
    assert upward == []


def test_infrastructure_imports_nothing_of_the_domain():
    infra = [m for m in MODULES if _layer(m) <= INFRASTRUCTURE and m != "coevolve.services"]
    assert "coevolve.services.kafka.consumer" in infra and "coevolve.services.runtime.service" in infra
    assert [(m, t) for m in infra for t in GRAPH[m] if _layer(t) > INFRASTRUCTURE] == []


def test_no_private_name_is_imported_across_folders():
    crossing = [f"{m}: {name} from {target}" for m, path in MODULES.items() for target, names in _imports(path)
                if target in MODULES for name in names
                if name.startswith("_") and _folder(target) != _folder(m)]
    assert crossing == []


def _sql_lines(node: ast.AST) -> set[int]:
    """Lines spanned by string literals that hold SQL (plain or f-strings)."""
    lines: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.JoinedStr):
            text = "".join(v.value for v in n.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            text = n.value
        else:
            continue
        if SQL.search(text):
            lines.update(range(n.lineno, n.end_lineno + 1))
    return lines


def _long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text())
    sql = _sql_lines(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            length = len(set(range(start, node.end_lineno + 1)) - sql)
            if length > limit:
                out.append(f"{path.name}:{node.lineno} {node.name}: {length} lines")
    return out


@pytest.mark.parametrize("folder", [*FOLDERS, "bench"])
def test_no_function_outside_sql_text_exceeds_80_lines(folder):
    found = [f for path in sorted((ROOT / folder).rglob("*.py")) for f in _long_functions(path, 80)]
    assert found == []


def test_the_length_check_counts_closures_and_skips_sql(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    sql = "\n".join(f"        {i}," for i in range(100))
    (tmp_path / "a.py").write_text(f"def outer():\n    def inner():\n{body}\n    return inner\n\n\n"
                                   f"def query():\n    return '''SELECT\n{sql}\n        1'''\n")
    found = sorted(f.split(" ", 1)[1] for f in _long_functions(tmp_path / "a.py", 80))
    assert found == ["inner: 81 lines", "outer: 83 lines"]


LEARNER = "coevolve.services.learner"
TRAINER, RANKS, LOOP = f"{LEARNER}.trainer", f"{LEARNER}.ranks", f"{LEARNER}.loop"
TRAINER_START = f"{RANKS}.start"  # the one place every rank builds its trainer
TRAINER_ENTRY = f"{TRAINER}.build"  # the trainer room's one door for the ranks


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def test_the_learner_is_three_rooms_and_their_shared_config():
    rooms = {m.split(".")[3] for m in MODULES if _in(m, LEARNER) and m != LEARNER}
    assert rooms == {"trainer", "ranks", "loop", "config"}
    assert {TRAINER_START, TRAINER_ENTRY, f"{LOOP}.service"} <= set(MODULES)


def test_the_trainer_knows_nothing_of_the_ranks_or_the_loop():
    found = [f"{m} imports {t}" for m in MODULES if _in(m, TRAINER) for t in GRAPH[m]
             if _in(t, RANKS) or _in(t, LOOP)]
    assert found == []


def test_the_service_builds_its_trainer_through_the_one_entry_point():
    service = f"{LOOP}.service"
    assert [t for t in GRAPH[service] if _in(t, TRAINER)] == []
    assert TRAINER_START in GRAPH[service]


def test_the_ranks_reach_the_trainer_only_through_the_entry_point():
    found = [f"{m} imports {t}" for m in MODULES if _in(m, RANKS) for t in GRAPH[m]
             if _in(t, TRAINER) and (m, t) != (TRAINER_START, TRAINER_ENTRY)]
    assert found == []


def test_no_learner_file_exceeds_300_lines():
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in sorted((ROOT / "services" / "learner").rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > 300]
    assert long == []
