"""The long-running processes: the broker and its topics, the archiver, the signal worker, the explorer,
the validator and the learner."""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Optional

import typer

from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.cli.common import BootstrapOpt, app, load, require, settings_flags
from coevolve.services.explorer.config import ExplorerSettings
from coevolve.services.learner.config import LearnerSettings
from coevolve.services.runtime.config import ConfigError
from coevolve.services.validator.config import ValidatorSettings
from coevolve.streams.worker.config import StreamsConfig

topics_app = typer.Typer(help="Manage the Kafka topics of the catalog.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")


@app.command()
def broker(port: int = typer.Option(9092, help="Port to listen on, on 127.0.0.1.")) -> None:
    """Run the embedded Tansu broker in the foreground until SIGINT/SIGTERM."""
    from coevolve.services.kafka.embedded import EmbeddedBroker

    stop = False

    def _stop(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    embedded = EmbeddedBroker(port=port).start()
    print(f"bootstrap: {embedded.bootstrap}", flush=True)
    try:
        while not stop and embedded.process is not None and embedded.process.poll() is None:
            time.sleep(0.2)
    finally:
        code = embedded.process.poll() if embedded.process else 0
        embedded.stop()
    if code:
        raise typer.Exit(code)


@topics_app.command("create")
def topics_create(bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Create every missing topic of the catalog (idempotent)."""
    from coevolve.services.kafka.topics import CATALOG, create_topics

    created = create_topics(require(bootstrap))
    for name, topic in CATALOG.items():
        state = "created" if name in created else "exists"
        print(f"{name:24s} {state:8s} partitions={topic.partitions} {topic.configs}")


@app.command()
@settings_flags(ArchiverConfig, "kafka_bootstrap", "clickhouse_url", "workdir", "group_id", "batch_size",
                 "idle_exit_seconds", "metrics_port", "metrics_host", clickhouse_url="--clickhouse",
                 idle_exit_seconds="--idle-exit")
def archiver(flags: dict) -> None:
    """Archive every topic into ClickHouse (tables per event, actions exploded), idempotently; ARCHIVER_<FIELD> too."""
    from coevolve.services.archive.archiver import Archiver
    from coevolve.services.clickhouse.client import ArchiveError
    from coevolve.services.clickhouse.urls import redact_url

    cfg = load(ArchiverConfig, "archiver", flags)
    try:
        service = Archiver(cfg)
    except ArchiveError as exc:
        raise typer.BadParameter(str(exc), param_hint="--clickhouse") from None
    print(f"archived {service.serve_until_signalled()} events into {redact_url(cfg.url)}", flush=True)


streams_app = typer.Typer(help="The Faust stream processors that raise weakness signals.", no_args_is_help=True)
app.add_typer(streams_app, name="streams")


@streams_app.command("worker")
@settings_flags(StreamsConfig, "kafka_bootstrap", "app_id", "metrics_host", "metrics_port", "datadir", "window",
                 "success_threshold", "rare_threshold", "pattern_length", "grace_s")
def streams_worker(flags: dict) -> None:
    """Run one signal-processor worker (start any number; they share the partitions by task); STREAMS_<FIELD> too."""
    from coevolve.streams.worker.command import run_worker

    run_worker(load(StreamsConfig, "streams", flags))


@app.command()
@settings_flags(ExplorerSettings, "kafka_bootstrap", "model", "backend", "base_url", "strategy", "signal_kinds",
                 "signals_per_step", "every_steps", "step_window_s", "step_grace_s", "runs", "calls_per_run",
                 "fallback_tasks", "static_tasks", "run_id", "max_new_tokens", "json_max_new_tokens",
                 "max_runs_per_period", "max_tokens_per_period", "group_id", "idle_exit_seconds", "metrics_port",
                 "metrics_host", step_window_s="--step-window", step_grace_s="--step-grace",
                 idle_exit_seconds="--idle-exit")
def explorer(flags: dict) -> None:
    """Explore the environment where the signals point; publish ExplorationRecorded events.

    Every setting of ExplorerSettings (services/explorer/config.py) is also read from EXPLORER_<FIELD>."""
    from coevolve.services.explorer.service import Explorer

    settings = load(ExplorerSettings, "explorer", flags)
    print(f"explorer committed {Explorer(settings).serve_until_signalled()} events", flush=True)


@app.command()
@settings_flags(ValidatorSettings, "kafka_bootstrap", "model", "backend", "base_url", "rounds_per_group",
                 "group_wait_s", "max_new_tokens", "json_max_new_tokens", "group_id", "idle_exit_seconds",
                 "metrics_port", "metrics_host", group_wait_s="--group-wait", idle_exit_seconds="--idle-exit")
def validator(
    flags: dict,
    no_validation: bool = typer.Option(False, "--no-validation", help="Keep every well-formed task "
                                       "(the paper's ablation; validation=false)."),
) -> None:
    """Abstract explorations into proposed tasks, validate them, publish every verdict as TaskChecked.

    Every setting of ValidatorSettings (services/validator/config.py) is also read from VALIDATOR_<FIELD>."""
    from coevolve.services.validator.service import Validator

    settings = load(ValidatorSettings, "validator", {**flags, "validation": False if no_validation else None})
    print(f"validator committed {Validator(settings).serve_until_signalled()} events", flush=True)


@app.command()
@settings_flags(LearnerSettings, "kafka_bootstrap", "workdir", "run_id", "steps", "model", "backend",
                 "max_new_tokens", "metrics_port", "metrics_host")
def learner(
    flags: dict,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --workdir from its latest checkpoint "
                                "(starts fresh when there is none)."),
    policy_only: bool = typer.Option(False, "--policy-only", help="Print the starting policy's model (the "
                                     "warmed one, trained first if needed) and exit; no broker needed."),
) -> None:
    """Train the agent with GRPO on the seed tasks and the loop's validated tasks; publish every step.

    Every setting of LearnerSettings (services/learner/config.py) is also read from LEARNER_<FIELD>. With
    learner.world_size above 1 it starts that many training ranks under torchrun (services/learner/ranks/launch.py)."""
    from coevolve.services.learner.loop.resume import run_to_continue
    from coevolve.services.learner.loop.service import Learner
    from coevolve.services.learner.ranks.group import Ranks

    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0  # torchrun restarted the group
    settings = load(LearnerSettings, "learner", {**flags, "resume": True if resume or restarted else None})
    ranks = Ranks.from_env()
    if settings.ranks.world_size > 1 and not ranks.many and not policy_only:  # start the ranks (launch.py)
        from coevolve.services.learner.ranks.launch import run_ranks
        from coevolve.services.run.children import coevolve_command

        try:
            run_to_continue(settings.learner)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
        raise typer.Exit(run_ranks(settings.ranks, sys.argv[1:], coevolve_command()))
    if ranks.many and not ranks.driver:  # a training rank that follows rank 0 (ranks/worker.py)
        from coevolve.services.learner.ranks.group import leave
        from coevolve.services.learner.ranks.worker import serve_rank

        serve_rank(settings, ranks)
        leave()
    try:
        service = Learner(settings)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if policy_only:
        print(service.starting_policy(), flush=True)
        return
    service.serve_until_signalled()
    print(f"learner {service.run_id} completed step {service.done} of {settings.learner.steps}", flush=True)
