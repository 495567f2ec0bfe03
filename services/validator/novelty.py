"""Stage 3, novelty: a proposed task must not be a near-duplicate of a seed or already validated task.

Two tests, either one rejects:
- the same reference calls (each parsed and re-rendered, so spacing and quoting do not matter) on the
  same initial state of the same classes;
- instructions (the user turns joined) at least `threshold` similar to a known task's, by rapidfuzz's
  `token_sort_ratio` (0-100) after its default normalization (lower case, punctuation stripped).

A task is never compared with itself: a task id already in the index (validated before a restart, say)
is skipped in both tests, and adding it again changes nothing.
"""
from __future__ import annotations

import json
from typing import Iterable

from rapidfuzz import fuzz, process, utils

from coevolve.services.envs.base import Task
from coevolve.services.envs.calls import CallLimits, Rejected, parse_action
from coevolve.services.validator.stages import StageOutcome


def _normal_call(source: str) -> str:
    parsed = parse_action([source], CallLimits(max_chars=1 << 16)).calls
    return source.strip() if len(parsed) != 1 or isinstance(parsed[0], Rejected) else parsed[0].render()


def behaviour_key(task: Task) -> str:
    """The task's classes, their initial state and its normalized reference, as one string. The state keeps
    its key order, which BFCL's loaders read (the file system's root is the first key)."""
    classes = sorted(task.involved_classes)
    state = {c: task.initial_state.get(c) for c in classes}
    reference = [[_normal_call(c) for c in turn] for turn in task.reference]
    return json.dumps([classes, state, reference], default=str)


def instructions(task: Task) -> str:
    return "\n".join(task.turns)


class NoveltyIndex:
    """The known tasks (seeds, then every validated task) that proposals are compared against."""

    def __init__(self, tasks: Iterable[Task] = (), threshold: float = 90.0):
        self.threshold = threshold
        self._by_behaviour: dict[str, list[str]] = {}
        self._texts: list[str] = []
        self._ids: list[str] = []
        self._known: set[str] = set()
        for task in tasks:
            self.add(task)

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, task: Task) -> None:
        if task.task_id in self._known:
            return
        self._known.add(task.task_id)
        self._by_behaviour.setdefault(behaviour_key(task), []).append(task.task_id)
        self._texts.append(instructions(task))
        self._ids.append(task.task_id)

    def check(self, task: Task) -> StageOutcome:
        """Stage 3's outcome for `task` against every known task other than itself."""
        same = [i for i in self._by_behaviour.get(behaviour_key(task), []) if i != task.task_id]
        if same:
            return StageOutcome("novel", False, f"duplicate of {same[0]}: the same reference calls on the "
                                                "same initial state")
        # The best two matches: the best may be the task itself, which holds at most one entry.
        matches = process.extract(instructions(task), self._texts, scorer=fuzz.token_sort_ratio,
                                  processor=utils.default_process, score_cutoff=self.threshold, limit=2)
        for _, score, index in matches:
            if self._ids[index] != task.task_id:
                return StageOutcome("novel", False, f"near-duplicate of {self._ids[index]}: instructions "
                                                    f"{score:.1f}% similar (threshold {self.threshold:g})")
        return StageOutcome("novel", True, f"no known task among {len(self)} has the same reference on the "
                                           f"same state or instructions {self.threshold:g}% similar")


class RunIndexes:
    """The index each run's proposals are checked against: the seed tasks and the tasks validated for that
    run, or, with `inherit`, for any run on the broker (what the learner's pool takes in alike)."""

    def __init__(self, seeds: Iterable[Task], threshold: float, inherit: bool):
        self.seeds, self.threshold, self.inherit = list(seeds), threshold, inherit
        self._by_run: dict[str, NoveltyIndex] = {}

    def get(self, run_id: str) -> NoveltyIndex:
        key = "" if self.inherit else run_id
        if key not in self._by_run:
            self._by_run[key] = NoveltyIndex(self.seeds, self.threshold)
        return self._by_run[key]
