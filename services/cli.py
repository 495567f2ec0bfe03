"""The `coevolve` command: one Typer app, a subcommand per service or tool."""
from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
import time
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from coevolve.services.agent.config import EvalSettings
from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.explorer.config import ExplorerSettings
from coevolve.services.learner.config import LearnerSettings
from coevolve.services.runtime import log as logs
from coevolve.services.runtime.config import ConfigError, assemble, fields_doc, owners, parts
from coevolve.services.simulate import SimulationConfig
from coevolve.services.validator.config import ValidatorSettings
from coevolve.streams.worker.config import StreamsConfig

app = typer.Typer(help="CoEvolve: train LLM agents whose training data evolves with them.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
topics_app = typer.Typer(help="Manage the Kafka topics of the catalog.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")

BootstrapOpt = typer.Option(None, "--bootstrap", help="Kafka bootstrap address HOST:PORT. A service reads "
                            "$<SERVICE>_KAFKA_BOOTSTRAP, then $KAFKA_BOOTSTRAP, without it; a tool $KAFKA_BOOTSTRAP; "
                            "run and check start an embedded broker.")


def _flag(cls: type, name: str, *decls: str) -> Any:
    """A flag that overrides one setting of `cls` (a config or a Settings bundle); its help is the field's."""
    default, text = fields_doc(cls)[name]
    shown = f"{default}" if default not in ("", None) else "empty"
    return typer.Option(None, *decls, help=f"{text} (default: {shown})", show_default=False)


def _settings_flags(cls: type, *names: str, **decls: str | tuple[str, ...]) -> Callable:
    """Give a command one flag per named setting of `cls` (its type, help and default from the dataclass,
    its name --the-field unless `decls` names it); the command receives them as `flags`, by field name."""
    hints = {name: typing.get_type_hints(parts(cls)[part])[name] for name, part in owners(cls).items()}

    def option(name: str) -> Any:
        if name == "kafka_bootstrap":
            return BootstrapOpt
        names = decls.get(name, ())
        return _flag(cls, name, *((names,) if isinstance(names, str) else names))

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


def _load(cls, service: str, overrides: dict):
    """A service's settings from defaults, environment and flags; a bad value is a usage error."""
    try:
        return assemble(cls, service, {k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.callback()
def _root(log_level: str = typer.Option("info", help="Log level: debug, info, warning or error.")) -> None:
    logs.configure(log_level)


def _require(bootstrap: Optional[str]) -> str:
    """A tool's broker: --bootstrap, then $KAFKA_BOOTSTRAP."""
    bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise typer.BadParameter("no broker address: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP "
                                 "(start one with `coevolve broker`)", param_hint="--bootstrap")
    return bootstrap


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

    created = create_topics(_require(bootstrap))
    for name, topic in CATALOG.items():
        state = "created" if name in created else "exists"
        print(f"{name:24s} {state:8s} partitions={topic.partitions} {topic.configs}")


deadletters_app = typer.Typer(help="Inspect dead letters and replay them after their cause is fixed.",
                              no_args_is_help=True)
app.add_typer(deadletters_app, name="deadletters")


@deadletters_app.command("list")
def deadletters_list(bootstrap: Optional[str] = BootstrapOpt,
                     since: Optional[str] = typer.Option(None, help="Only letters since: 30m, 2h, 7d or an ISO time."),
                     examples: int = typer.Option(3, help="Newest letters shown per service and reason.")) -> None:
    """Count dead letters by service and reason, with the newest of each."""
    from coevolve.services.kafka.deadletters import produced_ms, read_letters, since_ms, summarize

    try:
        after = since_ms(since) if since else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from None
    summary = summarize(read_letters(_require(bootstrap), after), examples)
    if not summary.counts:
        print("no dead letters" + (f" since {since}" if since else ""))
    for (service, reason), count in summary.counts.most_common():
        print(f"{count:6d}  {service}  {reason}")
        for letter in summary.newest[(service, reason)]:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(produced_ms(letter) / 1000))
            where = f"{letter['source_topic']}:{letter['source_partition']}@{letter['source_offset']}"
            print(f"        {at}  {where}  {letter['event_id']}  {str(letter['reason'])[:160]}")


@deadletters_app.command("replay")
def deadletters_replay(reason: str = typer.Option(..., "--reason", help="The error type to replay (as listed)."),
                       service: Optional[str] = typer.Option(None, help="Only letters from this service."),
                       topic: Optional[str] = typer.Option(None, help="Only letters of this source topic; "
                                                           "coevolve.tasks is replayed only when named here."),
                       bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Re-publish the original bytes of matching letters to their source topics, each once; a letter whose
    payload does not belong on its topic is held back with the reason."""
    from coevolve.services.kafka.deadletters import republish

    done = republish(_require(bootstrap), reason, service, topic)
    topics = sorted({str(letter["source_topic"]) for letter in done.sent})
    print(f"replayed {len(done.sent)} dead letter(s) of {reason}" + (f" from {service}" if service else "") +
          (f" to {', '.join(topics)}" if topics else ""))
    for letter, why in done.held:
        print(f"held back {letter['event_id']} ({letter['service']}, {letter['source_topic']}): {why}")


@app.command()
@_settings_flags(SimulationConfig, "run_id", "tasks", "steps", "batch_tasks", "group_size", "forget_probability",
                 "zipf_exponent", "synthesized_per_step", "validation_pass_rate", "seed",
                 group_size=("--group-size", "-k"))
def simulate(
    flags: dict,
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    output: Optional[Path] = typer.Option(None, help="Write an Avro log file instead of publishing "
                                          "(trajectories here, other events beside it)."),
    rate: float = typer.Option(0.0, help="Events per second to publish; 0 publishes as fast as possible."),
) -> None:
    """Publish a simulated run's event stream (trajectories, steps, task verdicts); SIMULATE_<FIELD> too."""
    from coevolve.services.simulate import publish, write_file

    cfg = _load(SimulationConfig, "simulate", flags)
    if output is not None:
        counts, files = write_file(cfg, output)
        for path in files:
            print(f"wrote {path}")
    else:
        counts = publish(cfg, _require(kafka_bootstrap), rate)
    print(" ".join(f"{name}={n}" for name, n in sorted(counts.items())))


@app.command()
def run(
    preset: str = typer.Option("demo", help="smoke (CI size, tiny-random), demo (SmolLM2, the default), paper "
                               "(a GPU cluster's settings), or a YAML file of the same shape."),
    workdir: Path = typer.Option(Path(".coevolve"), help="Where the run keeps logs, checkpoints, archive, "
                                 "report and summary.json."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --workdir from its last checkpoint."),
    steps: Optional[int] = typer.Option(None, help="Training steps (the preset's run.steps)."),
    model: Optional[str] = typer.Option(None, help="Model of the learner, and of the explorer and validator "
                                        "unless they act with the learner's policy (run.shared_policy)."),
    settings: Optional[list[str]] = typer.Option(None, "--set", help="Override one preset field: "
                                                 "SECTION.FIELD=VALUE, e.g. --set learner.lr=1e-5 (repeatable)."),
    run_id: Optional[str] = typer.Option(None, help="Run id of a new run (default: run-<UTC time>-<random>)."),
    bootstrap: Optional[str] = BootstrapOpt,
) -> None:
    """Run the co-evolution loop: learner, signal worker, explorer, validator and archiver, then the report."""
    from coevolve.services.run.command import run_loop
    from coevolve.services.run.plan import make_plan

    overrides = list(settings or [])
    if steps is not None:
        overrides.append(f"run.steps={steps}")
    try:
        if model is not None:  # a process acting with the learner's policy (run.shared_policy) takes its model
            sharing = make_plan(preset, overrides).run.sharing
            overrides += [f"{service}.model={model}" for service in ("learner", "explorer", "validator")
                          if service not in sharing]
        plan = make_plan(preset, overrides)
        summary = run_loop(plan, workdir, bootstrap=bootstrap, resume=resume, run_id=run_id)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if summary["state"] in ("interrupted", "killed"):
        raise typer.Exit(130)
    if summary["state"] != "completed":
        raise typer.Exit(1)


@app.command()
def ablate(
    preset: str = typer.Option("smoke", help="The preset every arm overlays (smoke, demo, study, paper, or a YAML file)."),
    arms: str = typer.Option("zero-shot,static,random,coevolve", help="Comma-separated arms: zero-shot, static, "
                             "random, coevolve, forgetting, boundary, rare, no-validation."),
    seeds: int = typer.Option(2, help="Seeds per arm (0..N-1); arms pair by (seed, held-out task)."),
    workdir: Path = typer.Option(Path(".coevolve-ablation"), help="Where each arm x seed runs "
                                 "(<arm>/seed-<s>/) and ablation.json, ablation.md and ablation.png go."),
    settings: Optional[list[str]] = typer.Option(None, "--set", help="Override one preset field for every arm: "
                                                 "SECTION.FIELD=VALUE (repeatable)."),
) -> None:
    """Run the paper's ablation table: each arm x seed an ordinary run at equal budget; resumable."""
    from coevolve.services.run.ablate import AblationFailed, run_ablation

    try:
        run_ablation(preset, [a.strip() for a in arms.split(",") if a.strip()], seeds, workdir, list(settings or []))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    except AblationFailed as exc:
        print(f"ablation stopped: {exc}", flush=True)
        raise typer.Exit(1) from None


@app.command()
def check(
    workdir: Path = typer.Option(Path(".coevolve-check"), help="Where the check keeps its archive and report."),
    steps: int = typer.Option(12, help="Simulated training steps."),
    bootstrap: Optional[str] = BootstrapOpt,
) -> None:
    """Check the data plane on a simulated workload: live signals equal `coevolve replay`'s, then archive."""
    from coevolve.services.pipeline import run_pipeline

    summary = run_pipeline(workdir, steps, bootstrap=bootstrap)
    if not summary.signals_agree:
        print(f"live signals differ from replay; the worker's log is {workdir / 'streams-worker.log'}",
              file=sys.stderr)
        raise typer.Exit(1)


@app.command()
@_settings_flags(ArchiverConfig, "kafka_bootstrap", "clickhouse_url", "workdir", "group_id", "batch_size",
                 "idle_exit_seconds", "metrics_port", "metrics_host", clickhouse_url="--clickhouse",
                 idle_exit_seconds="--idle-exit")
def archiver(flags: dict) -> None:
    """Archive every topic into ClickHouse (tables per event, actions exploded), idempotently; ARCHIVER_<FIELD> too."""
    from coevolve.services.archive.archiver import Archiver
    from coevolve.services.clickhouse.client import ArchiveError
    from coevolve.services.clickhouse.urls import redact_url

    cfg = _load(ArchiverConfig, "archiver", flags)
    try:
        service = Archiver(cfg)
    except ArchiveError as exc:
        raise typer.BadParameter(str(exc), param_hint="--clickhouse") from None
    print(f"archived {service.serve_until_signalled()} events into {redact_url(cfg.url)}", flush=True)


archive_app = typer.Typer(help="The ClickHouse archive: load Avro log files into it.", no_args_is_help=True)
app.add_typer(archive_app, name="archive")


@archive_app.command("import")
def archive_import(
    clickhouse: Optional[str] = typer.Option(None, "--clickhouse", envvar="CLICKHOUSE_URL",
                                             help="Archive URL: chdb:///abs/dir or a server URL "
                                             "(default: chdb:///<workdir>/clickhouse)."),
    input: list[Path] = typer.Option(..., "--input", help="Avro log file(s), as `coevolve simulate --output` "
                                     "writes them (a run.avro's other event files beside it are added)."),
    workdir: Path = typer.Option(Path(".coevolve"), help="Work directory of the embedded archive."),
    run_suffix: str = typer.Option("", help="Append this to every run id and event id (load a log as a new run)."),
) -> None:
    """Load Avro log files into the archive; importing a file again changes nothing."""
    from coevolve.schemas.container import LogFileError
    from coevolve.services.archive.importer import import_files
    from coevolve.services.clickhouse.client import ArchiveError, chdb_url, connect
    from coevolve.services.clickhouse.urls import redact_url

    url = clickhouse or chdb_url(workdir)
    try:
        client = connect(url)
    except ArchiveError as exc:
        raise typer.BadParameter(str(exc), param_hint="--clickhouse") from None
    try:
        counts = import_files(client, input, run_suffix=run_suffix, streamed=not url.startswith("chdb:"))
    except LogFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--input") from None
    finally:
        client.close()
    print(" ".join(f"{name}={n}" for name, n in sorted(counts.items())) + f" into {redact_url(url)}")


streams_app = typer.Typer(help="The Faust stream processors that raise weakness signals.", no_args_is_help=True)
app.add_typer(streams_app, name="streams")


@streams_app.command("worker")
@_settings_flags(StreamsConfig, "kafka_bootstrap", "app_id", "metrics_host", "metrics_port", "datadir", "window",
                 "success_threshold", "rare_threshold", "pattern_length", "grace_s")
def streams_worker(flags: dict) -> None:
    """Run one signal-processor worker (start any number; they share the partitions by task); STREAMS_<FIELD> too."""
    from coevolve.streams.worker.command import run_worker

    run_worker(_load(StreamsConfig, "streams", flags))


@app.command()
def replay(
    input: Optional[list[Path]] = typer.Option(None, "--input", help="Avro log file(s): trajectories and "
                                               "completed steps (a run.avro's step file is added)."),
    bootstrap: Optional[str] = BootstrapOpt,
    window: Optional[int] = typer.Option(None, help="W: previous attempts forgetting looks back on (5)."),
    success_threshold: Optional[float] = typer.Option(None, help="tau: an attempt or rollout succeeds at >= tau "
                                                      "(0.5)."),
    rare_threshold: Optional[float] = typer.Option(None, help="theta, percent: rare when 0 < c_p/N < theta/100 (5)."),
    pattern_length: Optional[int] = typer.Option(None, help="n: consecutive action names per pattern (1)."),
    output: Optional[Path] = typer.Option(None, help="Write the signals here as JSON lines."),
    publish: Optional[str] = typer.Option(None, help="Send the signals to this topic (needs --bootstrap)."),
    compare: Optional[str] = typer.Option(None, help="Diff against a signal JSON-lines file, or a topic."),
    decoder: Optional[str] = typer.Option(None, help="Decoder of --input files for the python engine: chdb "
                                          "(ClickHouse reads them; the default) or fastavro."),
    workers: Optional[int] = typer.Option(None, help="fastavro decoding processes for --input (2 pays off only "
                                          "where decoding dominates pickling)."),
    evidence: bool = typer.Option(True, "--evidence/--no-evidence", help="Write each signal's evidence into "
                                  "--output; without it, the SQL engine formats the lines in ClickHouse (fastest)."),
    engine: Optional[str] = typer.Option(None, help="python (the reference; the default) or sql (ClickHouse; "
                                         "same signals)."),
    clickhouse: Optional[str] = typer.Option(None, "--clickhouse", help="Replay from the archive at this URL "
                                             "(chdb:///dir or a server URL) with the SQL engine (default, "
                                             "without --input or --bootstrap: $REPLAY_CLICKHOUSE_URL, then "
                                             "$CLICKHOUSE_URL)."),
    sweep: Optional[list[str]] = typer.Option(None, "--sweep", help="FIELD=V1,V2,... (repeat per field: "
                                              "streams.success_threshold, window, rare_threshold, pattern_length): "
                                              "signal counts of every set of the product, in one SQL pass; with "
                                              "--output, every set's signals, each line with its thresholds."),
    against_run: Optional[str] = typer.Option(None, "--against-run", help="RUN_ID in the archive: which live "
                                              "signals this set would drop or add, and the explorations, tasks "
                                              "and trained-on steps that descend from the dropped."),
    report: Optional[Path] = typer.Option(None, help="Directory for --sweep's table, JSON lines and heatmaps, or "
                                          "--against-run's tables."),
) -> None:
    """Recompute signals from the event log (the archive, --input files, or the topics from offset zero with
    --bootstrap) with any thresholds; print counts and a diff, sweep many sets, or weigh one against a run."""
    from coevolve.streams.replay.command import run_replay
    from coevolve.streams.replay.config import ReplayConfig

    try:
        cfg = ReplayConfig.of(os.environ, inputs=tuple(input or ()), bootstrap=bootstrap, clickhouse=clickhouse,
                              window=window, success_threshold=success_threshold, rare_threshold=rare_threshold,
                              pattern_length=pattern_length, engine=engine, decoder=decoder, workers=workers,
                              evidence=evidence, output=output, publish=publish, compare=compare,
                              sweep=tuple(sweep or ()), against_run=against_run, report=report)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        print(run_replay(cfg))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


env_app = typer.Typer(help="Environments: score call sequences, show tasks.", no_args_is_help=True)
app.add_typer(env_app, name="env")
EnvOpt = typer.Option("bfcl", "--env", help="Environment (today: bfcl).")


@env_app.command("score")
def env_score(
    env: str = EnvOpt,
    task_id: Optional[str] = typer.Option(None, "--task-id", help="Task to score, e.g. multi_turn_base_0."),
    calls: Optional[Path] = typer.Option(None, help="JSON list of turns, each a list of call strings."),
    batch: Optional[Path] = typer.Option(None, help='JSON lines {"task_id", "calls"} to score in order.'),
    output: Optional[Path] = typer.Option(None, help="With --batch: write results here, not to stdout."),
    call_limit_s: float = typer.Option(10.0, help="Seconds one call may run (in a tool host of its own); past "
                                       "it the call fails with no effect and scoring goes on."),
) -> None:
    """Score call sequences against a task's reference, as BFCL's multi-turn checker would."""
    import json

    from coevolve.services.agent.config import EpisodeLimits
    from coevolve.services.envs.commands import CommandError, score_batch, score_one
    from coevolve.services.envs.host import bounded_tool_calls

    if call_limit_s <= 0:
        raise typer.BadParameter("--call-limit-s must be positive: the calls scored are not this command's own")
    try:
        with bounded_tool_calls(EpisodeLimits(call_limit_s=call_limit_s)):
            if batch is not None and task_id is None and calls is None:
                if output is None:
                    score_batch(env, batch, sys.stdout)
                else:
                    with output.open("w", encoding="utf-8") as out:
                        score_batch(env, batch, out)
            elif batch is None and task_id is not None and calls is not None:
                print(json.dumps(score_one(env, task_id, calls)))
            else:
                raise CommandError("give --task-id ID --calls FILE, or --batch IN.jsonl [--output OUT.jsonl]")
    except CommandError as exc:
        raise typer.BadParameter(str(exc)) from None


@env_app.command("show")
def env_show(env: str = EnvOpt, task_id: str = typer.Option(..., "--task-id", help="Task to show."),
             as_json: bool = typer.Option(False, "--json", help="Print the task as one JSON object.")) -> None:
    """Print a task: its turns, tools, initial state and reference calls."""
    import json

    from coevolve.services.envs.commands import CommandError, describe, describe_json

    try:
        print(json.dumps(describe_json(env, task_id)) if as_json else describe(env, task_id))
    except CommandError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command("eval")
@_settings_flags(EvalSettings, "env", "split", "model", "backend", "base_url", "limit", "max_new_tokens",
                 "in_flight")
def eval_command(
    flags: dict,
    output: Path = typer.Option(Path("results.json"), help="Where to write the per-task results."),
) -> None:
    """Run greedy episodes on a split and print the paper's metric (BFCL multi-turn accuracy).

    Every setting of EvalSettings (services/agent/config.py) is also read from EVAL_<FIELD>."""
    from coevolve.services.agent.evaluate import headline, run_eval
    from coevolve.services.agent.models import ModelError

    settings = _load(EvalSettings, "eval", flags)
    try:
        summary = run_eval(settings.backend, settings.eval, settings.limits, output)
    except ModelError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    print(headline(summary))


@app.command()
def analyze(
    clickhouse: Optional[str] = typer.Option(None, "--clickhouse", envvar="CLICKHOUSE_URL",
                                             help="Archive URL (default: chdb:///<workdir>/clickhouse)."),
    workdir: Path = typer.Option(Path(".coevolve"), help="Work directory; plots go to <workdir>/report/."),
    run_ids: Optional[list[str]] = typer.Option(None, "--run", help="Run to analyze; repeat to compare runs "
                                                "(default: every archived run)."),
    as_json: bool = typer.Option(False, "--json", help="Print the numbers as JSON instead of tables."),
) -> None:
    """Training-dynamics tables and plots (signals, validation, turns, reward, forgetting, rare calls)."""
    from coevolve.services.analytics.report import run_analyze
    from coevolve.services.clickhouse.client import ArchiveError, chdb_url, connect

    try:
        client = connect(clickhouse or chdb_url(workdir), create=False)
    except ArchiveError as exc:
        raise typer.BadParameter(str(exc), param_hint="--clickhouse") from None
    try:
        text, _ = run_analyze(client, workdir / "report", run_ids=run_ids, as_json=as_json)
    finally:
        client.close()
    print(text)


@app.command()
@_settings_flags(ExplorerSettings, "kafka_bootstrap", "model", "backend", "base_url", "strategy", "signal_kinds",
                 "signals_per_step", "every_steps", "step_window_s", "step_grace_s", "runs", "calls_per_run",
                 "fallback_tasks", "static_tasks", "run_id", "max_new_tokens", "json_max_new_tokens",
                 "max_runs_per_period", "max_tokens_per_period", "group_id", "idle_exit_seconds", "metrics_port",
                 "metrics_host", step_window_s="--step-window", step_grace_s="--step-grace",
                 idle_exit_seconds="--idle-exit")
def explorer(flags: dict) -> None:
    """Explore the environment where the signals point; publish ExplorationRecorded events.

    Every setting of ExplorerSettings (services/explorer/config.py) is also read from EXPLORER_<FIELD>."""
    from coevolve.services.explorer.service import Explorer

    settings = _load(ExplorerSettings, "explorer", flags)
    print(f"explorer committed {Explorer(settings).serve_until_signalled()} events", flush=True)


@app.command()
@_settings_flags(ValidatorSettings, "kafka_bootstrap", "model", "backend", "base_url", "rounds_per_group",
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

    settings = _load(ValidatorSettings, "validator", {**flags, "validation": False if no_validation else None})
    print(f"validator committed {Validator(settings).serve_until_signalled()} events", flush=True)


@app.command()
@_settings_flags(LearnerSettings, "kafka_bootstrap", "workdir", "run_id", "steps", "model", "backend",
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
    from coevolve.services.learner.ranks.group import Ranks
    from coevolve.services.learner.loop.resume import run_to_continue
    from coevolve.services.learner.loop.service import Learner

    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0  # torchrun restarted the group
    settings = _load(LearnerSettings, "learner", {**flags, "resume": True if resume or restarted else None})
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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
