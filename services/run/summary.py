"""`<workdir>/summary.json`: what the run did, read from the events, and why a signal kind stayed silent,
no step took a GRPO update, no task was validated, or no update trained on a synthesized task."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Sequence

from coevolve.services.envs.base import Task
from coevolve.services.learner.loop.record import PHASES
from coevolve.services.run.shape import task_shape
from coevolve.services.run.tally import Tally
from coevolve.streams.rules import Thresholds


def thresholds(streams: dict[str, Any]) -> Thresholds:
    """The signal thresholds the run's worker uses (its preset section over the defaults)."""
    names = ("success_threshold", "window", "rare_threshold", "pattern_length")
    return Thresholds(**{k: streams[k] for k in names if k in streams})


def _alike(tally: Tally) -> str:
    """How many of the run's (task, step) groups scored all alike, and the best score of any rollout."""
    groups = list(tally.scores.values())
    alike = sum(len(set(g)) == 1 for g in groups)
    top = max((max(g) for g in groups), default=0.0)
    return f"{alike} of {len(groups)} groups scored all alike; the best rollout scored {top:.3f}"


def silent_reasons(tally: Tally, th: Thresholds) -> dict[str, str]:
    """For each signal kind that never fired, what in the run's scores and actions explains it."""
    tau, reasons = th.success_threshold, {}
    if not tally.trajectories:
        return {kind: "no trajectory was published" for kind in ("forgetting", "boundary", "rare")
                if not tally.signals.get(kind)}
    if not tally.signals.get("boundary"):
        reasons["boundary"] = f"no task's rollouts at one step scored both >= tau ({tau}) and < tau: {_alike(tally)}"
    if not tally.signals.get("forgetting"):
        attempts: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for (task, step), scores in tally.scores.items():
            attempts[task].append((step, sum(scores) / len(scores)))
        reached = sum(any(s >= tau for _, s in a) for a in attempts.values())
        repeated = sum(len(a) > 1 for a in attempts.values())
        reasons["forgetting"] = (f"no task's attempt fell below tau ({tau}) after one of its previous {th.window} "
                                 f"attempts reached it: {reached} of {len(attempts)} tasks ever reached tau, "
                                 f"{repeated} were attempted at more than one step")
    if not tally.signals.get("rare"):
        reasons["rare"] = ("no tool call was made in any rollout (the model emitted none that parsed), so no "
                           "action pattern exists to be rare" if not tally.actions else
                           f"no action pattern stayed below theta ({th.rare_threshold}%) of a step's "
                           f"{tally.actions} calls")
    return reasons


def untrained_reason(tally: Tally) -> str | None:
    """When no step took a GRPO update, why: a group whose K rewards are all equal has advantages 0, and a
    run of 0 steps evaluates only."""
    if not tally.steps:
        if any(e.get("step") == 0 for e in tally.evaluations):
            return "no training step: run.steps = 0 evaluates the starting policy only (the zero-shot arm)"
        return None
    if any(s.get("loss") is not None for s in tally.steps.values()):
        return None
    return f"no step took a GRPO update (a group that scores all alike has advantages 0): {_alike(tally)}"


def unvalidated_reason(tally: Tally) -> str | None:
    """When no task was validated, why: how far the run's proposals and exploration groups got."""
    if tally.validated:
        return None
    groups = {k.split(": ", 1)[1]: n for k, n in tally.deadletters.items() if k.startswith("validator: ")}
    dead = ", ".join(f"{n} {kind}" for kind, n in sorted(groups.items()))
    unproposed = f"; exploration groups with no proposal: {dead}" if dead else ""
    if not tally.verdicts:
        explored = sum(tally.explorations.values())
        return f"no task was proposed ({explored} explorations published){unproposed}"
    stages = Counter(v["stage"] or "unknown" for v in tally.verdicts.values())
    return (f"all {len(tally.verdicts)} proposed tasks were rejected: "
            + ", ".join(f"{n} at {stage}" for stage, n in stages.most_common()) + unproposed)


def unclosed_reason(tally: Tally) -> str | None:
    """When no step trained on a synthesized task, where the loop stopped short of its last edge."""
    if tally.synthesized_trained or not tally.steps:
        return None
    if not tally.validated:
        return "no task was validated (tasks_silent says why)"
    pooled = sorted(k for k, s in tally.steps.items() if s.get("pool_synthesized"))
    if not pooled:
        return (f"{tally.validated} task(s) validated, none before the pool's last refresh (before step "
                f"{tally.last_step}): they came too late to be trained on")
    return (f"synthesized tasks were in the pool from step {pooled[0]}, but no step's update took one: not drawn "
            "(learner.fresh_first draws each one at the next step), or their groups scored all alike")


def build(tally: Tally, plan_info: dict[str, Any], phases: dict[str, float], th: Thresholds,
          state: str, seeds: Sequence[Task] = ()) -> dict[str, Any]:
    """The summary document (docs/run.md, "summary.json"); `seeds` is the learner's seed pool, whose shape
    `task_shape` sets beside the validated tasks'."""
    steps = [tally.steps[s] | {"step": s} for s in sorted(tally.steps)]
    stage_seconds = {k: sum(s.get(f"{k}_seconds") or 0.0 for s in steps) for k in PHASES}
    busy = sum(s.get("duration_seconds") or 0.0 for s in steps)
    rejected = [v for v in tally.verdicts.values() if v["verdict"] == "rejected"]
    by_stage = Counter(v["stage"] or "unknown" for v in rejected)
    reasons = Counter(f"{v['stage'] or 'unknown'}: {v['reason'][:120]}" for v in rejected)
    return {
        **plan_info, "state": state, "steps": len(steps), "last_step": tally.last_step,
        "trajectories": tally.trajectories, "signals": {k: tally.signals.get(k, 0) for k in
                                                         ("forgetting", "boundary", "rare")},
        "signals_silent": silent_reasons(tally, th), "thresholds": dataclasses.asdict(th),
        "updates_silent": untrained_reason(tally),
        "explorations": dict(tally.explorations), "tasks_proposed": len(tally.verdicts),
        "tasks_validated": tally.validated, "tasks_rejected": len(rejected),
        "rejected_by_stage": dict(by_stage), "rejected_by_reason": dict(reasons.most_common(20)),
        "tasks_silent": unvalidated_reason(tally),
        "pool_size": {s["step"]: s.get("pool_size") for s in steps},
        "pool_synthesized": {s["step"]: s.get("pool_synthesized") for s in steps},
        "synthesized_trained": tally.synthesized_trained, "first_synthesized_step": tally.first_synthesized_step,
        "loop_silent": unclosed_reason(tally),
        **tally.mechanism.summary(),
        "task_shape": task_shape(tally.mechanism.validated.values(), seeds),
        "train_reward": {s["step"]: s.get("train_reward") for s in steps},
        "loss": {s["step"]: s.get("loss") for s in steps},
        "policy_lag": tally.policy_lag, "weight_updates": tally.weight_updates,
        "evaluations": tally.evaluations, "dead_letters": dict(tally.deadletters),
        "learner_seconds": {**{k: round(v, 3) for k, v in stage_seconds.items()}, "steps": round(busy, 3)},
        "blocked_share": stage_seconds["blocked"] / busy if busy else None,
        "wall_seconds": {k: round(v, 3) for k, v in phases.items()},
        "events": dict(tally.events),
    }


def _by(counts: dict[str, int], kinds: dict[str, int]) -> str:
    parts = []
    for strategy, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        detail = ", ".join(f"{k} {m}" for k, m in sorted(kinds.items())) if strategy == "signal-guided" and kinds else ""
        parts.append(f"{n} {strategy}" + (f" ({detail})" if detail else ""))
    return ", ".join(parts)


def origin_line(summary: dict[str, Any]) -> str:
    """The terminal's last word on the mechanism: where the validated and trained-on tasks came from, and
    how many of each strategy's tasks use the tools their weakness involved."""
    origin, targeting = summary["origin"], summary["targeting"]
    validated, trained = sum(origin["validated"].values()), sum(origin["trained"].values())
    line = f"tasks: {validated} validated" + (f" ({_by(origin['validated'], origin['validated_by_signal'])})"
                                             if validated else "")
    line += f"; trained on {trained}" + (f" ({_by(origin['trained'], origin['trained_by_signal'])})" if trained else "")
    if targeting:
        line += "; on a weak spot's tools: " + ", ".join(f"{k} {v['targeted']} of {v['tasks']}"
                                                         for k, v in targeting.items())
    return line


def write(path: Path, summary: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def repair_line(summary: dict[str, Any]) -> str:
    """The terminal's word on repair: `repair (greedy, step 0 -> 6): explored subjects 0.20 -> 0.45 (n 3);
    not explored 0.25 -> 0.25 (n 2)`, or why it is unmeasured."""
    repair = summary["repair"]
    groups = [(name, repair[key]) for name, key in (("explored subjects", "explored"), ("not explored", "not_explored"))]
    subjects = sum(r["unmeasured"] + r["measured"] for _, r in groups)
    if not subjects:
        return "repair: no forgetting or boundary signal named a subject"
    if not any(r["measured"] for _, r in groups):
        return (f"repair: unmeasured ({subjects} subjects; set learner.eval_at_start and learner.eval_subjects to "
                "score them before and after)")
    parts = [f"{name} {r['score_before']:.2f} -> {r['score_after']:.2f} (n {r['measured']})" if r["measured"]
             else f"{name} n 0" for name, r in groups]
    return f"repair (greedy, step {repair['before_step']} -> {repair['after_step']}): " + "; ".join(parts)
