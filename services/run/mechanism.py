"""Whether the weaknesses chose the training data: origin, targeting, repair and lineage of a run's tasks.

Pure functions over what a `Tally` keeps of the run's events (plain dicts, no broker), so the terminal,
`summary.json` and `coevolve ablate` say the same thing.

- **Origin.** A validated task's strategy is its explorations' (`signal-guided`, `random`,
  `random-calls`, `random-fallback`, `static`) and, for a signal-guided one, the kind of the signal
  that led to it. A task is *trained on* at a step when its K rollouts there scored unlike (a group
  that scores alike has advantages 0 and moves no weight); *drawn* when it was rolled out at all.
- **Targeting.** A validated task hits a weakness when one of its reference calls uses a tool the
  signal's evidence involved: the calls of the failing rollouts (score below tau) for forgetting and
  boundary, the pattern's calls for rare. A task from a signal is checked against its own signals; a
  task from an unguided strategy against every signal raised up to its step, which makes the unguided
  strategies' share the base rate: how often a task lands on a weak spot without aiming.
- **Repair.** Each forgetting or boundary signal's subject task, scored greedily by the starting policy
  (the subjects evaluation at step 0: `learner.eval_at_start` with `eval_subjects`) and by the last
  subjects evaluation: `explored` subjects, where a task made from one of their signals was trained on,
  against `not_explored` ones. Greedy scores apart from the rollouts that raised the signal, so a
  subject's low score when it was raised (what chose it) does not count as its "before".
- **Lineage.** Each validated task with its parent (the task whose environment was explored), its
  generation (1 for a task made from a BFCL task, 2 for one made from that, ...), the signal that led
  to it, the steps that drew and trained on it.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

from coevolve.services.envs.catalog import ancestors

UNGUIDED = ("random", "random-calls", "random-fallback", "static")
_CALL_NAME = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def call_names(reference: Iterable[Iterable[str]]) -> set[str]:
    """The function names of a reference solution's calls (BFCL call syntax)."""
    return {m.group(1) for turn in reference for call in turn if (m := _CALL_NAME.match(call))}


def evidence_tools(signal: Mapping[str, Any]) -> set[str]:
    """The tools a signal's evidence involved: the pattern's calls (rare), else the failing rollouts'."""
    if signal["kind"] == "rare":
        return set(signal.get("pattern") or ())
    tau = float((signal.get("thresholds") or {}).get("success_threshold", 0.5))
    rollouts = (signal.get("evidence") or {}).get("trajectories") or []
    failing = [t for t in rollouts if float(t["score"]) < tau] or rollouts
    return {a["name"] for t in failing for a in t.get("actions") or []}


class Mechanism:
    """The run's tasks traced back to their signals. `explorations`, `signals` and `tasks` map event or
    task ids to the events' fields; `scores` maps (task, step) to the rollout scores of that draw, and
    `evaluated` to the greedy score of a subjects evaluation at that step."""

    def __init__(self, explorations: Mapping[str, Mapping[str, Any]], signals: Mapping[str, Mapping[str, Any]],
                 tasks: Mapping[str, Mapping[str, Any]], scores: Mapping[tuple[str, int], list[float]],
                 evaluated: Mapping[tuple[str, int], float] | None = None):
        self.explorations, self.signals, self.tasks, self.scores = explorations, signals, tasks, scores
        self.validated = {k: t for k, t in tasks.items() if t.get("verdict") == "validated"}
        self._draws: dict[str, dict[int, list[float]]] = defaultdict(dict)
        for (task, step), s in scores.items():
            self._draws[task][step] = s
        self._evaluated: dict[str, dict[int, float]] = defaultdict(dict)
        for (task, step), score in (evaluated or {}).items():
            self._evaluated[task][step] = score

    def origin(self, task_id: str) -> tuple[str, str | None]:
        """(strategy, signal kind or None) of a task, from its explorations."""
        for exploration_id in self.tasks[task_id].get("exploration_ids") or ():
            e = self.explorations.get(exploration_id)
            if e is not None:
                return str(e.get("strategy") or "signal-guided"), e.get("signal_kind")
        return "unknown", None

    def draws(self, task_id: str) -> dict[int, list[float]]:
        """Step -> the rollout scores of the task drawn at that step."""
        return self._draws.get(task_id, {})

    def trained_steps(self, task_id: str) -> list[int]:
        return sorted(step for step, s in self.draws(task_id).items() if len(set(s)) > 1)

    def counts(self) -> dict[str, Any]:
        """Validated and trained-on tasks (and rollouts trained on) by strategy and by signal kind."""
        out: dict[str, Counter] = {k: Counter() for k in ("validated", "trained", "trained_rollouts",
                                                          "validated_by_signal", "trained_by_signal")}
        for task_id in self.validated:
            strategy, kind = self.origin(task_id)
            trained = self.trained_steps(task_id)
            out["validated"][strategy] += 1
            out["trained"][strategy] += bool(trained)
            out["trained_rollouts"][strategy] += sum(len(self.scores[(task_id, s)]) for s in trained)
            if kind:
                out["validated_by_signal"][kind] += 1
                out["trained_by_signal"][kind] += bool(trained)
        return {k: {name: n for name, n in v.items() if n} for k, v in out.items()}

    def _signal_tools(self, ids: Iterable[str]) -> set[str]:
        return {tool for i in ids if i in self.signals for tool in evidence_tools(self.signals[i])}

    def targeting(self) -> dict[str, dict[str, Any]]:
        """Per strategy: validated tasks checked, those whose reference uses the evidence's tools, the share."""
        hits: dict[str, list[bool]] = defaultdict(list)
        for task_id, task in self.validated.items():
            strategy, _ = self.origin(task_id)
            if strategy == "signal-guided":
                tools = self._signal_tools(task.get("signal_ids") or ())
            else:
                tools = self._signal_tools(i for i, s in self.signals.items() if int(s["step"]) <= int(task["step"]))
            if tools:
                hits[strategy].append(bool(call_names(task.get("reference_solution") or ()) & tools))
        return {k: {"tasks": len(v), "targeted": sum(v), "share": sum(v) / len(v)} for k, v in sorted(hits.items())}

    def repair(self) -> dict[str, Any]:
        """Greedy scores of the forgetting and boundary signals' subjects before training (the subjects
        evaluation at step 0) and after it (the last one): `explored` subjects, where a task made from one
        of their signals was trained on, against `not_explored` ones, whose signals led to no trained-on
        task. A subject missing from either evaluation is counted `unmeasured`."""
        repaired = {i for task_id, task in self.validated.items() if self.trained_steps(task_id)
                    for i in task.get("signal_ids") or ()}
        subjects: dict[str, bool] = {}
        for signal_id, signal in self.signals.items():
            subject = signal.get("task_id")
            if signal["kind"] == "rare" or not subject:
                continue
            subjects[str(subject)] = subjects.get(str(subject), False) or signal_id in repaired
        steps = sorted({step for scores in self._evaluated.values() for step in scores})
        after = steps[-1] if steps and steps[-1] > 0 else None
        out: dict[str, Any] = {"before_step": 0 if 0 in steps else None, "after_step": after}
        for group, explored in (("explored", True), ("not_explored", False)):
            pairs, unmeasured = [], 0
            for subject in sorted(s for s, e in subjects.items() if e == explored):
                scores = self._evaluated.get(subject, {})
                if 0 in scores and after in scores:
                    pairs.append((scores[0], scores[after]))
                else:
                    unmeasured += 1
            n = len(pairs)
            out[group] = {"measured": n, "unmeasured": unmeasured,
                          "score_before": sum(p[0] for p in pairs) / n if n else None,
                          "score_after": sum(p[1] for p in pairs) / n if n else None,
                          "change": sum(p[1] - p[0] for p in pairs) / n if n else None}
        return out

    def lineage(self) -> list[dict[str, Any]]:
        """One row per validated task, oldest first."""
        parents = {k: t.get("seed_task_id") for k, t in self.validated.items()}  # None: made from an unknown task
        rows = []
        for task_id, task in sorted(self.validated.items(), key=lambda kv: (int(kv[1]["step"]), kv[0])):
            strategy, kind = self.origin(task_id)
            subjects = sorted({str(self.signals[i].get("subject")) for i in task.get("signal_ids") or ()
                               if i in self.signals})
            rows.append({"task_id": task_id, "parent": task.get("seed_task_id"),
                         "generation": len(ancestors(parents, task_id)),
                         "strategy": strategy, "signal_kind": kind, "signal_ids": list(task.get("signal_ids") or ()),
                         "subjects": subjects, "validated_at": int(task["step"]),
                         "drawn": sorted(self.draws(task_id)), "trained": self.trained_steps(task_id)})
        return rows

    def describe(self, task_id: str) -> str:
        """Where a task came from, in words: `from a boundary signal on multi_turn_base_12`."""
        strategy, kind = self.origin(task_id)
        if kind:
            subjects = sorted({str(self.signals[i].get("subject")) for i in self.tasks[task_id].get("signal_ids") or ()
                               if i in self.signals})
            return f"from a {kind} signal" + (f" on {', '.join(subjects)}" if subjects else "")
        return f"from {strategy} exploration"

    def summary(self) -> dict[str, Any]:
        return {"origin": self.counts(), "targeting": self.targeting(), "repair": self.repair(),
                "lineage": self.lineage()}
