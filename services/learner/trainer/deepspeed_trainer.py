"""The DeepSpeed trainer, and every DeepSpeed quirk the learner works around, in one place.

- Accelerator: DeepSpeed picks its accelerator once, at import, from `DS_ACCELERATOR`. For a CPU
  model it is set to `cpu` before the first `import deepspeed` (0.19.8 also falls back to CPU when
  it finds no GPU, with a warning; being explicit keeps a GPU host from choosing CUDA for a CPU run).
- Single process: outside a launcher, `deepspeed.initialize` still joins a process group, so RANK,
  LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT get single-process values when they are unset.
  Several ranks run under torchrun, which sets them; the group is already joined (`ranks.group.init_group`:
  gloo on CPU, where DeepSpeed's own choice would be oneCCL) and DeepSpeed uses it.
- ZeRO-3 partitions every parameter: the push gathers them one at a time (`GatheredParameters`), and
  a checkpoint is DeepSpeed's, one file of partitions per rank, read back at the same world size only.
  A learner's ranks load the weights already partitioned (`build.load_trainer`: transformers'
  `HfDeepSpeedConfig` puts `from_pretrained` under `deepspeed.zero.Init`), and so the KL reference,
  which then computes inside a DeepSpeed engine of its own.
- First start on CPU JIT-builds a shared-memory communication op (about a minute here; cached in
  ~/.cache/torch_extensions afterwards).
- Variable micro-batch counts: a GRPO batch's sequences vary in number and length, so DeepSpeed's
  fixed `gradient_accumulation_steps` does not fit. `managed_gradient_accumulation: false` (0.19)
  makes `backward()` only accumulate and `step()` the boundary; `backward(scale_wrt_gas=False)`
  because the loss weights already normalize over the whole batch.
- The JSON config names the ZeRO stage and precision; the learner's config overrides the micro-batch
  size, gradient clipping and the optimizer's lr and weight decay, so one source decides those.
  Without an `optimizer` section the learner passes torch's AdamW; with one, DeepSpeed's Adam
  JIT-builds its fused op on first use (about two minutes on CPU here) unless `"torch_adam": true`.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from coevolve.services.learner.config import GRPOConfig, read_deepspeed_config
from coevolve.services.learner.trainer.trainer import Trainer
from coevolve.services.runtime.ports import free_port


def import_deepspeed(device: torch.device):
    """Import deepspeed with its accelerator and single-process rendezvous set up for `device`."""
    if "deepspeed" not in sys.modules and device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    import deepspeed

    return deepspeed


def deepspeed_settings(config: GRPOConfig) -> dict:
    """The JSON config with the learner's own settings laid over it."""
    settings = read_deepspeed_config(config.deepspeed_config)
    settings.pop("train_batch_size", None)
    settings.update(train_micro_batch_size_per_gpu=config.micro_batch_size, gradient_accumulation_steps=1,
                    managed_gradient_accumulation=False, gradient_clipping=config.max_grad_norm)
    if "optimizer" in settings:
        params = settings["optimizer"].setdefault("params", {})
        params.update(lr=config.lr, weight_decay=config.weight_decay)
    return settings


class DeepSpeedTrainer(Trainer):
    """DeepSpeed ZeRO (stage 0-3 from the JSON config) around the policy."""

    def __init__(self, model: torch.nn.Module, config: GRPOConfig, pad_id: int = 0,
                 reference: torch.nn.Module | None = None) -> None:
        super().__init__(model, config, pad_id, reference)
        deepspeed = import_deepspeed(next(model.parameters()).device)
        settings = deepspeed_settings(config)
        if self.reference is not None and any(hasattr(p, "ds_id") for p in self.reference.parameters()):
            # a partitioned reference computes only inside a DeepSpeed engine of its own (no optimizer)
            self.reference = deepspeed.initialize(model=self.reference, config={
                k: v for k, v in settings.items() if k not in ("optimizer", "scheduler")})[0]
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = None
        if "optimizer" not in settings:
            optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.ds, self.optimizer, _, _ = deepspeed.initialize(
            model=self.model, optimizer=optimizer, model_parameters=params if optimizer is None else None,
            config=settings)
        self.model = self.ds

    @property
    def policy_module(self) -> torch.nn.Module:
        return self.ds.module

    def _forward(self, **inputs) -> torch.Tensor:
        return self.ds(**inputs).logits

    def _full_parameters(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """ZeRO-3 partitions each parameter (`ds_id`): gathered one at a time, every rank together."""
        from deepspeed.runtime.zero import GatheredParameters

        for name, param in module.named_parameters():
            if not hasattr(param, "ds_id"):
                yield name, param.detach()
                continue
            with GatheredParameters([param], modifier_rank=None):
                tensor = param.data.detach().clone()
            yield name, tensor

    def _backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss, scale_wrt_gas=False)

    def optimizer_step(self) -> float:
        self.ds.step()
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def save(self, folder: Path) -> None:
        """DeepSpeed's own checkpoint (its optimizer state may be partitioned) in `folder/deepspeed`."""
        self.ds.save_checkpoint(str(folder / "deepspeed"), tag="model")

    def load(self, folder: Path) -> None:
        self.ds.load_checkpoint(str(folder / "deepspeed"), tag="model")
