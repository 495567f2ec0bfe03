"""`coevolve learner` with `world_size` > 1: start the ranks under torchrun and stand between them and
whoever started the learner.

    python -m torch.distributed.run --nnodes N --nproc-per-node world_size/N --max-restarts R
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --rdzv-conf is_host=false
        --local-addr 127.0.0.1                           (one node)
        --master-addr HOST --master-port PORT --node-rank K   (several: static rendezvous)
        --no-python coevolve learner <the same arguments>

On one node, torchrun's rendezvous meets at a store this process hosts on loopback, and torchrun shares no
store of its own with the ranks (TORCH_DISABLE_SHARE_RDZV_TCP_STORE): rank 0 hosts the ranks' store on
127.0.0.1 (group.py), so nothing of the group listens beyond loopback. (`--standalone` would have torchrun
host both itself, on every interface.) Across nodes the rendezvous must be reachable from the other
nodes: torchrun hosts it on node 0, and the NetworkPolicies are its guard (docs/deploy.md).

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
from datetime import timedelta
from typing import Any, Sequence

from coevolve.services.learner.config import RanksConfig
from coevolve.services.runtime.log import get_logger
from coevolve.services.runtime.processes import WITH_PARENT, children
from coevolve.services.runtime.stores import hosted_store

RENDEZVOUS_TIMEOUT = timedelta(minutes=10)


def torchrun_command(ranks: RanksConfig, argv: Sequence[str], program: str, local_store: int = 0) -> list[str]:
    """The torchrun command line that runs `program argv` on this node's ranks; on one node, its rendezvous
    at the loopback store on port `local_store` (`loopback_rendezvous`)."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={ranks.nnodes}",
               f"--nproc-per-node={ranks.per_node}", f"--max-restarts={ranks.max_restarts}"]
    if ranks.rdzv_endpoint:
        host, _, port = ranks.rdzv_endpoint.rpartition(":")
        command += [f"--master-addr={host}", f"--master-port={port}", f"--node-rank={ranks.node_rank}"]
    else:
        command += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{local_store}", "--rdzv-conf=is_host=false",
                    "--rdzv-id=coevolve-learner", "--local-addr=127.0.0.1"]
    return [*command, "--no-python", program, *argv]


def loopback_rendezvous() -> Any:
    """The store a one-node torchrun meets at: a TCPStore master on 127.0.0.1 only, on a port the kernel picks."""
    return hosted_store("127.0.0.1", 0, None, RENDEZVOUS_TIMEOUT, wait_for_workers=False)


ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def root_cause(output: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun reports in its summary, if any."""
    found = ROOT_CAUSE.search(output.partition("Root Cause")[2])
    return (int(found.group(1)), int(found.group(2))) if found else None


def run_ranks(ranks: RanksConfig, argv: Sequence[str], program: str) -> int:
    """Run this node's ranks until they end; the exit code the learner should end with."""
    log = get_logger("learner")
    store = None if ranks.rdzv_endpoint else loopback_rendezvous()  # held until torchrun ends
    command = torchrun_command(ranks, argv, program, store.port if store is not None else 0)
    log.info("learner.ranks_starting", world_size=ranks.world_size, nnodes=ranks.nnodes, node_rank=ranks.node_rank,
             per_node=ranks.per_node, command=" ".join(command[1:]))
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if store is not None else None
    process = subprocess.Popen([sys.executable, "-c", WITH_PARENT, str(os.getpid()), *command],
                               stderr=subprocess.PIPE, start_new_session=True, env=env)
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
