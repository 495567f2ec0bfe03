"""Exploration runs as `ExplorationRecorded` events (schemas/ExplorationRecorded.avsc)."""
from __future__ import annotations

import json
from typing import Any, Mapping

from coevolve.services.explorer.planning import Cluster, exploration_id, random_source_id
from coevolve.services.explorer.random_strategy import ExplorationRun


def exploration_record(run: ExplorationRun, run_id: str, step: int, cluster: Cluster | None,
                       context: Mapping[str, Any] | None, strategy: str, model: str,
                       produced_at: int) -> dict[str, Any]:
    """One run's event; its id follows from the cluster's first signal (or the task and step) and the round."""
    source = cluster.source_id if cluster is not None else random_source_id(run_id, step, run.task_id, strategy)
    return {
        "event_id": exploration_id(source, run.round),
        "run_id": run_id,
        "step": int(step),
        "signal_id": cluster.source_id if cluster is not None else None,
        "signal_kind": cluster.primary.kind if cluster is not None else None,
        "task_id": run.task_id,
        "round": int(run.round),
        "context": json.dumps(context, sort_keys=True) if context else "",
        "tuples": run.tuples(),
        "model": model,
        "strategy": strategy,
        "signal_ids": cluster.signal_ids if cluster is not None else [],
        "produced_at": int(produced_at),
    }
