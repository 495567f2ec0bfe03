"""Peak memory of a weight push on CPU ranks: the whole policy gathered first, against streamed.

    python -m bench.bench_push_memory [--shape smollm2-135m] [--chunk-mib 64] [--repeats 3]

Two CPU ranks (torchrun, gloo, one thread each) shard a random-weight model of `shape` with FSDP2,
float32. Rank 0 drives each push as the learner does (`ranks.Driver`: every rank gathers each tensor
together) through the gloo sender's rounds (`transfer.broadcast_round`: chunks of
`--chunk-mib`, cast to bfloat16) into a group that drops every chunk, so what is measured is the
sender's own memory, not a server's. Each push runs in a fresh group of ranks (memory a process freed
stays in its RSS, so a second push in one process would measure less); two ways, alternated:
  - whole: the gathered weights read into one list first, as every push did before streaming
    (`NamedTensorSource` still does this with a one-shot iterator);
  - streamed: `PolicyWeights`, one gathered tensor at a time: a pass for the metadata, one for the round.
Reported for rank 0, per way: the median over the repeats of the peak RSS during the push (VmHWM, reset
right before it) above the RSS before it, and of the push's seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_ranks import UNSET, reset_peak, status
from bench.common import machine

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("whole", "streamed")


class _Sink:
    """A gloo group whose broadcasts go nowhere."""

    def broadcast(self, tensors, options):
        return self

    def wait(self) -> bool:
        return True


def push(weights, chunk_bytes: int) -> None:
    import torch

    from coevolve.services.fleet.transfer import GlooUpdateInfo, NamedTensorSource, broadcast_round

    source = NamedTensorSource(weights, torch.bfloat16)
    broadcast_round(_Sink(), source, GlooUpdateInfo.of(source.metadata()), chunk_bytes)


def rank_child(args) -> None:
    from coevolve.services.learner.config import GRPOConfig
    from coevolve.services.learner.ranks.driver import Driver, follow
    from coevolve.services.learner.ranks.group import Ranks, init_group
    from coevolve.services.learner.ranks.split import split
    from coevolve.services.learner.trainer.build import wrap_policy
    from coevolve.services.learner.trainer.fsdp_trainer import FSDPTrainer
    from bench.shapes import random_llama
    from coevolve.services.learner.trainer.trainer import PolicyWeights

    ranks = Ranks.from_env()
    init_group(ranks)
    config = GRPOConfig(lr=1e-6, kl_beta=0.0)
    engine = split(FSDPTrainer(wrap_policy(random_llama(args.shape, seed=0), config), config))
    if not ranks.driver:
        follow(engine)
        return
    driver = Driver(engine)
    before = status("VmRSS")
    reset_peak()
    started = time.perf_counter()
    push(iter(driver.named_parameters()) if args.way == "whole" else PolicyWeights(driver), args.chunk_mib << 20)
    row = {"way": args.way, "seconds": time.perf_counter() - started, "peak": status("VmHWM") - before}
    driver.close()
    Path(args.out).write_text(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--chunk-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.rank_child:
        rank_child(args)
        return
    print(f"machine: {machine()}")
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        for repeat in range(args.repeats):
            for way in WAYS:
                command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "bench.bench_push_memory", "--rank-child", "--way", way, "--shape", args.shape,
                           "--chunk-mib", str(args.chunk_mib), "--out", str(out)]
                subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
                rows.append(json.loads(out.read_text()))
                print(f"  {way} push {repeat + 1}: rank 0's peak {rows[-1]['peak'] / 2**20:,.0f} MiB above its "
                      f"start, {rows[-1]['seconds']:.2f} s", flush=True)
    print(f"{args.shape}, FSDP2 on 2 CPU ranks, float32 weights pushed as bfloat16 in {args.chunk_mib} MiB chunks")
    for way in WAYS:
        mine = [r for r in rows if r["way"] == way]
        print(f"{way:>9}: peak {statistics.median(r['peak'] for r in mine) / 2**20:,.0f} MiB above the push's "
              f"start, {statistics.median(r['seconds'] for r in mine):.2f} s (medians of {len(mine)})")


if __name__ == "__main__":
    main()
