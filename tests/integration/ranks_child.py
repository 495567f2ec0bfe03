"""One rank of test_learner_ranks (run under torchrun): train one update on a fixed batch, write the result.

    python -m torch.distributed.run --nproc-per-node N -m tests.integration.ranks_child ENGINE OUT [options]

ENGINE is torch (one process, no group), fsdp or a DeepSpeed JSON file. Every rank builds the same
random model (with --model-dir, the learner's way instead: `build.load_trainer`, where no rank may
hold the whole model), takes the same batch, trains its share (Trainer.update), then all gather the weights; rank
0 drives the others as the learner does (ranks.Driver / ranks.follow) and writes the metrics, the
per-rank timings and the trained weights to OUT (a torch file); with --checkpoint DIR, the checkpoint
into DIR, read back into a fresh engine.
"""
import argparse
import os

import torch
import torch.distributed as dist

from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.build import build_trainer, load_trainer, wrap_policy
from coevolve.services.learner.loop import checkpoint as ckpt
from coevolve.services.learner.ranks.driver import Driver, follow
from coevolve.services.learner.ranks.group import Ranks, init_group, leave, release
from bench.shapes import random_llama
from coevolve.services.learner.trainer.trainer import PolicyWeights
from tests.unit.test_fleet_stream import Group, push_round

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256)


def grouped_batch(tasks=3, k=3, seed=1, vocab=256) -> list[TrainSequence]:
    """`tasks` prompts of different lengths, `k` rollouts each with their own continuation and advantage."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(tasks):
        prompt = torch.randint(0, vocab, (6 + 4 * t,), generator=gen).tolist()
        for i in range(k):
            tail = torch.randint(0, vocab, (5 + 3 * i,), generator=gen).tolist()
            mask = [0] * len(prompt) + [1] * len(tail)
            logprobs = [-float(torch.rand(1, generator=gen)) - 5.0 if m else 0.0 for m in mask]
            out.append(TrainSequence(prompt + tail, mask, logprobs, advantage=float((t + i) % 3) - 1.0))
    return out


def small_llama():
    return random_llama("tiny", seed=0, **SMALL)


def loaded_engine(kind: str, model_dir: str, config: dict, ranks: Ranks):
    """`load_trainer` as a learner's rank calls it. Under FSDP2 a rank other than 0 that reads the weights
    fails; under ZeRO-3 a rank that loads any whole tensor fails."""
    from transformers import AutoModelForCausalLM

    read = AutoModelForCausalLM.from_pretrained

    def refused(*args, **kwargs):
        raise AssertionError(f"rank {ranks.rank} read the weights")

    def partitioned(*args, **kwargs):
        model = read(*args, **kwargs)
        whole = [name for name, param in model.named_parameters() if param.numel()]
        assert not whole, f"rank {ranks.rank} loaded whole tensors: {whole[:3]}"
        return model

    if kind != "fsdp":
        AutoModelForCausalLM.from_pretrained = partitioned
        config = {**config, "deepspeed_config": kind}
    elif not ranks.driver:
        AutoModelForCausalLM.from_pretrained = refused
    return load_trainer(model_dir, GRPOConfig(**config), pad_id=0, seed=0, device=ranks.device())


def engine_for(kind: str, config: dict):
    model = small_llama()
    torch.manual_seed(0)  # LoRA's A matrices: the same on every rank and in every run (the learner seeds too)
    if kind == "torch":
        return build_trainer(model, GRPOConfig(**config))
    if kind == "fsdp":  # FSDP2 at any world size, one rank included
        from coevolve.services.learner.trainer.fsdp_trainer import FSDPTrainer

        grpo = GRPOConfig(**config)
        return FSDPTrainer(wrap_policy(model, grpo), grpo)
    return build_trainer(model, GRPOConfig(**config, deepspeed_config=kind))


def pushed(driver: Driver) -> torch.Tensor:
    """What one gloo round of a push sends (the policy streamed from every rank, 4 KiB chunks), flat."""
    group = Group()
    push_round(PolicyWeights(driver), group, chunk_bytes=4096, dtype=None)
    return torch.cat(group.sent)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("engine")
    parser.add_argument("out")
    parser.add_argument("--lora", type=int, default=0)
    parser.add_argument("--packed", action="store_true")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--model-dir", default="", help="build the engine with build.load_trainer")
    parser.add_argument("--kl", type=float, default=0.0, help="kl_beta (a reference policy)")
    args = parser.parse_args()
    ranks = Ranks.from_env()
    init_group(ranks)
    if args.model_dir:  # rank 0 writes the model the ranks load
        if ranks.driver:
            small_llama().save_pretrained(args.model_dir)
        dist.barrier()
    if args.engine == "fsdp" and not ranks.many:  # FSDP2 on one rank still needs a group
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo")
    config = dict(lr=1e-3, micro_batch_size=args.micro_batch, shared_prefix=args.packed, lora_rank=args.lora,
                  gradient_checkpointing=args.checkpointing, kl_beta=args.kl)
    if args.model_dir:
        engine = loaded_engine(args.engine, args.model_dir, config, ranks)
    else:
        engine = engine_for(args.engine, config)
    out = {"trainer": type(engine).__name__, "world": ranks.world_size, "reloaded": None}
    if ranks.driver:  # rank 0 drives, as the learner service does
        driver = Driver(engine)
        out["start"] = driver.state_dict()
        out["metrics"] = driver.update(grouped_batch())
        out["times"] = engine.rank_times
        out["weights"] = driver.state_dict()
        out["pushed"] = pushed(driver)
        out["after_push"] = driver.state_dict()  # the ranks are in step after a push's passes
        if args.checkpoint:
            ckpt.save_checkpoint(args.checkpoint, driver, step=1, run_id="r", policy_version=1, sampler={},
                                 config={})
            release()  # the group stays for the fresh engine below
        else:
            driver.close()
    else:
        follow(engine)
    if args.checkpoint:  # a fresh engine reads the checkpoint back
        fresh = engine_for(args.engine, config)
        if ranks.driver:
            driver = Driver(fresh)
            driver.load(ckpt.step_dir(args.checkpoint, 1))
            out["reloaded"] = driver.state_dict()
            driver.close()
        else:
            follow(fresh)
    if ranks.driver:
        torch.save(out, args.out)
    if dist.is_initialized():
        dist.destroy_process_group()
    leave()


if __name__ == "__main__":
    main()
