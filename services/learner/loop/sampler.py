"""The learner's task pool: the seed training split plus the validated tasks of `coevolve.tasks`.

`TaskFeed` (feed.py) follows the compacted topic from its beginning in a background thread (no consumer
group: the catalog is rebuilt at every start) and only buffers what arrives. `TaskPool.refresh()`, called
between steps, takes the buffer in: the latest verdict per task id wins, so a validated task joins and a
task rejected later leaves. A step therefore never sees the pool change under it, and the learner
never waits on the explorer or validator: `refresh()` returns the seconds spent taking tasks in, the
numerator of the blocked share.

Mixing. The paper adds validated tasks to the training distribution and samples from it; the default
(`synthetic_share = -1`) does that, drawing uniformly over the whole pool, so synthesized tasks get a
share proportional to their number. A share in [0, 1] instead draws each batch slot from the
synthesized tasks with that probability (when there are any). `recency_half_life` halves a
synthesized task's weight every so many steps after it joined. With `fresh_first`, synthesized tasks never
drawn take the first slots of a batch (oldest first) and the mixing fills the rest, so a task the loop
made for a weakness is trained on at the next step. Seed tasks are the fixed training split: verdicts
never remove them. A batch holds distinct tasks while the pool has enough of them. A step's redraws
(dynamic sampling) leave out the tasks the step already rolled out (`draw(n, exclude)`): the signal
processors take one group of K rollouts per task and step, and a second one would come late.

Unloadable tasks. A validated task whose episode cannot start (BFCL's `InvalidTask`: an unknown tool
class, an initial state its backend cannot load, no turns) would end the learner at `env.reset` in
the middle of a step. So the pool tries each new or changed arrival the way an episode starts, one
`env.reset` (milliseconds: the backends load their scenario), and refuses it; `draw()` checks every
task once more the first time it is drawn (seeds, and tasks restored from a checkpoint, were never
checked at arrival), drops one that fails from the pool and draws a replacement, so the step keeps
its B groups. Refused tasks wait in `take_unloadable()` with where they came from, for the learner
to dead-letter and report.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coevolve.services.envs import make_env
from coevolve.services.envs.base import Task
from coevolve.services.learner.config import SamplerConfig
from coevolve.services.runtime.log import get_logger

log = get_logger("learner.sampler")


@dataclass(frozen=True)
class Drawn:
    """A task drawn for a step, and whether it came from the seed split or the loop."""

    task: Task
    source: str  # "seed" or "synthesized", as TrajectoryRecorded.task_source


@dataclass(frozen=True)
class Origin:
    """Where an arrival was read: the coordinates a dead letter names."""

    topic: str
    partition: int
    offset: int
    key: bytes | None


@dataclass(frozen=True)
class Unloadable:
    """A task the pool refused or dropped because its episode cannot start."""

    task_id: str
    reason: str
    record: dict[str, Any] | None  # the TaskChecked record, for an arrival
    origin: Origin | None  # None for a seed or restored task: nothing to dead-letter


def load_problem(task: Task, env: str = "bfcl") -> str | None:
    """Why an episode of `task` cannot start (what its `env.reset` raises), or None when it can."""
    try:
        make_env(env).reset(task)
    except ValueError as exc:  # BFCL's InvalidTask is one
        return f"{type(exc).__name__}: {exc}"
    return None


class TaskPool:
    """Seed tasks and synthesized tasks; arrivals wait in a buffer until `refresh()`."""

    def __init__(self, seed_tasks: Sequence[Task], config: SamplerConfig, rng_seed: int = 0,
                 check: Callable[[Task], str | None] = load_problem, run_id: str | None = None):
        self.config = config
        self.run_id = run_id  # only this run's verdicts are taken in; None takes every run's
        self.seed_tasks = {t.task_id: t for t in seed_tasks}
        self.synthesized: dict[str, tuple[Task, int]] = {}  # task id -> (task, step it joined)
        self.rng = random.Random(rng_seed)
        self.step = 0
        self.frozen = False
        self.invalid = 0
        self.check = check
        self.loadable: set[str] = set()  # ids whose current task passed `check`
        self.dropped_seeds: set[str] = set()
        self.drawn: set[str] = set()  # synthesized task ids drawn at least once (fresh_first)
        self.subjects: dict[str, str] = {}  # synthesized task id -> the task its signal named (its parent)
        self._unloadable: list[Unloadable] = []
        self._pending: list[tuple[dict[str, Any], Origin | None]] = []
        self._lock = threading.Lock()
        self.guard = threading.RLock()
        """Held by a thread that refreshes, draws or reads the pool's state while another may (the learner's
        look-ahead rollouts, `step.py`); arrivals (`offer`) need it not."""

    # -- arrivals (any thread) --
    def offer(self, record: dict[str, Any], origin: Origin | None = None) -> None:
        """Buffer one `TaskChecked` record (read at `origin`); it takes effect at the next `refresh()`."""
        with self._lock:
            self._pending.append((record, origin))

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    # -- between steps (the learner's thread) --
    def refresh(self, step: int) -> float:
        """Apply the buffered verdicts before `step`; return the seconds it took (blocked time)."""
        started = time.perf_counter()
        self.step = step
        if not self.frozen:
            with self._lock:
                records, self._pending = self._pending, []
            for record, origin in records:
                self._apply(record, step, origin)
        return time.perf_counter() - started

    def _apply(self, record: dict[str, Any], step: int, origin: Origin | None = None) -> None:
        task_id = str(record.get("task_id", ""))
        if task_id in self.seed_tasks or (self.run_id is not None and record.get("run_id") != self.run_id):
            return
        if record.get("verdict") != "validated":
            self.synthesized.pop(task_id, None)
            self.loadable.discard(task_id)
            return
        try:
            task = Task.from_record(record)
        except (KeyError, TypeError, ValueError) as err:
            self.invalid += 1
            log.warning("sampler.invalid_task", task_id=task_id, reason=str(err))
            return
        known = self.synthesized.get(task_id)
        if known is not None and known[0] == task:
            return
        problem = self.check(task)
        if problem is not None:
            self._drop(Unloadable(task_id, problem, record, origin))
            return
        self.synthesized[task_id] = (task, step)
        self.loadable.add(task_id)
        if record.get("signal_ids") and record.get("seed_task_id"):
            self.subjects[task_id] = str(record["seed_task_id"])

    def subject_tasks(self) -> list[Task]:
        """What a repair evaluation runs, each once in id order: every seed task (a signal may name any, and
        its score before training is known only if it was evaluated from the start), then the synthesized
        tasks whose weakness signals led to a task in the pool. A subject that is neither a seed nor a
        synthesized task of the pool is left out (a seed task of another category)."""
        synthesized = {k: t for k, (t, _) in self.synthesized.items()}
        named = sorted(k for k in set(self.subjects.values()) if k in synthesized)
        return [self.seed_tasks[k] for k in sorted(self.seed_tasks)] + [synthesized[k] for k in named]

    def _drop(self, bad: Unloadable) -> None:
        self.synthesized.pop(bad.task_id, None)
        self.loadable.discard(bad.task_id)
        if self.seed_tasks.pop(bad.task_id, None) is not None:
            self.dropped_seeds.add(bad.task_id)
        self._unloadable.append(bad)

    def take_unloadable(self) -> list[Unloadable]:
        """The tasks refused or dropped since the last call, oldest first."""
        out, self._unloadable = self._unloadable, []
        return out

    def freeze(self) -> None:
        """Stop taking tasks in (the static ablation); buffered and later arrivals are ignored."""
        self.frozen = True
        with self._lock:
            self._pending.clear()

    @property
    def size(self) -> int:
        return len(self.seed_tasks) + len(self.synthesized)

    def weight(self, task_id: str) -> float:
        """A synthesized task's recency weight at the current step (1 without a half-life)."""
        half_life = self.config.recency_half_life
        if not half_life:
            return 1.0
        return 0.5 ** ((self.step - self.synthesized[task_id][1]) / half_life)

    def sample(self, n: int, exclude: frozenset[str] = frozenset()) -> list[Drawn]:
        """Draw `n` tasks for the current step: the fresh ones first (`fresh_first`), then by the mixing.
        With `exclude`, those tasks are left out and none is drawn twice, so fewer than `n` may come back."""
        if not self.seed_tasks and not self.synthesized:
            raise RuntimeError("the task pool is empty: give seed categories with train tasks, or wait for "
                               "validated tasks")
        fresh = self._fresh(n) if self.config.fresh_first else []
        taken = {d.task.task_id for d in fresh}
        self.drawn |= taken
        if len(fresh) == n:
            return fresh
        if exclude:
            rest = self._mix(n - len(fresh), taken | exclude, again=False)
        else:
            rest = self._mix(n - len(fresh), taken) or self._mix(n - len(fresh), set())
        self.drawn |= {d.task.task_id for d in rest if d.source == "synthesized"}
        return fresh + rest

    def _fresh(self, n: int) -> list[Drawn]:
        """Up to `n` synthesized tasks never drawn, oldest first (by the step they joined, then id); a task
        a step rolled out was drawn, so a redraw's `exclude` holds none of them."""
        never = sorted((joined, k) for k, (_, joined) in self.synthesized.items() if k not in self.drawn)
        return [Drawn(self.synthesized[k][0], "synthesized") for _, k in never[:n]]

    def _mix(self, n: int, exclude: set[str] | frozenset[str], again: bool = True) -> list[Drawn]:
        """`n` tasks by the configured mixing, from the pool less `exclude`; distinct, and with `again`
        drawn again once the pool has no more."""
        seed = [Drawn(self.seed_tasks[k], "seed") for k in sorted(self.seed_tasks) if k not in exclude]
        synth = [Drawn(self.synthesized[k][0], "synthesized") for k in sorted(self.synthesized) if k not in exclude]
        synth_w = [self.weight(d.task.task_id) for d in synth]
        share = self.config.synthetic_share
        if share < 0 or not synth or not seed:
            return _weighted(self.rng, seed + synth, [1.0] * len(seed) + synth_w, n, again)
        from_synth = sum(self.rng.random() < share for _ in range(n))
        drawn = (_weighted(self.rng, synth, synth_w, from_synth, again)
                 + _weighted(self.rng, seed, [1.0] * len(seed), n - from_synth, again))
        self.rng.shuffle(drawn)
        return drawn

    def draw(self, n: int, exclude: frozenset[str] = frozenset()) -> list[Drawn]:
        """`sample(n, exclude)` of tasks whose episodes can start: one that cannot is dropped from the pool
        (see `take_unloadable`) and replaced by a new draw. Each task is checked once, when first drawn.
        With `exclude`, no task is drawn twice and fewer than `n` come back once the pool runs out."""
        drawn: list[Drawn] = []
        while len(drawn) < n:
            left_out = (exclude | {d.task.task_id for d in drawn}) if exclude else exclude
            fresh = self.sample(n - len(drawn), left_out)
            if not fresh:
                break
            for d in fresh:
                task_id = d.task.task_id
                if task_id not in self.loadable and task_id in {*self.seed_tasks, *self.synthesized}:
                    problem = self.check(d.task)
                    if problem is not None:
                        self._drop(Unloadable(task_id, problem, None, None))
                    else:
                        self.loadable.add(task_id)
            drawn += [d for d in fresh if d.task.task_id in self.loadable]
        return drawn

    # -- checkpoints --
    def state(self) -> dict[str, Any]:
        """Everything a resumed run needs: the RNG, the step, the synthesized tasks with their age, the
        seed tasks dropped as unloadable, and the synthesized tasks drawn before."""
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "step": self.step, "frozen": self.frozen,
                "synthesized": [{"task": t.to_record(), "joined": joined}
                                for t, joined in (self.synthesized[k] for k in sorted(self.synthesized))],
                "dropped_seeds": sorted(self.dropped_seeds), "drawn": sorted(self.drawn),
                "subjects": dict(sorted(self.subjects.items()))}

    def restore(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.step = int(state["step"])
        self.frozen = bool(state.get("frozen", False))
        self.dropped_seeds = set(state.get("dropped_seeds", ())) | self.dropped_seeds
        self.drawn = set(state.get("drawn", ()))
        self.subjects = dict(state.get("subjects", {}))
        for task_id in self.dropped_seeds:
            self.seed_tasks.pop(task_id, None)
        self.loadable = set()
        self.synthesized = {}
        for entry in state["synthesized"]:
            task = Task.from_record(entry["task"])
            self.synthesized[task.task_id] = (task, int(entry["joined"]))


def _weighted(rng: random.Random, items: list[Drawn], weights: list[float], n: int,
              again: bool = True) -> list[Drawn]:
    """`n` items by weight, distinct while there are enough (Efraimidis-Spirakis keys), then (`again`) anew."""
    out: list[Drawn] = []
    while len(out) < n and items:
        keys = sorted(range(len(items)), key=lambda i: rng.random() ** (1.0 / max(weights[i], 1e-12)),
                      reverse=True)
        out += [items[i] for i in keys[:n - len(out)]]
        if not again:
            break
    return out
