"""LoRA through peft: wrap the policy, and export merged weights under the base model's names.

peft renames an adapted linear `q_proj.weight` to `q_proj.base_layer.weight` and adds `lora_A` /
`lora_B`; an inference engine loading weights wants the plain names with W + scale * B @ A. The merge
is computed on the fly, so the trained model is never modified (peft's `merge_adapter` would round
the base weights on every push).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

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


def merged_named_parameters(model: torch.nn.Module, tensors: Iterable[tuple[str, torch.Tensor]] | None = None
                            ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the base model with every active adapter merged in; no lora_* entries.

    `tensors`: the base model's (name, whole tensor) in `named_parameters` order, for a sharded policy
    whose trainer gathers them; by default the parameters themselves. An adapted weight comes before its
    lora_A and lora_B, so it is held until they have passed."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    if tensors is None:
        tensors = ((name, param.detach()) for name, param in base.named_parameters())
    held: dict[str, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
    for name, tensor in tensors:
        if "lora_" in name:  # <owner>.lora_A.<adapter>.weight
            owner, _, rest = name.partition(".lora_")
            if owner in held:
                held[owner][1][rest] = tensor
                weight, factors = held[owner]
                layer = adapted[owner]
                if all(f"{side}.{a}.weight" in factors for a in _active(layer) for side in "AB"):
                    del held[owner]
                    yield f"{owner}.weight", _merged(layer, weight, factors)
            continue
        owner, _, leaf = name.rpartition(".base_layer.")
        layer = adapted.get(owner) if owner else None
        if layer is not None and leaf == "weight" and not layer.disable_adapters and _active(layer):
            held[owner] = (tensor, {})
            continue
        yield (f"{owner}.{leaf}" if owner else name), tensor


def _active(layer) -> list[str]:
    return [adapter for adapter in layer.active_adapters if adapter in layer.lora_A]


def _merged(layer, weight: torch.Tensor, factors: dict[str, torch.Tensor]) -> torch.Tensor:
    """`weight` plus scale * B @ A of each of `layer`'s active adapters."""
    with torch.no_grad():
        tensor = weight.detach()
        for adapter in _active(layer):
            delta = factors[f"B.{adapter}.weight"] @ factors[f"A.{adapter}.weight"]
            tensor = tensor + (delta.T if layer.fan_in_fan_out else delta) * layer.scaling[adapter]
        return tensor
