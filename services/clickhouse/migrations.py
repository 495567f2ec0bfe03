"""Versioned DDL for the archive, applied in order at start-up and recorded in `schema_migrations`.

Append a new version to change a table; never edit an applied one. Every event table is a
ReplacingMergeTree whose sorting key ends in `event_id`, so a re-inserted event collapses into one row;
queries read with FINAL (or dedup by `event_id`) and never double-count. An event published twice
keeps its first log position (`log_rank`).
"""
from __future__ import annotations

from coevolve.services.runtime.log import get_logger

log = get_logger("archive")

# Where the row came from in the log: partition and offset (Avro imports: -1 and the record index).
# log_rank is the ReplacingMergeTree version: the highest rank is the earliest position, so an event
# published twice keeps its first occurrence, which is what replay's lateness rules look at.
_ORIGIN = ("log_partition Int32, log_offset Int64, archived_at DateTime64(3, 'UTC') DEFAULT now64(3), "
           "log_rank UInt64 MATERIALIZED bitNot(bitShiftLeft(toUInt64(log_partition + 1), 44) + toUInt64(log_offset))")
_UTC = "DateTime64(3, 'UTC')"

V1 = [
    f"""CREATE TABLE IF NOT EXISTS {{db}}.trajectories (
        event_id String, run_id LowCardinality(String), step Int64, task_id String,
        task_source LowCardinality(String), rollout_index Int32, group_size Int32, score Float64,
        success Bool, turn_count Int32, policy_version Int64, prompt String, response String,
        prompt_tokens Int32, completion_tokens Int32, produced_at {_UTC},
        action_names Array(LowCardinality(String)), {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, step, task_id, event_id)""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.actions (
        event_id String, run_id LowCardinality(String), step Int64, task_id String, position UInt16,
        name LowCardinality(String), arguments String, observation String, turn Int32, score Float64, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, step, event_id, position)""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.steps (
        event_id String, run_id LowCardinality(String), step Int64, trajectory_count Int32,
        policy_version Int64, train_reward Nullable(Float64), eval_score Nullable(Float64),
        loss Nullable(Float64), duration_seconds Nullable(Float64), produced_at {_UTC}, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, step, event_id)""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.signals (
        event_id String, kind LowCardinality(String), run_id LowCardinality(String), step Int64,
        subject String, task_id Nullable(String), pattern Array(String), success_threshold Float64,
        window Int32, rare_threshold Float64, pattern_length Int32, incomplete Bool,
        attempt_score Nullable(Float64), scores Array(Float64), previous_scores Array(Float64),
        pattern_count Int64, pattern_total Int64, evidence String, produced_at {_UTC}, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, step, kind, event_id)""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.explorations (
        event_id String, run_id LowCardinality(String), step Int64, signal_id Nullable(String),
        signal_kind Nullable(String), task_id String, round Int32, context String,
        tuples Array(Tuple(name String, arguments String, observation String, task_id String)),
        model String, produced_at {_UTC}, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, step, task_id, event_id)""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.tasks (
        event_id String, task_id String, run_id LowCardinality(String), step Int64,
        source LowCardinality(String), verdict LowCardinality(String), reason String, env String,
        instruction_turns Array(String), initial_state String, involved_classes Array(String),
        reference_solution Array(Array(String)), signal_ids Array(String), exploration_ids Array(String),
        validation_score Nullable(Float64), produced_at {_UTC}, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, step, task_id, event_id)""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.deadletters (
        event_id String, source_topic LowCardinality(String), source_partition Nullable(Int32),
        source_offset Nullable(Int64), key Nullable(String), payload String,
        error_type LowCardinality(String), reason String, service LowCardinality(String),
        produced_at {_UTC}, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (source_topic, event_id)""",
]

# The learner's step fields and evaluations, the explorer's strategy, the validator's stages. Rows stored
# before read the new columns at their defaults, the same values Avro resolution gives their events.
V2 = [
    """ALTER TABLE {db}.steps
        ADD COLUMN IF NOT EXISTS pool_size Nullable(Int32) AFTER duration_seconds,
        ADD COLUMN IF NOT EXISTS pool_synthesized Nullable(Int32) AFTER pool_size,
        ADD COLUMN IF NOT EXISTS zero_variance_groups Nullable(Int32) AFTER pool_synthesized,
        ADD COLUMN IF NOT EXISTS resampled_groups Nullable(Int32) AFTER zero_variance_groups,
        ADD COLUMN IF NOT EXISTS tokens_trained Nullable(Int64) AFTER resampled_groups,
        ADD COLUMN IF NOT EXISTS rollout_seconds Nullable(Float64) AFTER tokens_trained,
        ADD COLUMN IF NOT EXISTS scoring_seconds Nullable(Float64) AFTER rollout_seconds,
        ADD COLUMN IF NOT EXISTS training_seconds Nullable(Float64) AFTER scoring_seconds,
        ADD COLUMN IF NOT EXISTS push_seconds Nullable(Float64) AFTER training_seconds,
        ADD COLUMN IF NOT EXISTS publish_seconds Nullable(Float64) AFTER push_seconds,
        ADD COLUMN IF NOT EXISTS blocked_seconds Nullable(Float64) AFTER publish_seconds""",
    """ALTER TABLE {db}.explorations
        ADD COLUMN IF NOT EXISTS strategy LowCardinality(String) DEFAULT 'signal-guided' AFTER model,
        ADD COLUMN IF NOT EXISTS signal_ids Array(String) AFTER strategy""",
    """ALTER TABLE {db}.tasks
        ADD COLUMN IF NOT EXISTS stage LowCardinality(Nullable(String)) AFTER validation_score,
        ADD COLUMN IF NOT EXISTS stages Array(Tuple(stage String, passed Bool, reason String)) AFTER stage,
        ADD COLUMN IF NOT EXISTS seed_task_id Nullable(String) AFTER stages""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.evaluations (
        event_id String, run_id LowCardinality(String), step Int64, policy_version Int64,
        split LowCardinality(String), env LowCardinality(String), task_count Int32, success_rate Float64,
        mean_score Float64, task_ids Array(String), scores Array(Float64), duration_seconds Float64,
        produced_at {_UTC}, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, step, split, event_id)""",
]

# What each step's update took from the loop's own tasks.
V3 = [
    """ALTER TABLE {db}.steps
        ADD COLUMN IF NOT EXISTS synthesized_trained Nullable(Int32) AFTER tokens_trained,
        ADD COLUMN IF NOT EXISTS synthesized_tasks_trained Nullable(Int32) AFTER synthesized_trained""",
]

# The rollout engine's weight updates, and how far behind the policy was what each step trained on.
V4 = [
    """ALTER TABLE {db}.steps
        ADD COLUMN IF NOT EXISTS staleness_max Nullable(Int32) AFTER synthesized_tasks_trained,
        ADD COLUMN IF NOT EXISTS staleness_mean Nullable(Float64) AFTER staleness_max,
        ADD COLUMN IF NOT EXISTS stale_groups Nullable(Int32) AFTER staleness_mean""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.policy_updates (
        event_id String, run_id LowCardinality(String), step Int64, version Int64, backend LowCardinality(String),
        bytes Int64, seconds Float64, servers Int32, servers_behind Int32, produced_at {_UTC}, {_ORIGIN}
    ) ENGINE = ReplacingMergeTree(log_rank) ORDER BY (run_id, version, event_id)""",
]

# StepCompleted's held-out success rate is named for what it is (the ablation's mean score is another figure).
V5 = ["ALTER TABLE {db}.steps RENAME COLUMN IF EXISTS eval_score TO eval_success"]

# The log itself: every record's bytes at its topic, partition and offset under the name of its log (the
# embedded run's id), and the consumer groups' committed positions, so the topics can be put back on an
# empty broker (services/archive/restore.py). The latest position of a group wins.
V6 = [
    f"""CREATE TABLE IF NOT EXISTS {{db}}.log (
        log_id LowCardinality(String), topic LowCardinality(String), partition Int32, offset Int64,
        key Nullable(String), value String, timestamp_ms Int64, headers Array(Tuple(String, String)),
        archived_at {_UTC} DEFAULT now64(3)
    ) ENGINE = ReplacingMergeTree ORDER BY (log_id, topic, partition, offset)""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.log_positions (
        log_id LowCardinality(String), group_id String, topic LowCardinality(String), partition Int32,
        offset Int64, recorded_at {_UTC} DEFAULT now64(3)
    ) ENGINE = ReplacingMergeTree(recorded_at) ORDER BY (log_id, group_id, topic, partition)""",
]

MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "event tables, actions exploded", V1),
    (2, "step pool and timing, exploration strategy, task stages, evaluations", V2),
    (3, "synthesized rollouts and tasks each step trained on", V3),
    (4, "policy updates; the staleness of what each step trained on", V4),
    (5, "steps.eval_score renamed eval_success", V5),
    (6, "the log's records and its consumer groups' positions", V6),
]


def migrate(client, database: str = "coevolve", migrations=MIGRATIONS) -> list[int]:
    """Apply every migration not yet recorded; return the versions applied now. Idempotent: each statement
    is (IF NOT EXISTS), so one interrupted before its version was recorded runs again safely."""
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(f"""CREATE TABLE IF NOT EXISTS {database}.schema_migrations (
        version UInt32, name String, applied_at {_UTC} DEFAULT now64(3)
    ) ENGINE = ReplacingMergeTree ORDER BY version""")
    done = {r[0] for r in client.query(f"SELECT version FROM {database}.schema_migrations FINAL").result_rows}
    applied = []
    for version, name, statements in migrations:
        if version in done:
            continue
        for statement in statements:
            client.command(statement.format(db=database))
        client.insert(f"{database}.schema_migrations", [[version, name]], column_names=["version", "name"])
        applied.append(version)
        log.info("archive.migrated", database=database, version=version, name=name)
    return applied
