"""FSDP2: the policy sharded across the ranks with `torch.distributed.fsdp.fully_shard`.

Each decoder layer (the model's `_no_split_modules`) is its own FSDP unit and the whole model the
root, so a forward gathers one layer's weights at a time and the backward reduce-scatters its
gradients; every rank keeps a 1/N shard of the weights, the gradients and AdamW's moments. With
`autocast` bf16 the units compute in bfloat16 (`MixedPrecisionPolicy`), gradients reduced in float32,
weights and moments kept in float32. LoRA adapters, gradient checkpointing and the packing attention
are set before sharding (`engines.prepare_policy`) and shard with the rest; frozen base weights are
sharded too. The KL reference, when asked for, is a whole copy on every rank.

Checkpoints are `torch.distributed.checkpoint` folders (`dcp/`): each rank writes its shard of the
weights and of the optimizer state, and reads back whatever shards it needs, so a checkpoint loads at
another world size too. The push gathers each parameter's full tensor (`DTensor.full_tensor`, every
rank together), one at a time.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from coevolve.services.agent.precision import autocast_bf16
from coevolve.services.learner.engine import TorchEngine


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP shards one by one: those of the classes transformers keeps whole on a device."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"{type(base).__name__} names no decoder layer class (_no_split_modules); FSDP2 would "
                         "gather the whole model at once")
    return layers


class FSDPEngine(TorchEngine):
    """FSDP2 around the (prepared) policy; AdamW over the sharded trainable parameters."""

    def _wrap(self) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy()
        if autocast_bf16(self.config.autocast, self.device.type):
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in decoder_layers(self.model):
            fully_shard(layer, mp_policy=policy)
        fully_shard(self.model, mp_policy=policy)

    def _full_parameters(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        from torch.distributed.tensor import DTensor

        for name, param in module.named_parameters():
            yield name, (param.full_tensor() if isinstance(param, DTensor) else param).detach()

    def _state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def save(self, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=str(folder / "dcp"))

    def load(self, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=str(folder / "dcp"))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
