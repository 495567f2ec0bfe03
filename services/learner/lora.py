"""LoRA through peft: wrap the policy, and export merged weights under the base model's names.

peft renames an adapted linear `q_proj.weight` to `q_proj.base_layer.weight` and adds `lora_A` /
`lora_B`; an inference engine loading weights wants the plain names with W + scale * B @ A. The merge
is computed on the fly, so the trained model is never modified (peft's `merge_adapter` would round
the base weights on every push).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch


def add_lora(model: torch.nn.Module, config) -> torch.nn.Module:
    """Freeze `model` and add LoRA adapters of `config.lora_rank` on `config.lora_target_modules`."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=config.lora_target_modules, bias="none")
    return get_peft_model(model, lora)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft model (has adapters to switch off and merge)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def merged_named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the base model with every active adapter merged in; no lora_* entries."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, param in base.named_parameters():
        if "lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".base_layer.")
        if not owner:
            yield name, param.detach()
            continue
        layer = adapted.get(owner)
        merge = layer is not None and leaf == "weight" and not layer.disable_adapters
        # no_grad around the merge only: held across a yield, it would stay on in the caller's thread
        # whenever the caller stops iterating early (zip over two engines' parameters did)
        yield f"{owner}.{leaf}", _merged(layer, param) if merge else param.detach()


def _merged(layer, weight: torch.Tensor) -> torch.Tensor:
    """`weight` plus the delta of each of `layer`'s active adapters."""
    with torch.no_grad():
        tensor = weight.detach()
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                tensor = tensor + layer.get_delta_weight(adapter)
        return tensor
