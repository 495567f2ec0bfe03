"""Peak memory and time of one GRPO update on long episodes (a BFCL episode is 4-5k tokens).

    python -m bench.bench_learner_memory [--length 4096] [--generated 64] [--gradient-checkpointing]

A random-weight model of SmolLM2-135M's shape, float32, plain torch, micro-batch 1, two sequences of
`length` tokens whose last `generated` tokens carry the loss. Prints the update's seconds, tokens/s
and the process's peak resident memory (`ru_maxrss`) after the model is built and after the update.
"""
from __future__ import annotations

import argparse
import resource
import time

import torch

from bench.common import machine
from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.build import build_trainer
from bench.shapes import random_llama


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--generated", type=int, default=64)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    ids = torch.randint(0, 49152, (args.length,), generator=torch.Generator().manual_seed(0)).tolist()
    mask = [0] * (args.length - args.generated) + [1] * args.generated
    logprobs = [-5.0 if m else 0.0 for m in mask]
    batch = [TrainSequence(ids, mask, logprobs, 1.0), TrainSequence(ids, mask, logprobs, -1.0)]
    config = GRPOConfig(lr=1e-6, micro_batch_size=1, gradient_checkpointing=args.gradient_checkpointing)
    engine = build_trainer(random_llama("smollm2-135m", seed=0), config)
    built = peak_gib()
    started = time.perf_counter()
    engine.update(batch)
    seconds = time.perf_counter() - started
    print(f"machine: {machine()}")
    print(f"length {args.length}, gradient checkpointing {args.gradient_checkpointing}: {seconds:.1f} s, "
          f"{2 * args.length / seconds:.0f} tokens/s, peak RSS {peak_gib():.2f} GiB (after build {built:.2f})")


if __name__ == "__main__":
    main()
