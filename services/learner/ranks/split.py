"""One update shared by the ranks: every rank is given the whole batch and trains its share of it.

The micro-batches are dealt out by tokens (`assign`, the same split on every rank); the loss weights
are the whole batch's, and each rank's loss is scaled by the world size so that the trainer's gradient
average is the sum over ranks: the gradient and the reported loss are what one rank would compute over
the whole batch. A rank with fewer micro-batches runs a weightless one per missing round, since every
forward and backward is a collective for sharded weights. The trainer's own `update` is the one-rank
case; `SplitTrainer.update` takes the same steps (`begin`, `scales`, `micro_batches`, `backward`,
`optimizer_step`, `end`, `metrics`) with the ranks' parts added.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def assign(parts: Sequence[Sequence[int]], tokens: Sequence[int], world: int) -> list[list[int]]:
    """The micro-batches (`parts`, as indexes into a batch whose sequences have `tokens` tokens) each rank
    trains: the longest first to the least loaded rank, each rank's kept in batch order. Deterministic, so
    every rank computes the same split."""
    load = [0] * world
    owner = [0] * len(parts)
    for i in sorted(range(len(parts)), key=lambda i: (-sum(tokens[j] for j in parts[i]), i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += sum(tokens[j] for j in parts[i])
    return [[i for i in range(len(parts)) if owner[i] == rank] for rank in range(world)]


def rank_times(own: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's `own` timings (all ranks call this together), indexed by rank."""
    if not dist.is_initialized():
        return [own]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, own)
    return out


def split(trainer: Any) -> Any:
    """`trainer` with its updates shared by the ranks of the process group; `trainer` itself with one rank
    (or when it is split already)."""
    if isinstance(trainer, SplitTrainer) or not dist.is_initialized() or dist.get_world_size() == 1:
        return trainer
    return SplitTrainer(trainer)


class SplitTrainer:
    """A rank's trainer in a group of several: `update` trains this rank's share; everything else, read from
    the trainer itself."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.trainer, name)

    def update(self, batch: Sequence[Any]) -> dict[str, float]:
        """This rank's share of one GRPO update on `batch` (the module docstring); the whole update's metrics."""
        trainer = self.trainer
        start = trainer.begin(batch)
        scales = trainer.scales(batch)
        sums = dict.fromkeys(trainer.STATS, 0.0)
        parts = trainer.micro_batches(batch)
        mine = [parts[i] for i in assign(parts, [len(s.token_ids) for s in batch], self.world)[self.rank]]
        for i in range(self._most(len(mine))):
            weightless = i >= len(mine)
            part = (mine or parts)[0] if weightless else mine[i]
            weights = torch.zeros(len(part)) if weightless else scales[part]
            stats = trainer.backward(batch, part, weights, factor=self.world)
            for key, value in ({} if weightless else stats).items():
                sums[key] += value
        trained = time.perf_counter()
        grad_norm = trainer.optimizer_step()
        sums = self._summed(sums)
        seconds = trainer.end(start)
        trainer.rank_times = rank_times({"training": trained - start, "reduce": seconds - (trained - start)})
        return trainer.metrics(batch, sums, grad_norm, seconds)

    def _most(self, rounds: int) -> int:
        """The most micro-batches any rank has."""
        count = torch.tensor([rounds], device=self.comm_device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count.item())

    def _summed(self, sums: dict[str, float]) -> dict[str, float]:
        """`sums` added over the ranks."""
        values = torch.tensor(list(sums.values()), dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(values)
        return dict(zip(sums, values.tolist()))

    @property
    def comm_device(self) -> torch.device:
        """Where the process group's small tensors live: the GPU for NCCL, the CPU for gloo."""
        return self.trainer.device if dist.get_backend() == "nccl" else torch.device("cpu")
