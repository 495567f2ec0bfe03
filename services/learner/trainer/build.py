"""Prepare a model for GRPO updates and pick the trainer a learner config and the ranks ask for."""
from __future__ import annotations

import torch
import torch.distributed as dist

from coevolve.services.learner.trainer import packing
from coevolve.services.learner.config import GRPOConfig, read_deepspeed_config, zero_stage
from coevolve.services.learner.trainer.trainer import Trainer, TorchTrainer
from coevolve.services.learner.trainer.lora import add_lora


def wrap_policy(model: torch.nn.Module, config: GRPOConfig) -> torch.nn.Module:
    """Ready a transformers model for the updates `config` asks for; return the model to train.

    In this order: with `shared_prefix`, switch it to the packing attention (registered with
    transformers' AttentionInterface, a process-wide registry); with `gradient_checkpointing`, turn
    that on; with `lora_rank`, wrap it in LoRA adapters (the returned model is then the peft one).
    The first two change `model` in place."""
    if config.shared_prefix:
        packing.use_shared_prefix_attention(model)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.lora_rank:
        model = add_lora(model, config)
    return model


def build_trainer(model: torch.nn.Module, config: GRPOConfig, pad_id: int = 0) -> Trainer:
    """`wrap_policy(model)` in a trainer: DeepSpeed when `config.deepspeed_config` names a file; else
    FSDP2 in a process group of several ranks, plain torch in one process."""
    model = wrap_policy(model, config)
    if config.deepspeed_config:
        # Imported here: importing deepspeed picks its accelerator once (deepspeed_trainer's docstring).
        from coevolve.services.learner.trainer.deepspeed_trainer import DeepSpeedTrainer

        return DeepSpeedTrainer(model, config, pad_id)
    if dist.is_initialized() and dist.get_world_size() > 1:
        from coevolve.services.learner.trainer.fsdp_trainer import FSDPTrainer

        return FSDPTrainer(model, config, pad_id)
    return TorchTrainer(model, config, pad_id)


def load_trainer(model_dir: str, config: GRPOConfig, pad_id: int, seed: int, device: torch.device) -> Trainer:
    """The trainer over the weights in `model_dir`, on `device`: what every rank of a learner builds alike
    (the same seed before loading, so LoRA's random adapters agree across ranks).

    With several ranks no rank holds the whole model on its device: under FSDP2 only rank 0 reads the
    weights, on the CPU, and every rank builds the model on the meta device and takes its shards from
    rank 0 (`fsdp_trainer.take_from_rank0`); under ZeRO-3 every rank loads its partitions only
    (`_zero3_trainer`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    several = dist.is_initialized() and dist.get_world_size() > 1
    if several and config.deepspeed_config and zero_stage(read_deepspeed_config(config.deepspeed_config)) == 3:
        return _zero3_trainer(model_dir, config, pad_id, device)
    if config.deepspeed_config or not several:
        policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
        return build_trainer(policy, config, pad_id)
    from coevolve.services.learner.trainer.fsdp_trainer import FSDPTrainer

    source = None
    if dist.get_rank() == 0:
        source = wrap_policy(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), config)
    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32)
    return FSDPTrainer(wrap_policy(policy, config), config, pad_id, source=source, device=device)


def _zero3_trainer(model_dir: str, config: GRPOConfig, pad_id: int, device: torch.device) -> Trainer:
    """ZeRO-3 over weights partitioned as they load: while transformers' `HfDeepSpeedConfig` lives,
    `from_pretrained` builds under `deepspeed.zero.Init` and each rank keeps its partitions only. The KL
    reference, when one is needed, is loaded the same way."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    from coevolve.services.learner.trainer.deepspeed_trainer import (DeepSpeedTrainer, deepspeed_settings,
                                                                     import_deepspeed)

    import_deepspeed(device)
    partitioning = HfDeepSpeedConfig(deepspeed_settings(config))  # transformers holds it weakly: keep it
    try:
        policy = wrap_policy(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), config)
        reference = None
        if config.kl_beta > 0 and not config.lora_rank:
            reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            reference = reference.eval().requires_grad_(False)
        return DeepSpeedTrainer(policy, config, pad_id, reference)
    finally:
        del partitioning  # later models (rank 0's rollout backend) load whole again
