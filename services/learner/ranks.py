"""Several training ranks: who is who, how a step's batch is split, and how rank 0 drives the others.

torchrun (started by `launch.py`) gives every rank RANK, LOCAL_RANK and WORLD_SIZE; `Ranks.from_env`
reads them and nothing else. Rank 0 is the learner service: it reads `coevolve.tasks`, draws the
tasks, runs the rollouts (on its in-process engine or on the rollout fleet), publishes every event and
writes the checkpoints' metadata. The other ranks only train: each holds a shard of the policy and
runs `follow`, which waits for rank 0's next command and does its part of it:

    update(batch)   every rank gets the whole batch and trains its share (`assign`), gradients reduced
    params          the full weights, gathered once for the push (rank 0 sends them, the others help gather)
    save / load     the sharded checkpoint, each rank its own shard
    stop            leave the loop, once every rank has it (`release`)

`Driver` is the engine rank 0 uses: the same methods as an `Engine`, each announcing its command to
the other ranks first, so every rank enters the same collectives in the same order. One reader and one
publisher keep the event order and the journal exactly as with one rank; trajectories are small next to
the weights, so rollouts stay where they are generated and only the batch travels.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from coevolve.services.runtime.config import ConfigError


@dataclass(frozen=True)
class Ranks:
    """This process's place in the group, from the launcher's environment."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> "Ranks":
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                   int(os.environ.get("WORLD_SIZE", 1)))

    @property
    def driver(self) -> bool:
        return self.rank == 0

    @property
    def many(self) -> bool:
        return self.world_size > 1

    def device(self) -> torch.device:
        """This rank's GPU (LOCAL_RANK) where there are GPUs, else the CPU."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def check(self, configured: int) -> None:
        """Refuse a launcher whose world size differs from `learner.world_size`."""
        if self.many and configured not in (1, self.world_size):
            raise ConfigError(f"the launcher started {self.world_size} ranks but learner.world_size is {configured}; "
                              "set them equal, or let `coevolve learner` start torchrun itself")


COMMAND_TIMEOUT = timedelta(hours=1)
"""How long a collective may wait: the ranks wait for rank 0's next command through a whole step's
rollouts and evaluation. The learner's /healthz calls a step stale after the same hour."""


def init_group(ranks: Ranks) -> None:
    """Join the process group: NCCL on GPUs, gloo on CPUs. Under torchrun a rank also dies with its launcher
    (PR_SET_PDEATHSIG), so a killed launcher leaves no rank behind holding a collective open. A rank that
    aborts in native code (SIGABRT, SIGSEGV) prints every thread's Python stack first (faulthandler)."""
    if dist.is_initialized() or not ranks.many:
        return
    faulthandler.enable(all_threads=True)
    store = None
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        store = attempt_store(ranks)
    device = ranks.device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=COMMAND_TIMEOUT,
                            device_id=device if device.type == "cuda" else None, store=store, rank=ranks.rank,
                            world_size=ranks.world_size)


def attempt_store(ranks: Ranks) -> dist.Store:
    """torchrun's store, under a prefix of this attempt (TORCHELASTIC_RESTART_COUNT).

    torchrun keeps one store across the restarts of a group (its agent's, shared by default), and the
    default group's keys carry no attempt: a restarted rank could read the address a dead rank published
    in the attempt before and fail to connect (seen: "Gloo connectFullMesh failed ... Connection refused")."""
    hosted = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and ranks.rank == 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ranks.world_size,
                          is_master=hosted, timeout=COMMAND_TIMEOUT, wait_for_workers=False)
    return dist.PrefixStore(f"coevolve/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def share(value: Any = None) -> Any:
    """Rank 0's `value` on every rank (a picklable object); `value` itself with one rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def complete() -> None:
    """Wait until every rank gets here (a barrier; nothing with one rank)."""
    if dist.is_initialized():
        dist.barrier()


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


def release() -> None:
    """Rank 0: tell the other ranks to leave `follow`, then meet them at a barrier, so no rank closes its
    connections while another still reads the stop."""
    share(("stop", None))
    complete()


def rank_times(own: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's `own` timings (all ranks call this together), indexed by rank."""
    if not dist.is_initialized():
        return [own]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, own)
    return out


class Driver:
    """Rank 0's engine: each collective method tells the other ranks to join in, then runs here.

    A failure inside one leaves the ranks at different points of a collective: the driver is then
    `broken`, refuses further commands (a checkpoint among them) and releases no one; rank 0 exits with
    the error and torchrun stops the rest."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.broken = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    @property
    def updates(self) -> int:
        return self.engine.updates

    @updates.setter
    def updates(self, value: int) -> None:
        self.engine.updates = value

    def _command(self, command: str, arg: Any = None) -> None:
        if self.broken:
            raise RuntimeError("an earlier collective failed on rank 0 and the ranks are out of step; rerun with "
                               "--resume")
        share((command, arg))

    @contextmanager
    def _together(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.broken = True
            raise

    def update(self, batch) -> dict[str, float]:
        self._command("update", batch)
        with self._together():
            return self.engine.update(batch)

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, gathered; drained to the end even when the caller stops early, since every
        other rank takes part in each gather."""
        self._command("params")
        with self._together():
            stream = iter(self.engine.named_parameters())
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
            self.engine.save(folder)

    def load(self, folder: Path) -> None:
        self._command("load", str(folder))
        with self._together():
            self.engine.load(folder)

    def close(self) -> None:
        """Release the other ranks (`follow` returns) and leave the group."""
        if not self.broken and dist.is_initialized():
            release()
        if dist.is_initialized():
            dist.destroy_process_group()


def follow(engine: Any, on_update=None) -> None:
    """A rank other than 0: do its part of each of rank 0's commands until `stop`. `on_update(metrics)`
    sees each update's metrics (the rank's /metrics)."""
    while True:
        command, arg = share()
        if command == "stop":
            complete()  # rank 0's `release`
            return
        if command == "update":
            metrics = engine.update(arg)
            if on_update is not None:
                on_update(metrics)
        elif command == "params":
            started = time.perf_counter()
            for _ in engine.named_parameters():
                pass
            if on_update is not None:
                on_update({"push_seconds": time.perf_counter() - started})
        elif command == "save":
            engine.save(Path(arg))
        elif command == "load":
            engine.load(Path(arg))
        else:
            raise RuntimeError(f"rank {dist.get_rank()} got an unknown command {command!r} from rank 0")
