"""vLLM in-process: batched generation with prefix caching, and weight updates from the learner.

Every request of a `generate` call goes to the engine at once; requests that share a prefix (the
system prompt with a task's tool schemas, shared by all its rollouts and turns) reuse its cached keys
and values. The engine runs in this process (see `vllm_quirks`), so `update_weights` takes tensors.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Any, Iterable, Sequence

from coevolve.services.agent import vllm_quirks
from coevolve.services.agent.generation import (BackendStats, Completion, CountedTensors, Push, Request, TakingTurns,
                                                no_room, request_seed)
from coevolve.services.agent.config import BackendConfig, SamplingConfig
from coevolve.services.agent.precision import resolve_dtype
from coevolve.services.agent.templates import ChatTemplate


class VllmBackend(TakingTurns):
    """One in-process vLLM engine for one model."""

    name = "vllm"

    def __init__(self, model_dir: str, config: BackendConfig, model_name: str | None = None):
        vllm_quirks.prepare_environment(config.kv_cache_gib)
        from vllm import LLM

        started = time.monotonic()
        self.llm = LLM(**vllm_quirks.engine_arguments(
            model_dir, dtype=resolve_dtype(config.dtype), max_model_len=config.max_model_len,
            enforce_eager=config.enforce_eager, seed=config.seed,
            gpu_memory_utilization=config.gpu_memory_utilization))
        self.model = model_name or model_dir
        self.tokenizer = self.llm.get_tokenizer()
        self.template = ChatTemplate(self.tokenizer)
        self.version = 0
        self.lock = threading.Lock()
        self.max_model_len = config.max_model_len
        self.stats = BackendStats(extra={"startup_seconds": time.monotonic() - started})
        self.seeded = vllm_quirks.request_seeds_supported()
        self._calls = 0

    def _params(self, request: Request, sampling: SamplingConfig, seed: int | None, prompt_len: int):
        from vllm import SamplingParams

        budget = request.budget(sampling, prompt_len, self.max_model_len)
        structured = vllm_quirks.structured_params(request.json_schema) if request.json_schema else None
        return SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=budget,
                              seed=seed, stop=list(sampling.stop) or None, logprobs=0,
                              stop_token_ids=self.template.stop_token_ids(),
                              structured_outputs=structured)

    def _generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        """Generate every request in one engine call; a request the engine refuses fails alone."""
        from vllm.inputs import TokensPrompt

        self._calls += 1
        started = time.monotonic()
        results: list[Completion | None] = [None] * len(requests)
        prompts, params, slots = [], [], []
        for i, request in enumerate(requests):
            ids = request.ids(self.template)
            results[i] = no_room(len(ids), self.max_model_len, self.version)
            if results[i] is not None:
                continue
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            seed = request_seed(sampling, self._calls, i) if self.seeded and not sampling.greedy else None
            params.append(self._params(request, sampling, seed, len(ids)))
            slots.append(i)
        if prompts:
            try:
                outputs = self.llm.generate(prompts, params, use_tqdm=False)
            except Exception as exc:  # the engine's own failure; every request in the batch fails
                outputs = None
                for i in slots:
                    results[i] = Completion.failed(f"vLLM generate failed: {type(exc).__name__}: {exc}",
                                                   self.version)
            for i, output in zip(slots, outputs or ()):
                results[i] = self._completion(output)
        done = [r for r in results if r is not None]
        self.stats.count(done, time.monotonic() - started)
        return done

    def _completion(self, output: Any) -> Completion:
        out = output.outputs[0]
        ids = tuple(out.token_ids)
        logprobs = tuple(_sampled_logprob(step, token) for step, token in zip(out.logprobs or (), ids))
        reason = "length" if out.finish_reason == "length" else "stop"
        return Completion(text=out.text, token_ids=ids, logprobs=logprobs, finish_reason=reason,
                          policy_version=self.version, prompt_tokens=len(output.prompt_token_ids))

    def _update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int | None = None) -> Push:
        """Load (name, tensor) pairs, named as in the Hugging Face checkpoint, into the engine."""
        started = time.monotonic()
        counted = CountedTensors(named_tensors)
        vllm_quirks.reload_weights(self.llm, counted)
        self.version = self.version + 1 if version is None else version
        seconds = time.monotonic() - started
        self.stats.extra["last_update_seconds"] = seconds
        return Push(self.version, counted.nbytes, seconds)

    def close(self) -> None:
        import gc

        engine = getattr(self, "llm", None)
        self.llm = None
        if engine is not None:
            shutdown = getattr(engine.llm_engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
        del engine
        gc.collect()


def _sampled_logprob(step: Any, token: int) -> float:
    """The sampled token's log-probability from one position's logprob map."""
    if not step or token not in step:
        return float("nan")
    value = step[token]
    value = getattr(value, "logprob", value)
    return float(value) if value is not None and math.isfinite(value) else float("-inf")
