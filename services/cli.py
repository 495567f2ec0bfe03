"""The `coevolve` command: one Typer app, a subcommand per service or tool."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from coevolve.services.archive.config import ArchiverConfig
from coevolve.services.explorer.config import ExplorerSettings
from coevolve.services.learner.config import LearnerSettings
from coevolve.services.runtime import log as logs
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
    from coevolve.services.runtime.config import fields_doc

    default, text = fields_doc(cls)[name]
    shown = f"{default}" if default not in ("", None) else "empty"
    return typer.Option(None, *decls, help=f"{text} (default: {shown})", show_default=False)


def _load(cls, service: str, overrides: dict):
    """A service's settings from defaults, environment and flags; a bad value is a usage error."""
    from coevolve.services.runtime.config import ConfigError, assemble

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
                       bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Re-publish the original bytes of matching letters to their source topics, each once."""
    from coevolve.services.kafka.deadletters import replay

    sent = replay(_require(bootstrap), reason, service)
    topics = sorted({str(letter["source_topic"]) for letter in sent})
    print(f"replayed {len(sent)} dead letter(s) of {reason}" + (f" from {service}" if service else "") +
          (f" to {', '.join(topics)}" if topics else ""))


@app.command()
def simulate(
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    output: Optional[Path] = typer.Option(None, help="Write an Avro log file instead of publishing "
                                          "(trajectories here, other events beside it)."),
    rate: float = typer.Option(0.0, help="Events per second to publish; 0 publishes as fast as possible."),
    run_id: Optional[str] = _flag(SimulationConfig, "run_id"),
    tasks: Optional[int] = _flag(SimulationConfig, "tasks"),
    steps: Optional[int] = _flag(SimulationConfig, "steps"),
    batch_tasks: Optional[int] = _flag(SimulationConfig, "batch_tasks"),
    group_size: Optional[int] = _flag(SimulationConfig, "group_size", "--group-size", "-k"),
    forget_probability: Optional[float] = _flag(SimulationConfig, "forget_probability"),
    zipf_exponent: Optional[float] = _flag(SimulationConfig, "zipf_exponent"),
    synthesized_per_step: Optional[int] = _flag(SimulationConfig, "synthesized_per_step"),
    validation_pass_rate: Optional[float] = _flag(SimulationConfig, "validation_pass_rate"),
    seed: Optional[int] = _flag(SimulationConfig, "seed"),
) -> None:
    """Publish a simulated run's event stream (trajectories, steps, task verdicts); SIMULATE_<FIELD> too."""
    from coevolve.services.simulate import publish, write_file

    cfg = _load(SimulationConfig, "simulate", dict(
        run_id=run_id, tasks=tasks, steps=steps, batch_tasks=batch_tasks, group_size=group_size,
        forget_probability=forget_probability, zipf_exponent=zipf_exponent,
        synthesized_per_step=synthesized_per_step, validation_pass_rate=validation_pass_rate, seed=seed))
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
    model: Optional[str] = typer.Option(None, help="Model of the learner, explorer and validator alike."),
    settings: Optional[list[str]] = typer.Option(None, "--set", help="Override one preset field: "
                                                 "SECTION.FIELD=VALUE, e.g. --set learner.lr=1e-5 (repeatable)."),
    run_id: Optional[str] = typer.Option(None, help="Run id of a new run (default: run-<UTC time>-<random>)."),
    bootstrap: Optional[str] = BootstrapOpt,
) -> None:
    """Run the co-evolution loop: learner, signal worker, explorer, validator and archiver, then the report."""
    from coevolve.services.run.command import run_loop
    from coevolve.services.run.plan import make_plan
    from coevolve.services.runtime.config import ConfigError

    overrides = list(settings or [])
    if steps is not None:
        overrides.append(f"run.steps={steps}")
    if model is not None:
        overrides += [f"{service}.model={model}" for service in ("learner", "explorer", "validator")]
    try:
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
    preset: str = typer.Option("smoke", help="The preset every arm overlays (smoke, demo, paper, or a YAML file)."),
    arms: str = typer.Option("zero-shot,static,random,coevolve", help="Comma-separated arms: zero-shot, static, "
                             "random, coevolve, forgetting, boundary, rare, no-validation."),
    seeds: int = typer.Option(2, help="Seeds per arm (0..N-1); the interval over seeds needs two or more."),
    workdir: Path = typer.Option(Path(".coevolve-ablation"), help="Where each arm x seed runs "
                                 "(<arm>/seed-<s>/) and ablation.json, ablation.md and ablation.png go."),
    settings: Optional[list[str]] = typer.Option(None, "--set", help="Override one preset field for every arm: "
                                                 "SECTION.FIELD=VALUE (repeatable)."),
) -> None:
    """Run the paper's ablation table: each arm x seed an ordinary run at equal budget; resumable."""
    from coevolve.services.run.ablate import AblationFailed, run_ablation
    from coevolve.services.runtime.config import ConfigError

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
def archiver(
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    clickhouse_url: Optional[str] = _flag(ArchiverConfig, "clickhouse_url", "--clickhouse"),
    workdir: Optional[Path] = _flag(ArchiverConfig, "workdir"),
    group_id: Optional[str] = _flag(ArchiverConfig, "group_id"),
    batch_size: Optional[int] = _flag(ArchiverConfig, "batch_size"),
    idle_exit_seconds: Optional[float] = _flag(ArchiverConfig, "idle_exit_seconds", "--idle-exit"),
    metrics_port: Optional[int] = _flag(ArchiverConfig, "metrics_port"),
    metrics_host: Optional[str] = _flag(ArchiverConfig, "metrics_host"),
) -> None:
    """Archive every topic into ClickHouse (tables per event, actions exploded), idempotently; ARCHIVER_<FIELD> too."""
    flags = dict(locals())
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
        counts = import_files(client, input, run_suffix=run_suffix)
    except LogFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--input") from None
    finally:
        client.close()
    print(" ".join(f"{name}={n}" for name, n in sorted(counts.items())) + f" into {redact_url(url)}")


streams_app = typer.Typer(help="The Faust stream processors that raise weakness signals.", no_args_is_help=True)
app.add_typer(streams_app, name="streams")


@streams_app.command("worker")
def streams_worker(
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    app_id: Optional[str] = _flag(StreamsConfig, "app_id"),
    metrics_host: Optional[str] = _flag(StreamsConfig, "metrics_host"),
    metrics_port: Optional[int] = _flag(StreamsConfig, "metrics_port"),
    datadir: Optional[Path] = _flag(StreamsConfig, "datadir"),
    window: Optional[int] = _flag(StreamsConfig, "window"),
    success_threshold: Optional[float] = _flag(StreamsConfig, "success_threshold"),
    rare_threshold: Optional[float] = _flag(StreamsConfig, "rare_threshold"),
    pattern_length: Optional[int] = _flag(StreamsConfig, "pattern_length"),
    grace_s: Optional[float] = _flag(StreamsConfig, "grace_s"),
) -> None:
    """Run one signal-processor worker (start any number; they share the partitions by task); STREAMS_<FIELD> too."""
    flags = dict(locals())
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
) -> None:
    """Recompute signals from the event log (the archive, --input files, or the topics from offset zero with
    --bootstrap) with any thresholds; print counts and a diff."""
    from coevolve.services.runtime.config import ConfigError
    from coevolve.streams.replay.command import run_replay
    from coevolve.streams.replay.config import ReplayConfig

    try:
        cfg = ReplayConfig.of(os.environ, inputs=tuple(input or ()), bootstrap=bootstrap, clickhouse=clickhouse,
                              window=window, success_threshold=success_threshold, rare_threshold=rare_threshold,
                              pattern_length=pattern_length, engine=engine, decoder=decoder, workers=workers,
                              evidence=evidence, output=output, publish=publish, compare=compare)
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
) -> None:
    """Score call sequences against a task's reference, as BFCL's multi-turn checker would."""
    import json

    from coevolve.services.envs.commands import CommandError, score_batch, score_one

    try:
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
def eval_command(
    env: str = EnvOpt,
    split: str = typer.Option("test", help="Split: test (held out), train or all."),
    model: Optional[str] = typer.Option(None, help="smollm2-135m-instruct (default), tiny-random, a local "
                                        "Hugging Face directory, or the endpoint's model name (openai)."),
    backend: Optional[str] = typer.Option(None, help="vllm (default), transformers or openai."),
    base_url: Optional[str] = typer.Option(None, help="openai: endpoint URL; the key comes from $OPENAI_API_KEY."),
    limit: int = typer.Option(0, help="Evaluate the first N tasks of the split (0: all)."),
    output: Path = typer.Option(Path("results.json"), help="Where to write the per-task results."),
    max_new_tokens: Optional[int] = typer.Option(None, help="New tokens per generation (default 256)."),
    in_flight: Optional[int] = typer.Option(None, help="Episodes run at once (default 16)."),
) -> None:
    """Run greedy episodes on a split and print the paper's metric (BFCL multi-turn accuracy)."""
    from coevolve.services.agent.config import BackendConfig, EpisodeLimits
    from coevolve.services.agent.evaluate import EvalConfig, headline, run_eval
    from coevolve.services.agent.models import ModelError

    backend_cfg = _load(BackendConfig, "agent", {"model": model, "backend": backend, "base_url": base_url})
    eval_cfg = _load(EvalConfig, "eval", {"env": env, "split": split, "limit": limit,
                                          "max_new_tokens": max_new_tokens, "in_flight": in_flight})
    try:
        summary = run_eval(backend_cfg, eval_cfg, _load(EpisodeLimits, "agent", {}), output)
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
def explorer(
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    model: Optional[str] = _flag(ExplorerSettings, "model"),
    backend: Optional[str] = _flag(ExplorerSettings, "backend"),
    base_url: Optional[str] = _flag(ExplorerSettings, "base_url"),
    strategy: Optional[str] = _flag(ExplorerSettings, "strategy"),
    signal_kinds: Optional[str] = _flag(ExplorerSettings, "signal_kinds"),
    signals_per_step: Optional[int] = _flag(ExplorerSettings, "signals_per_step"),
    every_steps: Optional[int] = _flag(ExplorerSettings, "every_steps"),
    step_window_s: Optional[float] = _flag(ExplorerSettings, "step_window_s", "--step-window"),
    step_grace_s: Optional[float] = _flag(ExplorerSettings, "step_grace_s", "--step-grace"),
    runs: Optional[int] = _flag(ExplorerSettings, "runs"),
    calls_per_run: Optional[int] = _flag(ExplorerSettings, "calls_per_run"),
    fallback_tasks: Optional[int] = _flag(ExplorerSettings, "fallback_tasks"),
    static_tasks: Optional[int] = _flag(ExplorerSettings, "static_tasks"),
    run_id: Optional[str] = _flag(ExplorerSettings, "run_id"),
    max_new_tokens: Optional[int] = _flag(ExplorerSettings, "max_new_tokens"),
    json_max_new_tokens: Optional[int] = _flag(ExplorerSettings, "json_max_new_tokens"),
    max_runs_per_period: Optional[int] = _flag(ExplorerSettings, "max_runs_per_period"),
    max_tokens_per_period: Optional[int] = _flag(ExplorerSettings, "max_tokens_per_period"),
    group_id: Optional[str] = _flag(ExplorerSettings, "group_id"),
    idle_exit_seconds: Optional[float] = _flag(ExplorerSettings, "idle_exit_seconds", "--idle-exit"),
    metrics_port: Optional[int] = _flag(ExplorerSettings, "metrics_port"),
    metrics_host: Optional[str] = _flag(ExplorerSettings, "metrics_host"),
) -> None:
    """Explore the environment where the signals point; publish ExplorationRecorded events.

    Every setting of ExplorerSettings (services/explorer/config.py) is also read from EXPLORER_<FIELD>."""
    flags = dict(locals())
    from coevolve.services.explorer.service import Explorer

    settings = _load(ExplorerSettings, "explorer", flags)
    print(f"explorer committed {Explorer(settings).serve_until_signalled()} events", flush=True)


@app.command()
def validator(
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    model: Optional[str] = _flag(ValidatorSettings, "model"),
    backend: Optional[str] = _flag(ValidatorSettings, "backend"),
    base_url: Optional[str] = _flag(ValidatorSettings, "base_url"),
    no_validation: bool = typer.Option(False, "--no-validation", help="Keep every well-formed task "
                                       "(the paper's ablation; validation=false)."),
    rounds_per_group: Optional[int] = _flag(ValidatorSettings, "rounds_per_group"),
    group_wait_s: Optional[float] = _flag(ValidatorSettings, "group_wait_s", "--group-wait"),
    max_new_tokens: Optional[int] = _flag(ValidatorSettings, "max_new_tokens"),
    json_max_new_tokens: Optional[int] = _flag(ValidatorSettings, "json_max_new_tokens"),
    group_id: Optional[str] = _flag(ValidatorSettings, "group_id"),
    idle_exit_seconds: Optional[float] = _flag(ValidatorSettings, "idle_exit_seconds", "--idle-exit"),
    metrics_port: Optional[int] = _flag(ValidatorSettings, "metrics_port"),
    metrics_host: Optional[str] = _flag(ValidatorSettings, "metrics_host"),
) -> None:
    """Abstract explorations into proposed tasks, validate them, publish every verdict as TaskChecked.

    Every setting of ValidatorSettings (services/validator/config.py) is also read from VALIDATOR_<FIELD>."""
    flags = dict(locals())
    from coevolve.services.validator.service import Validator

    flags["validation"] = False if flags.pop("no_validation") else None
    settings = _load(ValidatorSettings, "validator", flags)
    print(f"validator committed {Validator(settings).serve_until_signalled()} events", flush=True)


@app.command()
def learner(
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    workdir: Optional[Path] = _flag(LearnerSettings, "workdir"),
    run_id: Optional[str] = _flag(LearnerSettings, "run_id"),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --workdir from its latest checkpoint "
                                "(starts fresh when there is none)."),
    steps: Optional[int] = _flag(LearnerSettings, "steps"),
    model: Optional[str] = _flag(LearnerSettings, "model"),
    backend: Optional[str] = typer.Option(None, help="Rollout backend: vllm or transformers (default: vllm)."),
    max_new_tokens: Optional[int] = _flag(LearnerSettings, "max_new_tokens"),
    metrics_port: Optional[int] = _flag(LearnerSettings, "metrics_port"),
    metrics_host: Optional[str] = _flag(LearnerSettings, "metrics_host"),
    policy_only: bool = typer.Option(False, "--policy-only", help="Print the starting policy's model (the "
                                     "warmed one, trained first if needed) and exit; no broker needed."),
) -> None:
    """Train the agent with GRPO on the seed tasks and the loop's validated tasks; publish every step.

    Every setting of LearnerSettings (services/learner/config.py) is also read from LEARNER_<FIELD>."""
    flags = dict(locals())
    from coevolve.services.learner.service import Learner
    from coevolve.services.runtime.config import ConfigError

    flags["resume"] = True if flags["resume"] else None
    policy_only = flags.pop("policy_only")
    settings = _load(LearnerSettings, "learner", flags)
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
