"""Evaluation during training: greedy episodes on the held-out split, as `coevolve eval` runs them.

The task selection and the summary are `services.agent.evaluate`'s; only the backend differs: the
learner's own rollout engine, holding the current policy, so no second model is loaded. Each task is
cut to the user turns the learner plays (`max_user_turns`): success then means every played turn passed,
where a four-turn task played for one turn could never succeed, and the score is the share of played
turns passed.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from coevolve.services.agent.config import BackendConfig, EpisodeLimits, EvalConfig, SamplingConfig
from coevolve.services.agent.episodes import run_episodes
from coevolve.services.agent.evaluate import eval_tasks, summarize
from coevolve.services.envs.base import Task
from coevolve.services.learner.config import LearnerConfig


def evaluation_event_id(run_id: str, step: int, split: str) -> str:
    return f"eval-{run_id}-{step}-{split}"


def played(task: Task, turns: int) -> Task:
    """The task cut to its first `turns` user turns (the learner plays no more), references included."""
    if len(task.turns) <= turns:
        return task
    return dataclasses.replace(task, turns=task.turns[:turns], reference=task.reference[:turns],
                               added_tools={t: names for t, names in task.added_tools.items() if t < turns})


def _greedy(backend: Any, backend_cfg: BackendConfig, config: EvalConfig, tasks: list, limits: EpisodeLimits,
            run_id: str, step: int, split: str) -> dict[str, Any]:
    """Greedy episodes of `tasks`, each cut to the turns played, as the `EvaluationCompleted` record of `split`."""
    tasks = [played(task, limits.max_user_turns) for task in tasks]
    started = time.monotonic()
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=config.max_new_tokens)
    episodes = run_episodes(tasks, config.env, backend, greedy, limits, max_in_flight=config.in_flight)
    summary = summarize(episodes, backend_cfg, config, time.monotonic() - started)
    return {"event_id": evaluation_event_id(run_id, step, split), "run_id": run_id, "step": step,
            "policy_version": backend.version, "split": split, "env": config.env,
            "task_count": summary["tasks"], "success_rate": summary["accuracy"],
            "mean_score": summary["mean_score"], "task_ids": [r["task_id"] for r in summary["results"]],
            "scores": [float(r["score"]) for r in summary["results"]], "duration_seconds": summary["seconds"],
            "produced_at": int(time.time() * 1000)}


def evaluate(backend: Any, backend_cfg: BackendConfig, cfg: LearnerConfig, limits: EpisodeLimits,
             max_new_tokens: int, run_id: str, step: int) -> dict[str, Any]:
    """Evaluate the backend's current policy greedily; return the `EvaluationCompleted` record."""
    config = EvalConfig(split=cfg.eval_split, limit=cfg.eval_tasks, in_flight=cfg.in_flight,
                        max_new_tokens=max_new_tokens)
    return _greedy(backend, backend_cfg, config, eval_tasks(config), limits, run_id, step, cfg.eval_split)


def evaluate_subjects(backend: Any, backend_cfg: BackendConfig, tasks: list, cfg: LearnerConfig,
                      limits: EpisodeLimits, max_new_tokens: int, run_id: str, step: int) -> dict[str, Any] | None:
    """Greedy episodes of the signals' subjects (`TaskPool.subject_tasks`), as an `EvaluationCompleted`
    of split `subjects`; None when there is none."""
    if not tasks:
        return None
    config = EvalConfig(in_flight=cfg.in_flight, max_new_tokens=max_new_tokens)
    return _greedy(backend, backend_cfg, config, tasks, limits, run_id, step, "subjects")


def evaluate_all(backend: Any, backend_cfg: BackendConfig, cfg: LearnerConfig, limits: EpisodeLimits,
                 max_new_tokens: int, run_id: str, step: int, pool: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The held-out evaluation and, with `eval_subjects`, the subjects' (`pool.subject_tasks()`, read under
    the pool's guard), of the backend's current policy at `step`."""
    evaluation = evaluate(backend, backend_cfg, cfg, limits, max_new_tokens, run_id, step)
    if not cfg.eval_subjects:
        return evaluation, None
    with pool.guard:
        tasks = pool.subject_tasks()
    return evaluation, evaluate_subjects(backend, backend_cfg, tasks, cfg, limits, max_new_tokens, run_id, step)


def due(cfg: LearnerConfig, step: int) -> bool:
    """Whether step `step` ends with an evaluation: every `eval_every` steps and after the last."""
    return cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.steps)

