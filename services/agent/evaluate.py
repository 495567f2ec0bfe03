"""`coevolve eval`: greedy episodes on the held-out split, the paper's BFCL multi-turn accuracy.

Accuracy is the share of tasks whose every turn passed; the mean score is the mean fraction of turns
passed. The results file holds, per task, the calls the agent made in each user turn as BFCL call
strings, so any result can be re-scored with `coevolve env score`.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from coevolve.services.agent.backends import make_backend
from coevolve.services.agent.config import BackendConfig, EpisodeLimits, EvalConfig, SamplingConfig
from coevolve.services.agent.episodes import Episode, run_episodes
from coevolve.services.envs.base import Task
from coevolve.services.envs.hosts import bounded_tool_calls


def eval_tasks(config: EvalConfig) -> list[Task]:
    from coevolve.services.envs.bfcl_data import load_tasks

    tasks = load_tasks(split=config.split)
    return tasks[:config.limit] if config.limit else tasks


def summarize(episodes: Sequence[Episode], backend_config: BackendConfig, config: EvalConfig,
              seconds: float) -> dict[str, Any]:
    """The results document: headline numbers, then one entry per task."""
    n = len(episodes)
    passed = sum(e.success for e in episodes)
    return {"model": backend_config.model, "backend": backend_config.backend, "env": config.env,
            "split": config.split, "tasks": n, "passed": passed,
            "accuracy": passed / n if n else 0.0,
            "mean_score": sum(e.score for e in episodes) / n if n else 0.0,
            "seconds": round(seconds, 3),
            "results": [{"task_id": e.task_id, "success": e.success, "score": e.score, "turns": e.turns,
                         "calls": e.calls, "truncated": e.truncated} for e in episodes]}


def headline(summary: dict[str, Any]) -> str:
    return (f"accuracy: {summary['accuracy']:.4f} ({summary['passed']}/{summary['tasks']}), "
            f"mean score: {summary['mean_score']:.4f}")


def run_eval(backend_config: BackendConfig, config: EvalConfig, limits: EpisodeLimits,
             output: Path | None, progress: bool = True) -> dict[str, Any]:
    """Evaluate greedily, write `output` (JSON) if given, and return the summary."""
    from tqdm import tqdm

    tasks = eval_tasks(config)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=config.max_new_tokens)
    backend = make_backend(backend_config)
    started = time.monotonic()
    try:
        with (tqdm(total=len(tasks), desc="tasks", unit="task", file=sys.stderr, disable=not progress) as bar,
              bounded_tool_calls(limits)):
            episodes = run_episodes(tasks, config.env, backend, sampling, limits,
                                    on_done=lambda _: bar.update(1), max_in_flight=config.in_flight)
    finally:
        backend.close()
    summary = summarize(episodes, backend_config, config, time.monotonic() - started)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
