"""Every task a signal or an exploration can name: BFCL's tasks and the tasks the loop validated.

A signal on a task the loop made names a synthesized id (`synthesized_...`); to explore it, or to build
a second-generation task from its exploration, the explorer and validator need the task itself. The
catalog keeps the latest validated `TaskChecked` per id, read from the compacted `coevolve.tasks`
through `reader` (anything with `read_to_end()`, e.g. a group-less `EventConsumer`). An id it does not
know makes it read on to the topic's end once before it answers that the id resolves nowhere, so a task
validated after the last read is still found. Each synthesized task records its parent (the task whose
environment was explored, `seed_task_id`), so lineage runs back to a BFCL task.
"""
from __future__ import annotations

from typing import Any, Mapping

from coevolve.services.envs import bfcl_data
from coevolve.services.envs.base import Task


class TaskCatalog:
    """BFCL tasks by id, plus every validated task read from `coevolve.tasks`."""

    def __init__(self, reader: Any = None, timeout_s: float = 10.0):
        self._reader = reader
        self._timeout_s = timeout_s
        self._tasks: dict[str, Task] = {}
        self.parents: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        """Validated records that do not build a task: id -> why."""

    def __len__(self) -> int:
        return len(self._tasks)

    def add(self, record: Mapping[str, Any]) -> bool:
        """Take one `TaskChecked` record; True when it made a task known (a later rejection of the same
        id, as compaction would keep it, forgets it)."""
        task_id = str(record["task_id"])
        if record.get("verdict") != "validated":
            self._tasks.pop(task_id, None)
            return False
        try:
            self._tasks[task_id] = Task.from_record(record)
        except (ValueError, KeyError, TypeError) as exc:
            self.skipped[task_id] = str(exc)
            return False
        if record.get("seed_task_id"):
            self.parents[task_id] = str(record["seed_task_id"])
        return True

    def refresh(self) -> int:
        """Read `coevolve.tasks` on to its end; how many tasks became known."""
        if self._reader is None:
            return 0
        items = self._reader.read_to_end(self._timeout_s)
        return sum(self.add(item.event) for item in items if item.name == "TaskChecked")

    def get(self, task_id: str) -> Task:
        """The task with this id; KeyError saying where it was looked for when it resolves nowhere."""
        try:
            return bfcl_data.get_task(task_id)
        except KeyError:
            pass
        if task_id not in self._tasks:
            self.refresh()
        if task_id in self._tasks:
            return self._tasks[task_id]
        why = f" (its record did not build a task: {self.skipped[task_id]})" if task_id in self.skipped else ""
        raise KeyError(f"no task {task_id!r}: not a BFCL multi-turn task, and not among the {len(self._tasks)} "
                       f"validated tasks on coevolve.tasks{why}")

    def lineage(self, task_id: str) -> list[str]:
        """The task's ancestors, parent first, back to a BFCL task."""
        return ancestors(self.parents, task_id)

    def generation(self, task_id: str) -> int:
        """0 for a BFCL task, 1 for a task made from one, 2 for one made from that..."""
        return len(self.lineage(task_id))


def ancestors(parents: Mapping[str, Any], task_id: str) -> list[Any]:
    """`task_id`'s ancestors by `parents` (task -> the task it was made from), parent first; a cycle
    ends the walk instead of looping."""
    out: list[str] = []
    while task_id in parents and parents[task_id] not in out:
        task_id = parents[task_id]
        out.append(task_id)
    return out
