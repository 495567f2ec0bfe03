"""`coevolve learner` with `world_size` > 1: start the ranks under torchrun and stand between them and
whoever started the learner.

    python -m torch.distributed.run --nnodes N --nproc-per-node world_size/N --max-restarts R
        --standalone                                     (one node)
        --master-addr HOST --master-port PORT --node-rank K   (several: static rendezvous)
        --no-python coevolve learner <the same arguments>

A static rendezvous numbers ranks node by node, so rank 0 (the reader and publisher, group.py) is always
on node 0, where the rollout fleet's transfer rendezvous points. torchrun runs in a session of its
own, with the parent-death signal: a stop reaches the ranks through this process only, and a killed
learner takes them along. Stopping (SIGTERM or SIGINT here) sends SIGTERM to the ranks: rank 0 finishes
its step, checkpoints and releases the others, and every process exits 0. When a rank fails, torchrun
stops the rest and names the failure; this process logs which rank failed and how, and exits 1, or 2
when that rank's own exit was a usage or configuration error. With `max_restarts`, torchrun restarts
the whole group instead, and the restarted ranks resume from the latest checkpoint (the learner reads
TORCHELASTIC_RESTART_COUNT).
"""
from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
from typing import Sequence

from coevolve.services.learner.config import RanksConfig
from coevolve.services.runtime.log import get_logger
from coevolve.services.runtime.processes import WITH_PARENT, children


def torchrun_command(ranks: RanksConfig, argv: Sequence[str], program: str) -> list[str]:
    """The torchrun command line that runs `program argv` on this node's ranks."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={ranks.nnodes}",
               f"--nproc-per-node={ranks.per_node}", f"--max-restarts={ranks.max_restarts}"]
    if ranks.rdzv_endpoint:
        host, _, port = ranks.rdzv_endpoint.rpartition(":")
        command += [f"--master-addr={host}", f"--master-port={port}", f"--node-rank={ranks.node_rank}"]
    else:
        command.append("--standalone")
    return [*command, "--no-python", program, *argv]


ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def root_cause(output: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun reports in its summary, if any."""
    found = ROOT_CAUSE.search(output.partition("Root Cause")[2])
    return (int(found.group(1)), int(found.group(2))) if found else None


def run_ranks(ranks: RanksConfig, argv: Sequence[str], program: str) -> int:
    """Run this node's ranks until they end; the exit code the learner should end with."""
    log = get_logger("learner")
    command = torchrun_command(ranks, argv, program)
    log.info("learner.ranks_starting", world_size=ranks.world_size, nnodes=ranks.nnodes, node_rank=ranks.node_rank,
             per_node=ranks.per_node, command=" ".join(command[1:]))
    process = subprocess.Popen([sys.executable, "-c", WITH_PARENT, str(os.getpid()), *command],
                               stderr=subprocess.PIPE, start_new_session=True)
    tail: collections.deque[str] = collections.deque(maxlen=400)

    def relay() -> None:  # torchrun's and the ranks' stderr, passed on and kept for the failure summary
        for raw in process.stderr:
            line = raw.decode(errors="replace")
            tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=relay, name="ranks-stderr", daemon=True)
    reader.start()

    def stop(signum: int, _frame) -> None:
        log.info("learner.ranks_stopping", signal=signal.Signals(signum).name)
        for pid in children(process.pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    reader.join(timeout=5)
    if code == 0:
        log.info("learner.ranks_finished", world_size=ranks.world_size)
        return 0
    failed = root_cause("".join(tail))
    rank, exitcode = failed if failed else (None, code)
    how = (f"killed by {signal.Signals(-exitcode).name}" if exitcode < 0 and -exitcode in signal.valid_signals()
           else f"exit code {exitcode}")
    log.error("learner.rank_failed", rank=rank, exitcode=exitcode, how=how, torchrun_exit=code,
              fix="torchrun stopped every rank; find the failed rank's error above, then rerun with --resume: it "
                  "continues from the latest checkpoint")
    return 2 if exitcode == 2 else 1
