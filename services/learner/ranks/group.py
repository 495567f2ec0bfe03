"""Several training ranks: who is who, and the process group they talk through.

torchrun (started by `launch.py`) gives every rank RANK, LOCAL_RANK and WORLD_SIZE; `Ranks.from_env`
reads them and nothing else. Rank 0 is the learner service: it reads `coevolve.tasks`, draws the
tasks, runs the rollouts (on its in-process engine or on the rollout fleet), publishes every event and
writes the checkpoints' metadata. The other ranks only train (`worker.py`): each holds a shard of the
policy and does its part of rank 0's commands (`driver.py`), which reach it through `share`.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from coevolve.services.runtime.config import ConfigError
from coevolve.services.runtime.stores import gloo_interface, hosted_store


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
    elif "GLOO_SOCKET_IFNAME" not in os.environ and "MASTER_ADDR" in os.environ:
        # gloo listens at what the host name resolves to otherwise: beyond loopback in a container
        interface = gloo_interface(os.environ["MASTER_ADDR"], hosting=ranks.rank == 0)
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=COMMAND_TIMEOUT,
                            device_id=device if device.type == "cuda" else None, store=store, rank=ranks.rank,
                            world_size=ranks.world_size)


def attempt_store(ranks: Ranks) -> dist.Store:
    """torchrun's store, under a prefix of this attempt (TORCHELASTIC_RESTART_COUNT).

    torchrun keeps one store across the restarts of a group (its agent's, shared by default), and the
    default group's keys carry no attempt: a restarted rank could read the address a dead rank published
    in the attempt before and fail to connect (seen: "Gloo connectFullMesh failed ... Connection refused")."""
    hosted = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and ranks.rank == 0
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = hosted_store(address, port, ranks.world_size, COMMAND_TIMEOUT, wait_for_workers=False) if hosted else \
        dist.TCPStore(address, port, ranks.world_size, is_master=False, timeout=COMMAND_TIMEOUT, wait_for_workers=False)
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


def release() -> None:
    """Rank 0: tell the other ranks to leave `follow`, then meet them at a barrier, so no rank closes its
    connections while another still reads the stop."""
    share(("stop", None))
    complete()


def leave() -> NoReturn:
    """End a rank's process once its group is destroyed and its results are written, without the
    interpreter's finalization: a trainer's sharded modules still reference the group there, and gloo's
    threads torn down with them abort the process in rare exits ("terminate called without an active
    exception", exit -6, after all its work)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
