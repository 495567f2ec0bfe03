"""Learner training throughput on CPU: tokens/s of one GRPO step, plain torch versus DeepSpeed ZeRO-1.

    python -m bench.bench_train [--shapes tiny,smollm2-135m] [--batch 4] [--length 256] [--repeats 5]
        [--compare engines|autocast|packing] [--prompt 0] [--gradient-checkpointing]

Random-weight Llama models built from a config (`tiny`: 2.9M parameters; `smollm2-135m`: SmolLM2-135M's
shape), float32. A step is `engine.update` on `batch` sequences of `length` tokens, the second
half of each generated (loss mask 1), micro-batches of 2, KL off, AdamW; tokens/s counts every token
the forward and backward passes process. One untimed warm-up step per engine, then `repeats` steps
of each, alternating the two engines (so both see the same load from other jobs), and the medians.
DeepSpeed runs in this process with DS_ACCELERATOR=cpu and one rank. `--compare autocast` sets plain
torch in float32 against bf16 autocast (the learner's `autocast` setting) instead. `--compare packing`
sets rollouts trained as their own rows against shared-prompt packs (`shared_prefix`), on one group:
`batch` rollouts of one `--prompt`-token prompt, then `length` tokens each (the first half generated).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import machine, report
from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.build import build_trainer
from bench.shapes import SHAPES, random_llama


def make_batch(batch: int, length: int, vocab: int, prompt: int = 0) -> list[TrainSequence]:
    """`batch` sequences of `length` tokens, the second half generated; or, after a shared `prompt`,
    `length` own tokens each, the first half generated (a reply, then its tool output)."""
    gen = torch.Generator().manual_seed(0)
    half = length // 2
    own = [0] * (length - half) + [1] * half if not prompt else [1] * half + [0] * (length - half)
    mask = [0] * prompt + own
    shared = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
    seqs = []
    for i in range(batch):
        ids = shared + torch.randint(0, vocab, (length,), generator=gen).tolist()
        logprobs = [-5.0 if m else 0.0 for m in mask]
        seqs.append(TrainSequence(ids, mask, logprobs, advantage=1.0 if i % 2 else -1.0))
    return seqs


def interleaved(engines: dict, batch: list[TrainSequence], repeats: int) -> dict[str, list[float]]:
    """Tokens/s of each engine's steps, alternating engines so both see the same machine load."""
    tokens = sum(len(s.token_ids) for s in batch)
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for name, engine in engines.items():
        engine.update(batch)  # warm-up
    for _ in range(repeats):
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.update(batch)
            runs[name].append(tokens / (time.perf_counter() - start))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,smollm2-135m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--compare", choices=("engines", "autocast", "packing"), default="engines",
                        help="engines: torch vs DeepSpeed ZeRO-1 (float32); autocast: torch float32 vs bf16 "
                             "autocast; packing: rollouts unpacked vs shared-prompt packs")
    parser.add_argument("--prompt", type=int, default=0, help="tokens of a prompt all sequences share")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"machine: {machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        ds_file = Path(tmp) / "zero1.json"
        ds_file.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
        for shape in args.shapes.split(","):
            batch = make_batch(args.batch, args.length, SHAPES[shape]["vocab_size"], args.prompt)
            print(f"{shape}: {args.batch} x ({args.prompt} shared + {args.length}) tokens per step, "
                  f"micro-batch {args.micro_batch}, gradient checkpointing {args.gradient_checkpointing}")
            variants = {
                "engines": (("torch", {}), ("deepspeed-zero1", {"deepspeed_config": str(ds_file)})),
                "autocast": (("torch-float32", {}), ("torch-bf16-autocast", {"autocast": "bf16"})),
                "packing": (("torch-unpacked", {"shared_prefix": False}), ("torch-packed", {})),
            }[args.compare]
            engines = {name: build_trainer(random_llama(shape, seed=0), GRPOConfig(
                lr=1e-6, micro_batch_size=args.micro_batch, gradient_checkpointing=args.gradient_checkpointing,
                **extra)) for name, extra in variants}
            for name, runs in interleaved(engines, batch, args.repeats).items():
                report(f"{shape} {name}", statistics.median(runs), "tokens/s", runs)
            del engines
    print(f"load average {os.getloadavg()[0]:.1f} at end (other jobs on the machine slow every figure)")


if __name__ == "__main__":
    main()
