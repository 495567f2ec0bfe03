"""After the fact, over the event log and the archive: dead letters, archive import, `replay` (signals
again with any thresholds), `analyze`, and the environment's scoring and task views."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from coevolve.services.cli.common import BootstrapOpt, app, require
from coevolve.services.runtime.config import ConfigError

deadletters_app = typer.Typer(help="Inspect dead letters and replay them after their cause is fixed.",
                              no_args_is_help=True)
app.add_typer(deadletters_app, name="deadletters")


@deadletters_app.command("list")
def deadletters_list(bootstrap: Optional[str] = BootstrapOpt,
                     since: Optional[str] = typer.Option(None, help="Only letters since: 30m, 2h, 7d or an ISO time."),
                     examples: int = typer.Option(3, help="Newest letters shown per service and reason.")) -> None:
    """Count dead letters by service and reason, with the newest of each."""
    from coevolve.services.kafka.deadletters import (
        produced_ms,
        read_letters,
        since_ms,
        summarize,
    )

    try:
        after = since_ms(since) if since else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from None
    summary = summarize(read_letters(require(bootstrap), after), examples)
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

    done = republish(require(bootstrap), reason, service, topic)
    topics = sorted({str(letter["source_topic"]) for letter in done.sent})
    print(f"replayed {len(done.sent)} dead letter(s) of {reason}" + (f" from {service}" if service else "") +
          (f" to {', '.join(topics)}" if topics else ""))
    for letter, why in done.held:
        print(f"held back {letter['event_id']} ({letter['service']}, {letter['source_topic']}): {why}")


def open_archive(url: str, create: bool = False):
    """The archive's client, or a usage error that says what is wrong with --clickhouse."""
    from coevolve.services.clickhouse.client import ArchiveError, connect

    try:
        return connect(url, create=create)
    except ArchiveError as exc:
        raise typer.BadParameter(str(exc), param_hint="--clickhouse") from None


archive_app = typer.Typer(help="The ClickHouse archive: load Avro log files into it, put a kept log back on a "
                          "broker.", no_args_is_help=True)
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
    from coevolve.services.clickhouse.client import chdb_url
    from coevolve.services.clickhouse.urls import redact_url

    url = clickhouse or chdb_url(workdir)
    client = open_archive(url, create=True)
    try:
        counts = import_files(client, input, run_suffix=run_suffix, streamed=not url.startswith("chdb:"))
    except LogFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--input") from None
    finally:
        client.close()
    print(" ".join(f"{name}={n}" for name, n in sorted(counts.items())) + f" into {redact_url(url)}")


@archive_app.command("restore")
def archive_restore(
    log_id: str = typer.Option(..., "--log-id", help="The kept log (archiver.log_id; `coevolve run` keeps its "
                               "embedded broker's log under the run id)."),
    bootstrap: Optional[str] = BootstrapOpt,
    clickhouse: Optional[str] = typer.Option(None, "--clickhouse", envvar="CLICKHOUSE_URL",
                                             help="Archive URL (default: chdb:///<workdir>/clickhouse)."),
    workdir: Path = typer.Option(Path(".coevolve"), help="Work directory of the embedded archive."),
    archiver_group: Optional[str] = typer.Option(None, help="The archiver's consumer group: placed at the "
                                                 "restored ends (it stored all of it)."),
    start_over: Optional[list[str]] = typer.Option(None, "--start-over", help="A consumer group to leave without "
                                                   "positions, to read from the start (repeatable)."),
) -> None:
    """Put a kept log back on an empty broker: every record at its offset, then the groups' positions."""
    from coevolve.services.archive.restore import RestoreError, restore_log
    from coevolve.services.clickhouse.client import chdb_url

    client = open_archive(clickhouse or chdb_url(workdir))
    try:
        done = restore_log(client, "coevolve", log_id, require(bootstrap), archiver_group, start_over or ())
    except RestoreError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-id") from None
    finally:
        client.close()
    print(done.line())


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
    from coevolve.services.clickhouse.client import chdb_url

    client = open_archive(clickhouse or chdb_url(workdir))
    try:
        text, _ = run_analyze(client, workdir / "report", run_ids=run_ids, as_json=as_json)
    finally:
        client.close()
    print(text)


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
    from coevolve.services.envs.hosts import bounded_tool_calls

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
