"""A run's plan: a preset YAML, flag overrides, and the environment each service process gets.

A preset has one section per process (`run`, `learner`, `streams`, `explorer`, `validator`,
`archiver`). Every key of a service section is a field of one of that service's config dataclasses,
and reaches the process as `<SECTION>_<FIELD>`, the layering every service reads (runtime/config.py).
Keys are checked against the dataclasses before anything starts, so a typo fails in a second, not
after a model has loaded.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from coevolve.services.runtime.config import ConfigError, assemble, doc, owners, parts

# The settings each service process assembles with its section's prefix (runtime/config.assemble).
SERVICE_SETTINGS: dict[str, str] = {
    "learner": "coevolve.services.learner.config:LearnerSettings",
    "streams": "coevolve.streams.worker.config:StreamsConfig",
    "explorer": "coevolve.services.explorer.config:ExplorerSettings",
    "validator": "coevolve.services.validator.config:ValidatorSettings",
    "archiver": "coevolve.services.archive.config:ArchiverConfig",
}
# Processes that can act with the learner's policy (run.shared_policy).
SHARABLE = ("explorer", "validator")
# Seconds each process's /healthz may fail in a row before the run kills and restarts it (run.liveness_s),
# as the k8s tree's liveness probes allow. The explorer's and validator's loops do not beat while a model
# explores or checks (minutes on a CPU); the learner's /healthz fails after 15 minutes without a rollout
# round or a step.
LIVENESS_S = {"streams": 120.0, "archiver": 120.0, "explorer": 1800.0, "validator": 1800.0, "learner": 300.0}
# Set by the run itself for every process; a preset may not override them.
MANAGED = {"kafka_bootstrap", "metrics_port", "metrics_host", "workdir", "datadir", "run_id", "resume", "log_id"}
# Keys a process takes from the learner's section: the explorer explores the learner's seed pool (and, in
# the static arm, as many tasks as the learner waits for), the validator checks novelty against the tasks
# the learner's pool takes in, and a process acting with the learner's policy (run.shared_policy) lists
# the tools as it was trained to.
FROM_LEARNER = {"explorer": ("categories", "seed_tasks", "static_tasks"), "validator": ("inherit_tasks",)}
FROM_SHARED_POLICY = ("tool_docs",)


@dataclass(frozen=True)
class RunSettings:
    """The orchestrator's own settings (the preset's `run` section)."""

    steps: int = doc(3, "Learner steps; also the learner's `steps` (0: evaluate the starting policy, no "
                        "training: the zero-shot arm).")
    start_timeout_s: float = doc(300.0, "Longest wait for every service to report healthy.")
    drain_timeout_s: float = doc(300.0, "After the last step, longest wait for the signal worker, explorer and "
                                        "validator to finish what the run produced.")
    quiet_s: float = doc(5.0, "Drained: nothing new on any topic and every consumer caught up for this long.")
    restart_budget: int = doc(5, "Restarts of one service within run.restart_window_s (as Kubernetes restarts a "
                                 "pod; each resumes from its committed offsets, changelogs or checkpoint); one "
                                 "more exit ends the run with its log; 0 fails on the first exit.")
    restart_window_s: float = doc(600.0, "Seconds over which run.restart_budget counts a service's restarts.")
    restart_backoff_s: float = doc(1.0, "Wait before restarting a service; doubles with each of its restarts "
                                        "within run.restart_window_s.")
    restart_backoff_max_s: float = doc(60.0, "Longest wait before restarting a service.")
    liveness_s: dict[str, float] = doc(dict(LIVENESS_S), "Per service, seconds its /healthz may fail (no answer, "
                                                         "or 503 when its loop stalled) in a row before it is "
                                                         "killed and restarted; over these defaults.")
    shared_policy: str = doc("", "Comma-separated processes (explorer, validator) that act with the learner's "
                                 "starting policy, its warmed model when learner.warmup_steps > 0, instead of "
                                 "a model of their own.")

    @property
    def sharing(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.shared_policy.split(",") if n.strip())

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"run.steps={self.steps} must be 0 (evaluate only) or more")
        unknown = set(self.sharing) - set(SHARABLE)
        if unknown:
            raise ConfigError(f"run.shared_policy names {', '.join(sorted(unknown))}; only "
                              f"{' and '.join(SHARABLE)} can act with the learner's policy")
        if self.restart_budget < 0:
            raise ConfigError(f"run.restart_budget={self.restart_budget} must be 0 or more")
        if min(self.restart_window_s, self.restart_backoff_max_s) <= 0 or self.restart_backoff_s < 0:
            raise ConfigError("run.restart_window_s and restart_backoff_max_s must be positive, "
                              "run.restart_backoff_s 0 or more")
        object.__setattr__(self, "liveness_s", _liveness(self.liveness_s))
        if min(self.start_timeout_s, self.drain_timeout_s, self.quiet_s) <= 0:
            raise ConfigError("run.start_timeout_s, drain_timeout_s and quiet_s must be positive")


def _liveness(values: Any) -> dict[str, float]:
    """run.liveness_s over the defaults, checked."""
    hint = "e.g. --set 'run.liveness_s={explorer: 600}'"
    if not isinstance(values, dict):
        raise ConfigError(f"run.liveness_s={values!r} must map services to seconds, {hint}")
    unknown = set(values) - set(LIVENESS_S)
    if unknown:
        raise ConfigError(f"run.liveness_s names {', '.join(sorted(map(str, unknown)))}; the services are "
                          f"{', '.join(LIVENESS_S)}")
    for name, seconds in values.items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ConfigError(f"run.liveness_s.{name}={seconds!r} must be a positive number of seconds, {hint}")
    return {**LIVENESS_S, **{name: float(seconds) for name, seconds in values.items()}}


@dataclass(frozen=True)
class Plan:
    """What to start, with which settings."""

    preset: str
    run: RunSettings
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def env(self, service: str, **extra: Any) -> dict[str, str]:
        """The `<SERVICE>_<FIELD>` variables of one service process, with `extra` fields over its section."""
        values = {**self.sections.get(service, {}), **extra}
        if service == "learner":
            values["steps"] = self.run.steps
        return {f"{service.upper()}_{key.upper()}": _text(value) for key, value in values.items()}

    def settings(self, service: str) -> Any:
        """What `service`'s process assembles from its environment."""
        return assemble(settings_class(service), service, environ=self.env(service))

    def consumer_group(self, service: str) -> str:
        """The consumer group whose committed offsets are `service`'s progress."""
        settings = self.settings(service)
        found = [getattr(settings, name) for name in parts(type(settings)) if name] or [settings]
        return next(part.group(service) for part in found if hasattr(part, "group"))

    def value(self, service: str, key: str, default: Any = None) -> Any:
        return self.sections.get(service, {}).get(key, default)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__package__).joinpath("presets").iterdir()
                  if p.name.endswith(".yaml"))


def _read(preset: str) -> tuple[str, dict]:
    import yaml

    path = Path(preset)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"preset file {preset!r} does not exist")
        text, name = path.read_text(), path.stem
    else:
        if preset not in preset_names():
            raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(preset_names())} "
                              "or give a YAML file's path")
        text, name = resources.files(__package__).joinpath("presets", f"{preset}.yaml").read_text(), preset
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"preset {preset!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"preset {preset!r} must map section names to mappings of fields")
    return name, data


def settings_class(service: str) -> type:
    """The config or Settings bundle `service` assembles."""
    module, name = SERVICE_SETTINGS[service].split(":")
    return getattr(importlib.import_module(module), name)


def _check(section: str, values: dict[str, Any]) -> None:
    if section == "run":
        known = {f.name for f in dataclasses.fields(RunSettings)}
    elif section in SERVICE_SETTINGS:
        known = set(owners(settings_class(section))) - MANAGED
        for key, why in getattr(settings_class(section), "refused", {}).items():
            if key in values:
                raise ConfigError(f"{section}.{key} is not read: {why}")
    else:
        raise ConfigError(f"unknown section {section!r}; sections are run, {', '.join(SERVICE_SETTINGS)}")
    for key in values:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"{section}.{key} is not a setting of the {section}{hint}; "
                              f"`coevolve {section} --help` lists them")


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.field=value` (value parsed as YAML: 3, 0.5, true, text)."""
    import yaml

    target, sep, raw = text.partition("=")
    section, dot, key = target.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise ConfigError(f"--set {text!r}: write SECTION.FIELD=VALUE, e.g. --set learner.lr=1e-5")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return section, key.strip(), value


def make_plan(preset: str, overrides: list[str] = ()) -> Plan:
    """Read a preset (a name or a YAML path), apply `--set` overrides, check every key."""
    name, data = _read(preset)
    for text in overrides:
        section, key, value = parse_override(text)
        data.setdefault(section, {})[key] = value
    for section, values in data.items():
        _check(section, values)
    try:
        run = RunSettings(**data.pop("run", {}))
    except TypeError as exc:
        raise ConfigError(f"preset {name!r}: {exc}") from None
    for service in run.sharing:
        if "model" in data.get(service, {}):
            raise ConfigError(f"{service}.model and run.shared_policy both choose the {service}'s model; drop "
                              f"one (--set run.shared_policy= gives the {service} its own)")
    inherit(data, run.sharing)
    plan = Plan(preset=name, run=run, sections=data)
    for service in SERVICE_SETTINGS:  # each process would refuse a bad value; refuse it before starting any
        plan.settings(service)
    return plan


def inherit(data: dict[str, dict[str, Any]], sharing: tuple[str, ...]) -> None:
    """Copy the keys other processes take from the learner's section; setting one of them there is refused."""
    learner = data.get("learner", {})
    for service in SERVICE_SETTINGS:
        keys = FROM_LEARNER.get(service, ()) + (FROM_SHARED_POLICY if service in sharing else ())
        for key in keys:
            if key in data.get(service, {}):
                why = "works for the learner's pool" if key in FROM_LEARNER.get(service, ()) else \
                    "acts with the learner's policy (run.shared_policy)"
                raise ConfigError(f"{service}.{key}: the {service} {why}, so it takes learner.{key}; set that "
                                  "instead")
            if key in learner:
                data.setdefault(service, {})[key] = learner[key]
