"""Generation backends behind one interface: vLLM in-process, transformers, OpenAI-compatible HTTP."""
from __future__ import annotations

from coevolve.services.agent.generation import Backend, BackendStats, Completion, Request
from coevolve.services.agent.config import BackendConfig


def make_backend(config: BackendConfig) -> Backend:
    """The configured backend, with its model resolved (and built on first use) for local ones."""
    if config.backend == "vllm-server":
        from coevolve.services.runtime.config import ConfigError
        raise ConfigError("vllm-server is the learner's rollout fleet; another service reaches a vLLM server "
                          "with --backend openai --base-url http://HOST:PORT/v1")
    if config.backend == "openai":
        from coevolve.services.agent.openai_backend import OpenAIBackend
        return OpenAIBackend(config)
    import torch

    from coevolve.services.agent.models import resolve_model

    if config.cpu_threads:
        # torch._C's own: once a vLLM engine exists in the process, torch.set_num_threads is a no-op (vllm_quirks)
        torch._C.set_num_threads(config.cpu_threads)
    model_dir = str(resolve_model(config.model, config.coevolve_home))
    if config.backend == "vllm":
        from coevolve.services.agent.vllm_backend import VllmBackend
        return VllmBackend(model_dir, config, model_name=config.model)
    from coevolve.services.agent.hf_backend import TransformersBackend
    return TransformersBackend(model_dir, config, model_name=config.model)


__all__ = ["Backend", "BackendStats", "Completion", "Request", "make_backend"]
