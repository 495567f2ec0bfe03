"""Trainers: one `update(batch) -> metrics` over GRPO sequences, plain torch or DeepSpeed.

An update computes each sequence's loss weight over the whole batch first (`grpo.sequence_scales`),
then runs micro-batches of `micro_batch_size` sequences, each forward/backward adding its share of
the gradient, and takes one optimizer step. Because the weights are fixed per batch, the
accumulated gradient equals the full batch's, whatever the micro-batch size. With `shared_prefix`
(the default) a micro-batch is a pack of rollouts with the same prompt (`packing.py`), which is
computed once for the pack instead of once per rollout.

A trainer takes a model already prepared for its config (`build.wrap_policy`: the packing
attention, gradient checkpointing, LoRA); `build.build_trainer` does both. The reference policy for
the KL term exists only when `kl_beta > 0`: a frozen copy of the starting weights (or the `reference`
given, the same weights loaded apart), or, with LoRA, the same model with its adapters switched off
(no copy).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from coevolve.services.agent.precision import autocast_bf16
from coevolve.services.learner.trainer import grpo, packing
from coevolve.services.learner.trainer.batch import Collated, TrainSequence, collate, micro_batches
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.lora import is_lora, merged_named_parameters


class Trainer:
    """The update loop shared by every trainer; subclasses own the optimizer, the backward and the files.

    `model` must be prepared for `config` (`build.wrap_policy`); the constructor checks the parts
    that would otherwise compute something else silently, and changes nothing in the model."""

    STATS = ("loss", "pg_loss", "kl", "clipped", "abs_log_ratio", "behaviour_weight", "weight_capped")
    """What each micro-batch's loss reports, summed over the update (`metrics` makes them shares)."""

    def __init__(self, model: torch.nn.Module, config: GRPOConfig, pad_id: int = 0,
                 reference: torch.nn.Module | None = None) -> None:
        if config.shared_prefix and model.config._attn_implementation != packing.ATTENTION:
            raise ValueError("shared_prefix packs rollouts, which needs the model switched to the packing "
                             "attention first: build the trainer with build.build_trainer, or call "
                             "build.wrap_policy on the model")
        if bool(config.lora_rank) != is_lora(model):
            raise ValueError(f"lora_rank={config.lora_rank} but the model {'has no' if config.lora_rank else 'has'} "
                             "LoRA adapters: prepare it with build.wrap_policy")
        self.config = config
        self.pad_id = pad_id
        self.updates = 0
        """Updates taken (one optimizer step each), restored from a checkpoint."""
        self.reference = None
        if config.kl_beta > 0 and not is_lora(model):
            self.reference = reference if reference is not None else copy.deepcopy(model).eval().requires_grad_(False)
        self.model = model
        self.rank_times: list[dict[str, float]] = []
        """Each rank's seconds of the last update: training (forward and backward) and reduce (the rest)."""

    # Subclass hooks.
    def _forward(self, **inputs) -> torch.Tensor:
        """The policy's logits for the model inputs `inputs` (only at `logits_to_keep`)."""
        raise NotImplementedError

    def _backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def optimizer_step(self) -> float:
        """Clip, step the optimizer, zero the gradients; return the gradient norm before clipping."""
        raise NotImplementedError

    def save(self, folder: Path) -> None:
        """Write the trained weights (LoRA adapters unmerged) and the optimizer state into `folder`."""
        raise NotImplementedError

    def load(self, folder: Path) -> None:
        """Read back what `save` wrote into `folder`."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def update(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        """One GRPO update on `batch` in this process (one optimizer step); returns the update's metrics.

        Several ranks share an update through `ranks.split.SplitTrainer.update`, which takes the same steps."""
        start = self.begin(batch)
        scales = self.scales(batch)
        sums = dict.fromkeys(self.STATS, 0.0)
        for part in self.micro_batches(batch):
            for key, value in self.backward(batch, part, scales[part]).items():
                sums[key] += value
        trained = time.perf_counter()
        grad_norm = self.optimizer_step()
        seconds = self.end(start)
        self.rank_times = [{"training": trained - start, "reduce": seconds - (trained - start)}]
        return self.metrics(batch, sums, grad_norm, seconds)

    def begin(self, batch: Sequence[TrainSequence]) -> float:
        """Start an update on `batch`: the model in training mode; the perf_counter start."""
        if not batch:
            raise ValueError("update needs at least one sequence")
        start = time.perf_counter()
        self.model.train()
        return start

    def scales(self, batch: Sequence[TrainSequence]) -> torch.Tensor:
        """Each sequence's loss weight over the whole batch (`grpo.sequence_scales`)."""
        return grpo.sequence_scales(torch.tensor([s.loss_tokens for s in batch]), self.config.loss_agg)

    def micro_batches(self, batch: Sequence[TrainSequence]) -> list[list[int]]:
        """The micro-batches of `batch`, as lists of its indexes: packs with `shared_prefix`, else runs of
        `micro_batch_size` sequences."""
        size = self.config.micro_batch_size
        if self.config.shared_prefix:
            return packing.plan(batch, size)
        return [list(range(len(batch))[part]) for part in micro_batches(len(batch), size)]

    def backward(self, batch: Sequence[TrainSequence], part: Sequence[int], weights: torch.Tensor,
                 factor: int = 1) -> dict[str, float]:
        """Forward and backward of the micro-batch `part` of `batch` with loss weights `weights`, its loss
        multiplied by `factor`; the gradient adds to the update's. Returns the micro-batch's sums."""
        seqs = [batch[j] for j in part]
        mb = collate(seqs, self.pad_id).to(self.device)
        pk = packing.pack(seqs).to(self.device) if self.config.shared_prefix else None
        with torch.autocast(self.device.type, dtype=torch.bfloat16,
                            enabled=autocast_bf16(self.config.autocast, self.device.type)):
            loss, stats = self._micro_loss(mb, pk, weights.to(self.device))
        self._backward(loss * factor if factor > 1 else loss)
        return stats

    def end(self, start: float) -> float:
        """Count the update taken since `start`; its seconds."""
        self.updates += 1
        return time.perf_counter() - start

    @staticmethod
    def metrics(batch: Sequence[TrainSequence], sums: dict[str, float], grad_norm: float,
                seconds: float) -> dict[str, float]:
        """The update's metrics from the micro-batches' `sums` over the whole batch."""
        loss_tokens = sum(s.loss_tokens for s in batch)
        return {
            "loss": sums["loss"], "pg_loss": sums["pg_loss"], "kl": sums["kl"],
            "clip_fraction": sums["clipped"] / max(loss_tokens, 1), "grad_norm": grad_norm,
            "abs_log_ratio": sums["abs_log_ratio"] / max(loss_tokens, 1),
            "behaviour_weight": sums["behaviour_weight"] / max(loss_tokens, 1),
            "weight_capped_fraction": sums["weight_capped"] / max(loss_tokens, 1),
            "loss_tokens": float(loss_tokens), "tokens": float(sum(len(s.token_ids) for s in batch)),
            "sequences": float(len(batch)), "step_seconds": seconds,
        }

    def _logprobs(self, forward, mb: Collated, pk: packing.Pack | None) -> torch.Tensor:
        """(B, T) log-probs of the generated tokens under `forward` (0 elsewhere), packed or not."""
        if pk is not None:
            return pk.logprobs(forward(**pk.model_inputs()), mb.input_ids.shape, self.config.temperature)
        keep = grpo.kept_positions(mb.loss_mask)
        # No attention mask: `collate` pads on the right, so under the causal mask no real token attends
        # to padding (and padding carries no loss). A mask would make PyTorch's SDPA leave its causal
        # fast path for a kernel that keeps T x T scores per head and layer: gigabytes on a 5k-token episode.
        logits = forward(input_ids=mb.input_ids, use_cache=False, logits_to_keep=keep)
        return grpo.kept_logprobs(logits, mb.input_ids, keep, self.config.temperature)

    def _micro_loss(self, mb: Collated, pk: packing.Pack | None,
                    scales: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        logp = self._logprobs(self._forward, mb, pk)
        if cfg.max_policy_lag:  # one optimizer step per update: the policy before it is the proximal one
            pg, clipped, weight = grpo.decoupled_pg_loss(logp, logp.detach(), mb.old_logprobs, mb.advantages,
                                                         mb.loss_mask, cfg.clip_low, cfg.clip_high,
                                                         cfg.behaviour_weight_cap)
        else:
            pg, clipped = grpo.clipped_pg_loss(logp, mb.old_logprobs, mb.advantages, mb.loss_mask,
                                               cfg.clip_low, cfg.clip_high)
            weight = torch.ones_like(logp)
        pg_loss = grpo.aggregate(pg, mb.loss_mask, scales)
        loss, kl_value = pg_loss, 0.0
        if cfg.kl_beta > 0:
            kl = grpo.aggregate(grpo.k3_kl(logp, self._reference_logprobs(mb, pk), mb.loss_mask),
                                mb.loss_mask, scales)
            loss = pg_loss + cfg.kl_beta * kl
            kl_value = float(kl.detach())
        # every micro-batch runs before the update's optimizer step, so this is the rollout/trainer mismatch
        gap = (logp.detach() - mb.old_logprobs).abs()
        drift = float(torch.where(mb.loss_mask.bool(), gap, torch.zeros_like(gap)).sum())
        keep = mb.loss_mask.bool()
        capped = keep & (weight >= cfg.behaviour_weight_cap)
        return loss, {"loss": float(loss.detach()), "pg_loss": float(pg_loss.detach()), "kl": kl_value,
                      "clipped": float(clipped.sum()), "abs_log_ratio": drift,
                      "behaviour_weight": float(weight[keep].sum()), "weight_capped": float(capped.sum())}

    @torch.no_grad()
    def _reference_logprobs(self, mb: Collated, pk: packing.Pack | None) -> torch.Tensor:
        if self.reference is not None:
            return self._logprobs(lambda **inputs: self.reference(**inputs).logits, mb, pk)
        with self.policy_module.disable_adapter():
            return self._logprobs(self._forward, mb, pk)

    @property
    def policy_module(self) -> torch.nn.Module:
        """The (possibly peft-wrapped) transformers model, outside any wrapper (DeepSpeed's engine)."""
        return self.model

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of the full policy under transformers' names, LoRA merged: what vLLM loads."""
        module = self.policy_module
        if is_lora(module):
            yield from merged_named_parameters(module, self._full_parameters(module.get_base_model()))
            return
        yield from self._full_parameters(module)

    def _full_parameters(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """`module`'s (name, whole tensor) in order; a sharding trainer gathers each (every rank together)."""
        for name, param in module.named_parameters():
            yield name, param.detach()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights (LoRA merged), detached and on CPU."""
        return {name: tensor.cpu().clone() for name, tensor in self.named_parameters()}


class TorchTrainer(Trainer):
    """Plain torch: AdamW over the trainable parameters, gradient-norm clipping."""

    def __init__(self, model: torch.nn.Module, config: GRPOConfig, pad_id: int = 0) -> None:
        super().__init__(model, config, pad_id)
        self._wrap()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.optimizer.zero_grad(set_to_none=True)

    def _wrap(self) -> None:
        """Change the model's parameters before the optimizer takes them (FSDP2 shards them here)."""

    def _forward(self, **inputs) -> torch.Tensor:
        return self.model(**inputs).logits

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        limit = self.config.max_grad_norm or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, limit) if params else torch.tensor(0.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # sharded: the global norm

    def save(self, folder: Path) -> None:
        torch.save(self.policy_module.state_dict(), folder / "policy.pt")
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

    def load(self, folder: Path) -> None:
        self.policy_module.load_state_dict(torch.load(folder / "policy.pt", weights_only=True))
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))


class PolicyWeights:
    """The policy's (name, tensor) pairs as a push reads them: each pass calls `named_parameters` anew,
    so a sharded trainer gathers one tensor at a time (with every rank) and nothing holds them all."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.trainer.named_parameters())
