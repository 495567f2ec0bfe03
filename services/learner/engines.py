"""Pick the training engine a learner config asks for."""
from __future__ import annotations

import torch

from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.engine import Engine, TorchEngine


def build_engine(model: torch.nn.Module, config: GRPOConfig, pad_id: int = 0) -> Engine:
    """DeepSpeed when `config.deepspeed_config` names a file, plain torch otherwise."""
    if config.deepspeed_config:
        # Imported here: importing deepspeed picks its accelerator once (deepspeed_engine's docstring).
        from coevolve.services.learner.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(model, config, pad_id)
    return TorchEngine(model, config, pad_id)

