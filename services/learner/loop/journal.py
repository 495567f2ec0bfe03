"""The learner's write-ahead step journal: `<workdir>/journal/step-000003/`, one entry per step since the
last checkpoint.

Why: a step's event ids are deterministic (run, step, task, rollout; the step's own id from run and
step), and consumers keep the first copy of an id. A step re-run after a crash between its publishing
and its checkpoint would publish the same ids with other rollouts (another pool, other sampling
seeds) and train on them, so the copies downstream would describe an update the weights never took,
and the weights one the events never showed. The events of a step must therefore be those of the update
that was applied: after a step is trained and before anything of it is published, the learner writes
its entry; a resumed learner replays the entries after its checkpoint (the same update on the same
batch, the same records sent again) instead of re-running those steps.

An entry holds:

    batch.json      the TrainSequences the update trained on (token ids, loss mask, rollout
                    log-probs, advantage); empty when the step did not train
    records.json    the TrajectoryRecorded records, the PolicyUpdated and EvaluationCompleted records
                    or null, and the StepCompleted record as built before publishing
    state.json      step, run id, whether it trained, the policy version and the trainer's update
                    count after it (key `engine_steps`), and the pool's state after it (what it had
                    taken in from coevolve.tasks, its RNG)
    published.json  the StepCompleted record as sent (with its publish time): written once the
                    trajectories are confirmed and before the record is sent, so a replay sends
                    the very record a consumer may already hold

An entry is written to a temporary folder and renamed into place (as checkpoints are), so a crash
mid-write leaves no entry, and nothing of that step was published. A folder without the rename
(`.tmp`) is ignored. A checkpoint at step c prunes the entries below c; c's own entry stays until the next
checkpoint, for a resume whose broker lost what c published (an embedded broker restored from an archive
that had not stored it yet). JSON keeps every float
exactly (Python writes the shortest repr that reads back the same double).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.loop.record import StepRecord

PREFIX = "step-"


@dataclass(frozen=True)
class Entry:
    """One journaled step: what its update trained on, what it publishes, and the state after it."""

    step: int
    run_id: str
    trained: bool
    batch: list[TrainSequence]
    trajectories: list[dict[str, Any]]
    evaluation: dict[str, Any] | None
    record: StepRecord
    """The StepCompleted record: as sent when `published`, else as built before publishing."""
    policy_version: int
    trainer_updates: int
    sampler: dict[str, Any]
    published: bool = False
    policy_update: dict[str, Any] | None = None
    """The step's `PolicyUpdated` record; None when it pushed nothing."""
    subjects: dict[str, Any] | None = None
    """The step's evaluation of the signals' subjects (`eval_subjects`); None when it ran none."""


def journal_dir(workdir: Path) -> Path:
    return Path(workdir) / "journal"


def entry_dir(workdir: Path, step: int) -> Path:
    return journal_dir(workdir) / f"{PREFIX}{step:06d}"


def _dump(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, separators=(",", ":")), encoding="utf-8")


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write(workdir: Path, entry: Entry) -> Path:
    """Write `entry` atomically (temporary folder, then rename); return its folder."""
    final = entry_dir(workdir, entry.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _dump(tmp / "batch.json", [{"token_ids": s.token_ids, "loss_mask": s.loss_mask,
                                "logprobs": [float(p) for p in s.logprobs], "advantage": float(s.advantage)}
                               for s in entry.batch])
    _dump(tmp / "records.json", {"trajectories": entry.trajectories, "evaluation": entry.evaluation,
                                 "record": entry.record.to_event(), "policy_update": entry.policy_update,
                                 "subjects": entry.subjects})
    _dump(tmp / "state.json", {"step": entry.step, "run_id": entry.run_id, "trained": entry.trained,
                               "policy_version": entry.policy_version, "engine_steps": entry.trainer_updates,
                               "sampler": entry.sampler})
    if entry.published:
        _dump(tmp / "published.json", entry.record.to_event())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def mark_published(path: Path, record: StepRecord) -> None:
    """Keep `record` as the StepCompleted record that is sent for the entry at `path` (atomic)."""
    tmp = path / "published.json.tmp"
    _dump(tmp, record.to_event())
    os.replace(tmp, path / "published.json")


def published_record(path: Path) -> StepRecord | None:
    """The StepCompleted record marked as sent for the entry at `path`; None before `mark_published`."""
    sent = path / "published.json"
    return StepRecord.from_event(_load(sent)) if sent.is_file() else None


def read(path: Path) -> Entry:
    """The entry in folder `path`."""
    state, records = _load(path / "state.json"), _load(path / "records.json")
    sent = published_record(path)
    batch = [TrainSequence(s["token_ids"], s["loss_mask"], s["logprobs"], s["advantage"])
             for s in _load(path / "batch.json")]
    return Entry(step=int(state["step"]), run_id=str(state["run_id"]), trained=bool(state["trained"]),
                 batch=batch, trajectories=records["trajectories"], evaluation=records["evaluation"],
                 record=sent or StepRecord.from_event(records["record"]),
                 policy_version=int(state["policy_version"]), trainer_updates=int(state["engine_steps"]),
                 sampler=state["sampler"], published=sent is not None, policy_update=records.get("policy_update"),
                 subjects=records.get("subjects"))


def complete(workdir: Path) -> dict[int, Path]:
    """Step -> folder of every entry that was renamed into place."""
    folder = journal_dir(workdir)
    if not folder.is_dir():
        return {}
    out = {}
    for path in folder.glob(f"{PREFIX}*"):
        digits = path.name.removeprefix(PREFIX)
        if path.is_dir() and digits.isdigit():
            out[int(digits)] = path
    return dict(sorted(out.items()))


def entries_after(workdir: Path, step: int) -> list[Path]:
    """The folders of the entries step+1, step+2, ... up to the first step without one."""
    found = complete(workdir)
    out = []
    while step + 1 + len(out) in found:
        out.append(found[step + 1 + len(out)])
    return out


def run_of(workdir: Path) -> str | None:
    """The run id of the earliest entry, or None when the journal is empty."""
    found = complete(workdir)
    if not found:
        return None
    return str(_load(next(iter(found.values())) / "state.json")["run_id"])


def prune(workdir: Path, step: int) -> None:
    """Delete the entries below `step` (a checkpoint holds them now) and unfinished writes. The checkpoint's
    own step is kept: a resume sends its records again when the broker lost them (`resume.py`)."""
    for done, path in complete(workdir).items():
        if done < step:
            shutil.rmtree(path, ignore_errors=True)
    folder = journal_dir(workdir)
    for tmp in folder.glob(f"{PREFIX}*.tmp") if folder.is_dir() else ():
        shutil.rmtree(tmp, ignore_errors=True)
