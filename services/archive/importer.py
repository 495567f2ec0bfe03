"""`coevolve archive import`: load Avro log files (as `coevolve simulate --output` writes them, or a
backup) into the archive, one SQL pass per file, idempotently.

ClickHouse reads the container files itself; rows get the columns the archiver writes, with
log_partition -1 and the record index as offset. Importing a file again re-inserts the same rows,
which collapse into the stored ones by event_id (ReplacingMergeTree, read with FINAL), as the
archiver's redelivered batches do. `run_suffix` renames runs and event ids, to load one log as
several runs (benchmarks).
"""
from __future__ import annotations

from pathlib import Path

from coevolve.schemas.container import LogFileError, log_paths, record_name
from coevolve.services.clickhouse.sql import literal, quote_path

_TRAJECTORY_COLUMNS = """event_id, run_id, step, task_id, task_source, rollout_index, group_size, score, success,
    turn_count, policy_version, prompt, response, prompt_tokens, completion_tokens, produced_at, action_names"""


def _inserts(db: str, src: str, run: str, eid: str) -> dict[str, list[str]]:
    """Per record type, the INSERT ... SELECT statements that load a file of it."""
    return {
        "TrajectoryRecorded": [
            f"""INSERT INTO {db}.trajectories ({_TRAJECTORY_COLUMNS}, log_partition, log_offset)
            SELECT {eid}, {run}, step, task_id, toString(task_source), rollout_index, group_size, score, success,
                   turn_count, policy_version, prompt, response, prompt_tokens, completion_tokens, produced_at,
                   actions.name, -1, _row_number FROM {src}""",
            f"""INSERT INTO {db}.actions (event_id, run_id, step, task_id, position, name, arguments, observation,
                turn, score, log_partition, log_offset)
            SELECT {eid}, {run}, step, task_id, i - 1, a.name, a.arguments, a.observation, a.turn, score, -1,
                   _row_number FROM {src} ARRAY JOIN actions AS a, arrayEnumerate(actions) AS i"""],
        "StepCompleted": [
            f"""INSERT INTO {db}.steps (event_id, run_id, step, trajectory_count, policy_version, train_reward,
                eval_score, loss, duration_seconds, produced_at, log_partition, log_offset)
            SELECT {eid}, {run}, step, trajectory_count, policy_version, train_reward, eval_score, loss,
                   duration_seconds, produced_at, -1, _row_number FROM {src}"""],
        "TaskChecked": [
            f"""INSERT INTO {db}.tasks (event_id, task_id, run_id, step, source, verdict, reason, env,
                instruction_turns, initial_state, involved_classes, reference_solution, signal_ids, exploration_ids,
                validation_score, produced_at, log_partition, log_offset)
            SELECT {eid}, task_id, {run}, step, toString(source), toString(verdict), reason, env, instruction_turns,
                   initial_state, involved_classes, reference_solution, signal_ids, exploration_ids,
                   validation_score, produced_at, -1, _row_number FROM {src}"""],
    }


def log_files(paths) -> list[Path]:
    """The given files and the other event files written beside a log's trajectory file, each once."""
    out: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise LogFileError(f"{path}: no such file")
        siblings = log_paths(path).values() if path.name.endswith(".avro") else ()
        for p in (path, *sorted(s for s in siblings if s.exists())):
            if p not in out:
                out.append(p)
    return out


def import_files(client, paths, database: str = "coevolve", run_suffix: str = "") -> dict[str, int]:
    """Insert every event of the given log files (their sibling event files included); return the
    events read per record type. Raise LogFileError for a file that is not an importable event log."""
    counts: dict[str, int] = {}
    suffix = literal(run_suffix)
    run, eid = f"concat(run_id, {suffix})", f"concat(event_id, {suffix})"
    for path in log_files(paths):
        name = record_name(path)
        src = f"file({quote_path(path)}, 'Avro')"
        statements = _inserts(database, src, run, eid).get(name)
        if statements is None:
            raise LogFileError(f"{path}: {name} files cannot be imported (TrajectoryRecorded, StepCompleted and "
                               "TaskChecked can)")
        for statement in statements:
            client.command(statement)
        counts[name] = counts.get(name, 0) + int(client.query(f"SELECT count() FROM {src}").result_rows[0][0])
    return counts
