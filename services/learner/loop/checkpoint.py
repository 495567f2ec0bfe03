"""Learner checkpoints: `<workdir>/checkpoints/step-000003/` and a `latest` pointer beside them.

A checkpoint holds the policy weights (as the trainer trains them: LoRA adapters unmerged), the
optimizer state, and `state.json` (step, run id, policy version, sampler state, config). It is written
to a temporary folder and renamed into place, and only then does `latest` move (written the same
way), so a crash mid-write leaves the previous checkpoint current. The trainer writes and reads its own
files (`Trainer.save` / `Trainer.load`: torch files, DeepSpeed's own checkpoint, whose optimizer state
is partitioned, or FSDP2's `torch.distributed.checkpoint` shards); with several ranks each writes its
shard into the one folder (shared storage across nodes), rank 0 the rest, and `state.json` records
the world size, which a resume must match. Older checkpoints beyond `keep` are deleted: a SmolLM2 checkpoint with AdamW
state is about 1.6 GB.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coevolve.services.learner.trainer.trainer import Trainer

LATEST = "latest"


@dataclass(frozen=True)
class Checkpoint:
    """A saved step, read back."""

    path: Path
    step: int
    run_id: str
    policy_version: int
    sampler: dict[str, Any]
    config: dict[str, Any]
    world_size: int = 1
    """The ranks whose shards it holds."""


def checkpoints_dir(workdir: Path) -> Path:
    return Path(workdir) / "checkpoints"


def step_dir(workdir: Path, step: int) -> Path:
    return checkpoints_dir(workdir) / f"step-{step:06d}"


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_checkpoint(workdir: Path, trainer: Trainer, *, step: int, run_id: str, policy_version: int,
                    sampler: dict[str, Any], config: dict[str, Any], keep: int = 2, world_size: int = 1) -> Path:
    """Write step `step`'s checkpoint, point `latest` at it, and keep only the newest `keep`. With several
    ranks this is rank 0's part: its `trainer` (ranks.driver.Driver) has every rank write its shard into the folder."""
    final = step_dir(workdir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainer.save(tmp)
    # "engine_steps": the trainer's update count, under the key older checkpoints have
    state = {"step": step, "run_id": run_id, "policy_version": policy_version, "engine_steps": trainer.updates,
             "world_size": world_size, "sampler": sampler, "config": config}
    (tmp / "state.json").write_text(json.dumps(state, default=str), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _write_text(checkpoints_dir(workdir) / LATEST, final.name + "\n")
    _prune(workdir, keep)
    return final


def _prune(workdir: Path, keep: int) -> None:
    saved = sorted(p for p in checkpoints_dir(workdir).glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in saved[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(workdir: Path) -> Checkpoint | None:
    """The checkpoint `latest` names, or None when the workdir has none."""
    pointer = checkpoints_dir(workdir) / LATEST
    if not pointer.is_file():
        return None
    path = checkpoints_dir(workdir) / pointer.read_text(encoding="utf-8").strip()
    state_file = path / "state.json"
    if not state_file.is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which has no state.json; remove the pointer "
                                "to start over, or point it at an intact checkpoint")
    state = json.loads(state_file.read_text(encoding="utf-8"))
    return Checkpoint(path, int(state["step"]), str(state["run_id"]), int(state["policy_version"]),
                      state["sampler"], state.get("config", {}), int(state.get("world_size", 1)))


def restore_trainer(trainer: Trainer, checkpoint: Checkpoint) -> None:
    """Load the policy and optimizer state of `checkpoint` into `trainer`, and its update count."""
    trainer.load(checkpoint.path)
    state = json.loads((checkpoint.path / "state.json").read_text(encoding="utf-8"))
    trainer.updates = int(state.get("engine_steps", checkpoint.step))
