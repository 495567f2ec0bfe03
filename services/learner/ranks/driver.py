"""How rank 0 drives the other ranks: `Driver` on rank 0, `follow` on every other rank.

`Driver` is the trainer rank 0 uses: the same methods as a trainer, each announcing its command to the
other ranks first (`group.share`), so every rank enters the same collectives in the same order. The
other ranks run `follow`, which waits for rank 0's next command and does its part of it:

    update(batch)   every rank gets the whole batch and trains its share (`split.py`), gradients reduced
    params          the full weights, gathered once for the push (rank 0 sends them, the others help gather)
    save / load     the sharded checkpoint, each rank its own shard
    stop            leave the loop, once every rank has it (`group.release`)

One reader and one publisher keep the event order and the journal exactly as with one rank;
trajectories are small next to the weights, so rollouts stay where they are generated and only the
batch travels.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from coevolve.services.learner.ranks.group import complete, release, share
from coevolve.services.learner.ranks.split import split


class Training(Protocol):
    """What the loop asks of the policy it trains: a trainer (`trainer.trainer.Trainer`) on one rank, and
    `Driver`, which makes each of these a command to every rank, on several."""

    updates: int
    """Updates taken (one optimizer step each), restored from a checkpoint."""
    rank_times: list[dict[str, float]]
    """Each rank's seconds of the last update: training (forward and backward) and reduce (the rest)."""

    def update(self, batch: Sequence[Any]) -> dict[str, float]: ...

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def save(self, folder: Path) -> None: ...

    def load(self, folder: Path) -> None: ...


class Driver(Training):
    """Rank 0's trainer: each collective method tells the other ranks to join in, then runs here; only the
    methods of `Training` (and `close`) exist, so every call on a driver is visibly a command.

    A failure inside one leaves the ranks at different points of a collective: the driver is then
    `broken`, refuses further commands (a checkpoint among them) and releases no one; rank 0 exits with
    the error and torchrun stops the rest."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.shared = split(trainer)  # its updates, shared by the ranks
        self.broken = False

    @property
    def rank_times(self) -> list[dict[str, float]]:
        return self.trainer.rank_times

    @property
    def updates(self) -> int:
        return self.trainer.updates

    @updates.setter
    def updates(self, value: int) -> None:
        self.trainer.updates = value

    def _command(self, command: str, arg: Any = None) -> None:
        if self.broken:
            raise RuntimeError("an earlier collective failed on rank 0 and the ranks are out of step; rerun with "
                               "--resume")
        share((command, arg))

    @contextmanager
    def _together(self) -> Iterator[None]:
        try:
            yield
        except GeneratorExit:  # a pass over the weights closed early, drained on every rank: still in step
            raise
        except BaseException:
            self.broken = True
            raise

    def update(self, batch) -> dict[str, float]:
        self._command("update", batch)
        with self._together():
            return self.shared.update(batch)

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, gathered; drained to the end even when the caller stops early, since every
        other rank takes part in each gather."""
        self._command("params")
        with self._together():
            stream = iter(self.trainer.named_parameters())
            try:
                for item in stream:
                    yield item
            finally:
                for _ in stream:
                    pass

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.cpu().clone() for name, tensor in self.named_parameters()}

    def save(self, folder: Path) -> None:
        self._command("save", str(folder))
        with self._together():
            self.trainer.save(folder)

    def load(self, folder: Path) -> None:
        self._command("load", str(folder))
        with self._together():
            self.trainer.load(folder)

    def close(self) -> None:
        """Release the other ranks (`follow` returns) and leave the group."""
        if not self.broken and dist.is_initialized():
            release()
        if dist.is_initialized():
            dist.destroy_process_group()


def follow(trainer: Any, on_update=None) -> None:
    """A rank other than 0: do its part of each of rank 0's commands until `stop`. `on_update(metrics)`
    sees each update's metrics (the rank's /metrics)."""
    shared = split(trainer)  # its updates, shared by the ranks
    while True:
        command, arg = share()
        if command == "stop":
            complete()  # rank 0's `release`
            return
        if command == "update":
            metrics = shared.update(arg)
            if on_update is not None:
                on_update(metrics)
        elif command == "params":
            started = time.perf_counter()
            for _ in trainer.named_parameters():
                pass
            if on_update is not None:
                on_update({"push_seconds": time.perf_counter() - started})
        elif command == "save":
            trainer.save(Path(arg))
        elif command == "load":
            trainer.load(Path(arg))
        else:
            raise RuntimeError(f"rank {dist.get_rank()} got an unknown command {command!r} from rank 0")
