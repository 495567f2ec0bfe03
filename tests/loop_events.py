"""A small, fully known run of the loop's events (what `coevolve run` publishes beyond trajectories), with
the figures its analyses must give, computed by hand."""
from __future__ import annotations

from tests.events import NOW

STEPS = 6
PHASES = {"rollout": 5.0, "scoring": 0.5, "training": 3.0, "push": 0.5, "publish": 0.4}  # + blocked, + 0.5 other
DURATION = 10.0
EVALUATED = {0: (0.1, 0.2), 3: (0.2, 0.35), 6: (0.3, 0.5)}  # step -> (success_rate, mean_score)
STAGES = ("well_formed", "executable", "novel", "dual_pass")

# What the analyses must report for this run.
BLOCKED_SHARE = 0.3 / 60.0  # steps 1, 3, 5 block 0.1 s each; six steps of 10 s
EXPLORATIONS = {"signal-guided": 12, "random-fallback": 2, "random": 1}
VERDICTS = {("validated", "passed"): 6, ("rejected", "executable"): 6, ("rejected", "novel"): 6}
FUNNEL = {"well_formed": (18, 18), "executable": (18, 12), "novel": (12, 6), "dual_pass": (6, 6)}


def _step(run: str, step: int) -> dict:
    blocked = 0.1 if step % 2 else 0.0
    return {"event_id": f"{run}-step-{step}", "run_id": run, "step": step, "trajectory_count": 8,
            "policy_version": step, "train_reward": 0.1 * step, "eval_success": None, "loss": 0.5,
            "duration_seconds": DURATION, "pool_size": 100 + 2 * (step - 1), "pool_synthesized": 2 * (step - 1),
            "zero_variance_groups": step % 3, "resampled_groups": 0, "tokens_trained": 1000 * step,
            "synthesized_trained": 4 * (step - 1), "synthesized_tasks_trained": step - 1,
            **{f"{phase}_seconds": s for phase, s in PHASES.items()}, "blocked_seconds": blocked,
            "produced_at": NOW + step}


def _evaluation(run: str, step: int) -> dict:
    rate, mean = EVALUATED[step]
    return {"event_id": f"eval-{run}-{step}-test", "run_id": run, "step": step, "policy_version": step,
            "split": "test", "env": "bfcl", "task_count": 10, "success_rate": rate, "mean_score": mean,
            "task_ids": [], "scores": [], "duration_seconds": 30.0, "produced_at": NOW + step}


def _exploration(run: str, step: int, i: int, strategy: str) -> dict:
    guided = strategy == "signal-guided"
    return {"event_id": f"{run}-exp-{step}-{i}", "run_id": run, "step": step,
            "signal_id": f"sig-{step}-{i}" if guided else None, "signal_kind": "boundary" if guided else None,
            "task_id": "multi_turn_base_3", "round": i, "context": "{}",
            "tuples": [{"name": "ls", "arguments": "{}", "observation": "a.txt", "task_id": "multi_turn_base_3"}],
            "model": "tiny-random", "strategy": strategy, "signal_ids": [f"sig-{step}-{i}"] if guided else [],
            "produced_at": NOW + step}


def _verdict(run: str, step: int, rejected_at: str | None, reason: str) -> dict:
    upto = STAGES.index(rejected_at) + 1 if rejected_at else len(STAGES)
    stages = [{"stage": s, "passed": s != rejected_at, "reason": reason if s == rejected_at else "ok"}
              for s in STAGES[:upto]]
    task_id = f"{run}-syn-{step}-{rejected_at or 'ok'}"
    return {"event_id": f"{task_id}-verdict", "task_id": task_id, "run_id": run, "step": step,
            "source": "synthesized", "verdict": "rejected" if rejected_at else "validated", "reason": reason,
            "env": "bfcl", "instruction_turns": ["list the files", "read a.txt"], "initial_state": "{}",
            "involved_classes": ["GorillaFileSystem"], "reference_solution": [["ls()"], ["cat(file_name='a.txt')"]],
            "signal_ids": [], "exploration_ids": [], "validation_score": 0.5 if not rejected_at else 0.0,
            "stage": rejected_at, "stages": stages, "seed_task_id": "multi_turn_base_3", "produced_at": NOW + step}


def loop_run(run: str = "loop-run") -> list[tuple[str, str, dict]]:
    """(topic, record name, event) of the whole run, in publishing order."""
    out = [("coevolve.evaluations", "EvaluationCompleted", _evaluation(run, 0))]
    for step in range(1, STEPS + 1):
        out.append(("coevolve.steps", "StepCompleted", _step(run, step)))
        if step in EVALUATED:
            out.append(("coevolve.evaluations", "EvaluationCompleted", _evaluation(run, step)))
        strategies = ["signal-guided"] * 2 + ["random-fallback"] * (step <= 2) + ["random"] * (step == 4)
        out += [("coevolve.explorations", "ExplorationRecorded", _exploration(run, step, i, s))
                for i, s in enumerate(strategies)]
        out += [("coevolve.tasks", "TaskChecked", _verdict(run, step, at, reason)) for at, reason in (
            (None, "dual pass: partial score 0.5"), ("executable", "reference call 1 failed: no such file"),
            ("novel", "near-duplicate of multi_turn_base_3"))]
    return out
