"""One valid event of every type, for round-trip tests."""
from __future__ import annotations

import uuid

NOW = 1_795_000_000_000


def sample_events() -> dict[str, dict]:
    """A valid record for every schema in schemas/, keyed by record name."""
    def eid() -> str:
        return str(uuid.uuid4())

    action = {"name": "cd", "arguments": '{"folder": "document"}', "observation": "ok", "turn": 0}
    return {
        "TrajectoryRecorded": {
            "event_id": eid(), "run_id": "r1", "step": 3, "task_id": "multi_turn_base_7",
            "task_source": "seed", "rollout_index": 1, "group_size": 8, "score": 0.5, "success": False,
            "actions": [action, {**action, "name": "ls", "arguments": "{}", "turn": 1}], "turn_count": 2,
            "policy_version": 3, "prompt": "p", "response": "[cd(folder='document')]",
            "prompt_tokens": 100, "completion_tokens": 12, "produced_at": NOW,
        },
        "StepCompleted": {
            "event_id": eid(), "run_id": "r1", "step": 3, "trajectory_count": 64, "policy_version": 3,
            "train_reward": 0.41, "eval_success": None, "loss": 0.12, "duration_seconds": 7.5,
            "pool_size": 120, "pool_synthesized": 7, "zero_variance_groups": 5, "resampled_groups": 2,
            "tokens_trained": 9000, "synthesized_trained": 4, "synthesized_tasks_trained": 1,
            "staleness_max": 1, "staleness_mean": 0.5, "stale_groups": 0,
            "rollout_seconds": 4.0, "scoring_seconds": 0.1, "training_seconds": 3.0,
            "push_seconds": 0.3, "publish_seconds": 0.05, "blocked_seconds": 0.001, "produced_at": NOW,
        },
        "SignalRaised": {
            "event_id": eid(), "kind": "rare", "run_id": "r1", "step": 3, "subject": "mv",
            "task_id": None, "pattern": ["mv"],
            "thresholds": {"success_threshold": 0.5, "window": 5, "rare_threshold": 5.0, "pattern_length": 1},
            "incomplete": False,
            "evidence": {"scores": [], "attempt_score": None, "previous_scores": [], "pattern_count": 1,
                         "pattern_total": 90, "task_ids": ["multi_turn_base_7"],
                         "trajectories": [{"event_id": eid(), "task_id": "multi_turn_base_7",
                                           "rollout_index": 1, "score": 0.5,
                                           "actions": [{"name": "mv", "arguments": "{}", "observation": "x"}]}]},
            "produced_at": NOW,
        },
        "ExplorationRecorded": {
            "event_id": eid(), "run_id": "r1", "step": 3, "signal_id": eid(), "signal_kind": "rare",
            "task_id": "multi_turn_base_7", "round": 0, "context": "the agent never uses mv",
            "tuples": [{"name": "mv", "arguments": '{"source": "a", "destination": "b"}',
                        "observation": "moved", "task_id": "multi_turn_base_7"}],
            "model": "SmolLM2-135M-Instruct", "strategy": "signal-guided", "signal_ids": [],
            "produced_at": NOW,
        },
        "TaskChecked": {
            "event_id": eid(), "task_id": "syn-1", "run_id": "r1", "step": 3, "source": "synthesized",
            "verdict": "rejected", "reason": "reference call failed", "env": "bfcl",
            "instruction_turns": ["move a to b"], "initial_state": "{}",
            "involved_classes": ["GorillaFileSystem"], "reference_solution": [["mv(source='a', destination='b')"]],
            "signal_ids": [], "exploration_ids": [], "validation_score": 0.0, "stage": "executable",
            "stages": [{"stage": "well_formed", "passed": True, "reason": "2 calls parse"},
                       {"stage": "executable", "passed": False, "reason": "reference call failed"}],
            "seed_task_id": "multi_turn_base_7", "produced_at": NOW,
        },
        "EvaluationCompleted": {
            "event_id": "eval-r1-3-test", "run_id": "r1", "step": 3, "policy_version": 3, "split": "test",
            "env": "bfcl", "task_count": 2, "success_rate": 0.5, "mean_score": 0.75,
            "task_ids": ["multi_turn_base_1", "multi_turn_base_2"], "scores": [1.0, 0.5],
            "duration_seconds": 12.5, "produced_at": NOW,
        },
        "PolicyUpdated": {
            "event_id": eid(), "run_id": "r1", "step": 3, "version": 3, "backend": "vllm-server",
            "bytes": 538_000_000, "seconds": 1.25, "servers": 2, "servers_behind": 0, "produced_at": NOW,
        },
        "DeadLettered": {
            "event_id": eid(), "source_topic": "coevolve.trajectories", "source_partition": 0,
            "source_offset": 17, "key": b"k", "payload": b"\x00\x01garbage", "error_type": "malformed",
            "reason": "not Avro", "service": "test", "produced_at": NOW,
        },
    }


def read_topic(bootstrap: str, topic: str) -> list:
    """Every event on `topic` up to its end, read without a group."""
    from coevolve.services.kafka.consumer import EventConsumer

    reader = EventConsumer(bootstrap, [topic], service="test-reader")
    try:
        return reader.read_to_end()
    finally:
        reader.close()
