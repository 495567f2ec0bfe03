"""Load Avro log files (as `coevolve simulate --output` writes them) into the archive in one SQL pass each.

ClickHouse reads the container files itself; rows get the same columns the archiver writes, with
log_partition -1 and the record index as offset. `run_suffix` renames runs, to load one log several
times (benchmarks).
"""
from __future__ import annotations

from pathlib import Path

from coevolve.schemas.container import log_paths
from coevolve.services.archive.sqlreplay import _quote


def import_log(client, path: Path | str, database: str = "coevolve", run_suffix: str = "") -> dict[str, int]:
    """Insert the trajectories (actions exploded), completed steps and task verdicts of a log."""
    files = log_paths(path)
    db, run = database, f"concat(run_id, '{run_suffix}')"
    counts: dict[str, int] = {}
    traj = files["TrajectoryRecorded"]
    if traj.exists():
        src = f"file({_quote(traj)}, 'Avro')"
        client.command(f"""INSERT INTO {db}.trajectories (event_id, run_id, step, task_id, task_source,
            rollout_index, group_size, score, success, turn_count, policy_version, prompt, response, prompt_tokens,
            completion_tokens, produced_at, action_names, log_partition, log_offset)
            SELECT concat(event_id, '{run_suffix}'), {run}, step, task_id, toString(task_source), rollout_index,
                   group_size, score, success, turn_count, policy_version, prompt, response, prompt_tokens,
                   completion_tokens, produced_at, actions.name, -1, _row_number FROM {src}""")
        client.command(f"""INSERT INTO {db}.actions (event_id, run_id, step, task_id, position, name, arguments,
            observation, turn, score, log_partition, log_offset)
            SELECT concat(event_id, '{run_suffix}'), {run}, step, task_id, i - 1, a.name, a.arguments,
                   a.observation, a.turn, score, -1, _row_number
            FROM {src} ARRAY JOIN actions AS a, arrayEnumerate(actions) AS i""")
        counts["TrajectoryRecorded"] = client.query(f"SELECT count() FROM {src}").result_rows[0][0]
    steps = files["StepCompleted"]
    if steps.exists():
        client.command(f"""INSERT INTO {db}.steps (event_id, run_id, step, trajectory_count, policy_version,
            train_reward, eval_score, loss, duration_seconds, produced_at, log_partition, log_offset)
            SELECT concat(event_id, '{run_suffix}'), {run}, step, trajectory_count, policy_version, train_reward,
                   eval_score, loss, duration_seconds, produced_at, -1, _row_number FROM file({_quote(steps)}, 'Avro')""")
        counts["StepCompleted"] = client.query(f"SELECT count() FROM file({_quote(steps)}, 'Avro')").result_rows[0][0]
    tasks = files["TaskChecked"]
    if tasks.exists():
        client.command(f"""INSERT INTO {db}.tasks (event_id, task_id, run_id, step, source, verdict, reason, env,
            instruction_turns, initial_state, involved_classes, reference_solution, signal_ids, exploration_ids,
            validation_score, produced_at, log_partition, log_offset)
            SELECT concat(event_id, '{run_suffix}'), task_id, {run}, step, toString(source), toString(verdict), reason,
                   env, instruction_turns, initial_state, involved_classes, reference_solution, signal_ids,
                   exploration_ids, validation_score, produced_at, -1, _row_number FROM file({_quote(tasks)}, 'Avro')""")
        counts["TaskChecked"] = client.query(f"SELECT count() FROM file({_quote(tasks)}, 'Avro')").result_rows[0][0]
    return counts
