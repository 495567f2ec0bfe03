"""transformers `generate`: the fallback where vLLM is absent, and the reference vLLM is tested against.

Requests are left-padded into batches of `batch_size`. Log-probabilities come from each step's
processed scores (`output_scores`: logits divided by the temperature, top-p applied), the
distribution the token was sampled from and the one vLLM reports (`vllm_quirks`). There is no prefix cache: every turn
of every episode recomputes its whole prompt, which is why vLLM is the default for rollouts.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Sequence

from coevolve.services.agent.generation import (BackendStats, Completion, CountedTensors, Push, Request,
                                                 TakingTurns, request_seed)
from coevolve.services.agent.config import BackendConfig, SamplingConfig
from coevolve.services.agent.precision import default_device, resolve_dtype
from coevolve.services.agent.templates import ChatTemplate


class TransformersBackend(TakingTurns):
    """A Hugging Face causal LM generating in batches on CPU or one GPU."""

    name = "transformers"

    def __init__(self, model_dir: str, config: BackendConfig, model_name: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = default_device()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = model_name or model_dir
        dtype = getattr(torch, resolve_dtype(config.dtype, self.device))
        self.net = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.net.to(self.device).eval()
        self.template = ChatTemplate(self.tokenizer)
        self.stop_ids = self.template.stop_token_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.batch_size = config.batch_size
        self.max_model_len = config.max_model_len
        self.version = 0
        self.lock = threading.Lock()
        self.stats = BackendStats()
        self._calls = 0

    def _generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        """Generate in batches of `batch_size`; a batch that raises fails its requests alone."""
        self._calls += 1
        started = time.monotonic()
        prompts = [r.ids(self.template) for r in requests]
        results: list[Completion] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = range(start, min(start + self.batch_size, len(requests)))
            try:
                results.extend(self._generate_batch([prompts[i] for i in chunk], [requests[i] for i in chunk],
                                                    sampling, request_seed(sampling, self._calls, start)))
            except Exception as exc:  # a failed batch becomes failed completions, never a crash
                results.extend(Completion.failed(f"transformers generate failed: {type(exc).__name__}: {exc}",
                                                 self.version) for _ in chunk)
        self.stats.requests += len(results)
        self.stats.errors += sum(r.error is not None for r in results)
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        self.stats.completion_tokens += sum(r.completion_tokens for r in results)
        self.stats.seconds += time.monotonic() - started
        return results

    def _generate_batch(self, prompts: list[list[int]], requests: Sequence[Request], sampling: SamplingConfig,
                        seed: int | None) -> list[Completion]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        budgets = [r.budget(sampling, len(p), self.max_model_len) for r, p in zip(requests, prompts)]
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        if seed is not None:
            torch.manual_seed(seed)
        kwargs: dict[str, Any] = {"do_sample": not sampling.greedy}
        if not sampling.greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with torch.no_grad():
            out = self.net.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max(budgets),
                                    eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                                    return_dict_in_generate=True, output_scores=True, **kwargs)
        generated = out.sequences[:, width:].tolist()
        logprobs = torch.stack(out.scores, dim=1).float().log_softmax(-1) if out.scores else None
        return [self._completion(row, logprobs[b] if logprobs is not None else None, budgets[b], len(prompts[b]),
                                 sampling) for b, row in enumerate(generated)]

    def _completion(self, row: list[int], logprobs: Any, budget: int, prompt_len: int,
                    sampling: SamplingConfig) -> Completion:
        ids, reason = [], "length"
        for token in row[:budget]:
            ids.append(token)
            if token in self.stop_ids:
                reason = "stop"
                break
        lps = tuple(float(logprobs[t, token]) for t, token in enumerate(ids)) if logprobs is not None else ()
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for stop in sampling.stop:
            if stop in text:
                text, reason = text[:text.index(stop)], "stop"
        return Completion(text=text, token_ids=tuple(ids), logprobs=lps, finish_reason=reason,
                          policy_version=self.version, prompt_tokens=prompt_len)

    def _update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int | None = None) -> Push:
        """Copy (name, tensor) pairs into the model's parameters."""
        started = time.monotonic()
        counted = CountedTensors(named_tensors)
        state = dict(counted)
        missing = set(state) - set(self.net.state_dict())
        if missing:
            raise KeyError(f"unknown parameter names: {sorted(missing)[:5]}")
        self.net.load_state_dict(state, strict=False)
        self.version = self.version + 1 if version is None else version
        return Push(self.version, counted.nbytes, time.monotonic() - started)

    def close(self) -> None:
        self.net = None
