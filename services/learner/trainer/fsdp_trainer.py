"""FSDP2: the policy sharded across the ranks with `torch.distributed.fsdp.fully_shard`.

Each decoder layer (the model's `_no_split_modules`) is its own FSDP unit and the whole model the
root, so a forward gathers one layer's weights at a time and the backward reduce-scatters its
gradients; every rank keeps a 1/N shard of the weights, the gradients and AdamW's moments. With
`autocast` bf16 the units compute in bfloat16 (`MixedPrecisionPolicy`), gradients reduced in float32,
weights and moments kept in float32. LoRA adapters, gradient checkpointing and the packing attention
are set before sharding (`build.wrap_policy`) and shard with the rest; frozen base weights are
sharded too. The KL reference, when asked for, is sharded the same way.

A learner's ranks build the model on the meta device (`build.load_trainer`): only rank 0 reads the
weights, on the CPU; each rank shards the empty model, allocates its shards on its own device and
takes their values from rank 0's copy, one tensor at a time (`set_model_state_dict`, broadcast from
rank 0), so no other rank, and no GPU, ever holds the whole model.

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
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.trainer import TorchTrainer


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP shards one by one: those of the classes transformers keeps whole on a device."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"{type(base).__name__} names no decoder layer class (_no_split_modules); FSDP2 would "
                         "gather the whole model at once")
    return layers


def take_from_rank0(module: torch.nn.Module, source: torch.nn.Module | None, device: torch.device) -> None:
    """Allocate the sharded meta `module` on `device` and fill it from rank 0's `source`: its state dict
    (each rank keeps its shards) and every buffer (rotary tables are not in the state dict)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if (source is not None) != (dist.get_rank() == 0):
        raise ValueError("rank 0, and only rank 0, gives the weights (source)")
    module.to_empty(device=device)
    set_model_state_dict(module, source.state_dict() if source is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    buffers = dict(source.named_buffers()) if source is not None else {}
    with torch.no_grad():
        for name, buffer in module.named_buffers():
            if source is not None:
                buffer.copy_(buffers[name])
            dist.broadcast(buffer, src=0)


class FSDPTrainer(TorchTrainer):
    """FSDP2 around the (prepared) policy; AdamW over the sharded trainable parameters.

    `model` may be on the meta device: it is then allocated on `device` once sharded, and every rank
    takes its shards of `source`, rank 0's copy of the same model prepared alike (None elsewhere)."""

    def __init__(self, model: torch.nn.Module, config: GRPOConfig, pad_id: int = 0, *,
                 source: torch.nn.Module | None = None, device: torch.device | None = None) -> None:
        self._source, self._target = source, device
        super().__init__(model, config, pad_id)
        self._source = None

    def _wrap(self) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        empty = self.device.type == "meta"
        if empty and self._target is None:
            raise ValueError("a model on the meta device needs the device to allocate its shards on")
        device = self._target if empty else self.device
        policy = MixedPrecisionPolicy()
        if autocast_bf16(self.config.autocast, device.type):
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for module in filter(None, (self.model, self.reference)):
            for layer in decoder_layers(module):
                fully_shard(layer, mp_policy=policy)
            fully_shard(module, mp_policy=policy)
            if empty:
                take_from_rank0(module, self._source, device)

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
