"""The config surface: every key a preset, `--set` or an environment variable can set reaches one field
that its service's code reads, or is refused with a message naming it."""
import ast
import dataclasses
import importlib.util
import typing
from functools import cache
from pathlib import Path

import pytest

from coevolve.services.agent.config import EvalSettings
from coevolve.services.run.ablate import arm_names, arm_overrides
from coevolve.services.run.plan import SERVICE_SETTINGS, make_plan, preset_names, settings_class
from coevolve.services.runtime.config import ConfigError, assemble, owners, parts
from coevolve.services.simulate import SimulationConfig

PACKAGE = Path(__file__).resolve().parents[2]
# The module each service's process starts from (its command imports it); the learner's command starts the
# ranks (launch), rank 0's service or another rank's worker.
ENTRY = {"learner": ("coevolve.services.learner.loop.service", "coevolve.services.learner.ranks.launch",
                     "coevolve.services.learner.ranks.worker"), "explorer": "coevolve.services.explorer.service",
         "validator": "coevolve.services.validator.service", "archiver": "coevolve.services.archive.archiver",
         "streams": "coevolve.streams.worker.command", "simulate": "coevolve.services.simulate",
         "eval": "coevolve.services.agent.evaluate"}
SURFACES = {**{service: settings_class(service) for service in SERVICE_SETTINGS}, "simulate": SimulationConfig,
            "eval": EvalSettings}


def _source(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # `from package.module import name`: the name is no module
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


@cache
def closure(entry: str) -> frozenset[Path]:
    """The package's files a process imports from `entry`, lazily imported ones included."""
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        path = _source(todo.pop())
        if path is None or path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("coevolve"):
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("coevolve")]
    return frozenset(seen)


@cache
def reads(path: Path) -> frozenset[str]:
    """Attribute names a file reads, outside the validation (`__post_init__`) of its dataclasses."""
    tree = ast.parse(path.read_text())
    checks = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__post_init__"
              for n in ast.walk(f)}
    return frozenset(n.attr for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and id(n) not in checks)


def unread(service: str, keys) -> list[str]:
    entries = ENTRY[service] if isinstance(ENTRY[service], tuple) else (ENTRY[service],)
    files = frozenset().union(*(closure(entry) for entry in entries))
    return [key for key in keys if not any(key in reads(path) for path in files)]


@pytest.mark.parametrize("service", sorted(SURFACES))
def test_every_setting_of_a_service_is_read_by_the_code_its_process_runs(service):
    assert unread(service, owners(SURFACES[service])) == []


@pytest.mark.parametrize("overlay", preset_names() + [f"arm:{arm}" for arm in arm_names()])
def test_every_key_of_each_preset_and_arm_sets_a_setting_its_service_reads(overlay):
    arm = overlay.removeprefix("arm:")
    plan = make_plan(overlay) if arm == overlay else make_plan("smoke", arm_overrides(arm))
    for service, values in plan.sections.items():
        assert set(values) <= set(owners(SURFACES[service])), service
        assert unread(service, values) == [], service


def _candidates(kind: type, default: typing.Any) -> list:
    if kind is bool:
        return [not default]
    if kind is int:
        return [default + 1, 1]
    if kind is float:
        return [default + 0.01, 0.5, 2.0]
    if kind is Path:
        return [Path("surface-test")]
    return ["surface-test", "1"]


def _text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("service", sorted(SURFACES))
def test_each_environment_key_sets_its_one_field_or_is_refused_naming_it(service):
    cls = SURFACES[service]
    base = assemble(cls, service, environ={})
    flat = {name: getattr(part, name) for name, part in
            ((f.name, getattr(base, p) if p else base) for p, kind in parts(cls).items()
             for f in dataclasses.fields(kind))}
    for key, part in owners(cls).items():
        kind = typing.get_type_hints(parts(cls)[part])[key]
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        if typing.get_origin(kind) is not None:  # a mapping (run.liveness_s): set in presets only
            continue
        variable = f"{service.upper()}_{key.upper()}"
        for value in _candidates(kind, flat[key]):
            try:
                built = assemble(cls, service, environ={variable: _text(value)})
            except ConfigError as exc:
                assert key in str(exc), f"{variable}={value!r} is refused without naming {key}: {exc}"
                continue
            got = built if not part else getattr(built, part)
            assert getattr(got, key) == kind(value), variable
            others = {n: getattr(got, n) for n in flat if n in {f.name for f in dataclasses.fields(type(got))}}
            assert {n: v for n, v in others.items() if n != key} == {
                n: flat[n] for n in others if n != key}, f"{variable} changed another field"
            break


def test_the_learner_refuses_the_openai_backends_settings_by_name():
    with pytest.raises(ConfigError, match=r"learner.base_url is not read: the learner updates its own rollout "
                                          r"policy"):
        make_plan("smoke", ["learner.base_url=http://127.0.0.1:8000/v1"])
    with pytest.raises(ConfigError, match=r"learner.max_retries \(LEARNER_MAX_RETRIES\) is not read"):
        assemble(SURFACES["learner"], "learner", environ={"LEARNER_MAX_RETRIES": "2"})


def test_two_parts_declaring_one_key_is_refused():
    from coevolve.services.agent.config import BackendConfig
    from coevolve.services.runtime.config import Settings

    class Twice(Settings):
        one: BackendConfig
        two: BackendConfig

    assert Twice().one == Twice().two == BackendConfig()  # each part defaults to its dataclass's defaults
    with pytest.raises(ConfigError, match="Twice: model is declared by both one and two; one key must set one field"):
        owners(Twice)


def test_the_learner_has_one_seed_and_no_sampling_keys_of_its_own():
    with pytest.raises(ConfigError, match=r"learner.top_p is not a setting of the learner"):
        make_plan("smoke", ["learner.top_p=0.9"])
    settings = assemble(SURFACES["learner"], "learner", environ={"LEARNER_SEED": "7"})
    assert settings.backend.seed == 7 and [p for p, k in owners(SURFACES["learner"]).items() if p == "seed"] == ["seed"]
