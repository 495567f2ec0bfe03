"""Test helpers of the agent runtime: a byte-level ChatML tokenizer and a scripted backend.

The tokenizer is built in memory (every byte one token, three special tokens), so unit tests exercise
real templating and tokenization without a model. The scripted backend answers each request with text
from a script and tokenizes it like a model would emit it (ending with `<|im_end|>` unless cut by the
token limit), with known log-probabilities, so the episode driver's bookkeeping can be checked exactly.
"""
from __future__ import annotations

from typing import Callable, Sequence

from coevolve.services.agent.generation import BackendStats, Completion, CountedTensors, Push, Request
from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.templates import ChatTemplate
from coevolve.services.envs.base import StepResult

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def byte_tokenizer():
    """A ChatML tokenizer with one token per byte, built without any download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|pad|>",
                                  "additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


Script = Callable[[Request], "str | Exception"]


class ScriptedBackend:
    """A backend whose every answer comes from `script`; an Exception answer is a failed request."""

    name = "scripted"
    model = "scripted"

    def __init__(self, tokenizer, script: Script):
        self.tokenizer = self.codec = tokenizer
        self.template = ChatTemplate(tokenizer)
        self.script = script
        self.version = 0
        self.stats = BackendStats()
        self.batches: list[list[Request]] = []
        self.completions: list[Completion] = []

    @staticmethod
    def logprob(position: int) -> float:
        return -0.01 * (position + 1)

    def generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        self.batches.append(list(requests))
        out = []
        for request in requests:
            reply = self.script(request)
            if isinstance(reply, Exception):
                out.append(Completion.failed(str(reply), self.version))
                continue
            ids = self.codec.encode(reply, add_special_tokens=False)
            budget = request.max_new_tokens or sampling.max_new_tokens
            if len(ids) >= budget:
                ids, reason = ids[:budget], "length"
            else:
                ids, reason = ids + [self.codec.eos_token_id], "stop"
            out.append(Completion(text=self.codec.decode(ids, skip_special_tokens=True), token_ids=tuple(ids),
                                  logprobs=tuple(self.logprob(i) for i in range(len(ids))),
                                  finish_reason=reason, policy_version=self.version))
        self.completions.extend(out)
        self.stats.count(out, 0.0)
        return out

    def update_weights(self, named_tensors, version=None) -> Push:
        counted = CountedTensors(named_tensors)
        for _ in counted:  # read as a real engine would, for the bytes
            pass
        self.version = self.version + 1 if version is None else version
        return Push(self.version, counted.nbytes, 0.0)

    def close(self) -> None:
        pass


def reference_script(task) -> Script:
    """A perfect agent for `task`: each user turn, its reference calls; after the results, a reply."""
    def script(request: Request) -> str:
        turn = sum(1 for m in request.messages if m["role"] == "user") - 1
        if request.messages[-1]["role"] == "user" and task.reference[turn]:
            return "[" + ", ".join(task.reference[turn]) + "]"
        return "Done."
    return script


class OneTurn:
    """A one-turn environment: the prompt, then the episode ends after the first answer."""

    name = "toy"

    def __init__(self):
        self.turn = 0

    def reset(self, task):
        self.turn = 0
        return [{"role": "user", "content": task.turns[0]}]

    def step(self, action):
        self.turn = 1
        return StepResult([], True, 0.0, False)

    def verdicts(self):
        return []

    def terminate(self, reason):
        self.turn = 1
        return StepResult([], True, 0.0, False, {"terminated": reason})
