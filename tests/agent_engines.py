"""Real models and engines shared by every agent integration test in one pytest process.

Model directories live in the runtime's cache ($COEVOLVE_HOME, built once per machine); each engine is
built once per process on first use and closed at exit, so the tests that need one share its
start-up cost.
"""
from __future__ import annotations

import atexit
from functools import lru_cache
from pathlib import Path

from coevolve.services.agent.config import BackendConfig
from coevolve.services.agent.models import SMOLLM2, TINY_RANDOM, resolve_model
from coevolve.services.runtime.config import load

# Small enough that two engines and the model copies fit beside the other test processes; float32 so
# that vLLM and transformers can be compared token for token.
ENGINE = {"kv_cache_gib": 1.0, "max_model_len": 6144, "enforce_eager": True, "dtype": "float32"}


def backend_config(**overrides) -> BackendConfig:
    return load(BackendConfig, "agent", {**ENGINE, **overrides})


@lru_cache(maxsize=None)
def model_dir(name: str) -> Path:
    return resolve_model(name, backend_config().coevolve_home)


@lru_cache(maxsize=None)
def vllm_backend(name: str = SMOLLM2):
    from coevolve.services.agent.vllm_backend import VllmBackend

    backend = VllmBackend(str(model_dir(name)), backend_config(model=name), model_name=name)
    atexit.register(backend.close)
    return backend


@lru_cache(maxsize=None)
def hf_backend(name: str = SMOLLM2):
    from coevolve.services.agent.hf_backend import TransformersBackend

    return TransformersBackend(str(model_dir(name)), backend_config(model=name, backend="transformers"),
                               model_name=name)


__all__ = ["SMOLLM2", "TINY_RANDOM", "backend_config", "hf_backend", "model_dir", "vllm_backend"]
