"""Supervised warm-up before GRPO (a cold start): teach the policy to call tools in BFCL's format.

A 135M or random-weight model makes no parseable tool call on BFCL, so every group's rewards are
equal and GRPO has no gradient. The warm-up plays each seed task's reference calls through the real
environment with a scripted backend (`ReferenceBackend`), so each example has exactly the tokens and
loss mask a rollout making those calls would have, and minimizes the cross-entropy of the masked
tokens. It sees the train split only; evaluation stays on the held-out split.

The warmed model is a directory in `<home>/models/`, named by a hash of everything that shapes it
(base model, settings, tasks, episode limits), built once under the models' file lock and reused by
later runs and by `--resume`.
"""
from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn, Sequence

from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
from coevolve.services.agent.generation import BackendStats, Completion, Request
from coevolve.services.agent.precision import autocast_bf16
from coevolve.services.envs.base import Task
from coevolve.services.learner.config import GRPOConfig, WarmupConfig
from coevolve.services.runtime.log import get_logger

RECIPE = 1
"""Version of the warm-up recipe; a model warmed by another recipe is trained again."""
TURN_END = "Done."
"""What the scripted assistant says after a turn's calls, ending the turn (any non-call text would)."""
log = get_logger("learner")


class ReferenceBackend:
    """A backend that answers one task's episode with its reference: each turn's calls as a BFCL call
    list, then `TURN_END`. Turns whose reference is empty get `TURN_END` at once."""

    name = "reference"

    def __init__(self, task: Task, template: Any):
        self.task, self.template, self.tokenizer = task, template, template.tokenizer
        self.model, self.version, self.stats = "reference", 0, BackendStats()
        self.stop_id = template.stop_token_ids()[-1]
        self.answered: set[int] = set()

    def generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Request) -> Completion:
        turn = sum(1 for m in request.messages if m.get("role") == "user") - 1
        calls = self.task.reference[turn] if 0 <= turn < len(self.task.reference) else ()
        text = TURN_END
        if calls and turn not in self.answered:
            self.answered.add(turn)
            text = f"[{', '.join(calls)}]"
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self.stop_id,)
        return Completion(text=text, token_ids=ids, logprobs=(0.0,) * len(ids))

    def update_weights(self, named_tensors: Any, version: int | None = None) -> NoReturn:
        raise NotImplementedError("the reference backend has no weights")

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True)
class Example:
    token_ids: list[int]
    loss_mask: list[int]
    task_id: str


def reference_examples(tasks: Sequence[Task], template: Any, limits: EpisodeLimits) -> tuple[list[Example], int]:
    """One example per scored task whose reference episode passes every turn it plays; and how many
    were left out (unscored, failing in the environment, or cut by the context limit)."""
    from coevolve.services.agent.episodes import run_episodes

    examples, left_out = [], 0
    for task in tasks:
        if not task.scored:
            left_out += 1
            continue
        episode = run_episodes([task], task.env, ReferenceBackend(task, template), SamplingConfig(), limits)[0]
        if episode.truncated and not episode.truncated.startswith("user-turn limit") or episode.score <= 0:
            left_out += 1
            continue
        examples.append(Example(list(episode.token_ids), list(episode.loss_mask), task.task_id))
    return examples, left_out


def warm_key(base: Path, warm: WarmupConfig, grpo: GRPOConfig, seed: int, tasks: Sequence[Task],
             limits: EpisodeLimits) -> str:
    """A hash of everything that shapes the warmed weights."""
    marker = base / "coevolve-model.json"
    identity = marker.read_text() if marker.is_file() else (base / "config.json").read_text()
    autocast = "bf16" if autocast_bf16(grpo.autocast, "cpu") else "off"  # as resolved on this machine
    blob = json.dumps({"recipe": RECIPE, "base": identity, "warmup": asdict(warm), "seed": seed,
                       "autocast": autocast, "tasks": [t.task_id for t in tasks],
                       "limits": asdict(limits)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def warm_model(base_name: str, home: Path, warm: WarmupConfig, grpo: GRPOConfig, seed: int, tasks: Sequence[Task],
               limits: EpisodeLimits) -> Path:
    """The warmed model's directory, trained on first use (on each task once)."""
    from coevolve.services.agent.models import cached_model, resolve_model

    tasks = list({t.task_id: t for t in tasks}.values())
    base = resolve_model(base_name, home)
    name = f"{base.name}-warm-{warm_key(base, warm, grpo, seed, tasks, limits)}"
    return cached_model(home, name, lambda out, _home: train(base, out, warm, grpo, seed, tasks, limits))


def train(base: Path, out: Path, warm: WarmupConfig, grpo: GRPOConfig, seed: int, tasks: Sequence[Task],
          limits: EpisodeLimits) -> str:
    """Fine-tune `base` on the reference episodes and save it (with its tokenizer) into `out`."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coevolve.services.agent.templates import ChatTemplate

    tokenizer = AutoTokenizer.from_pretrained(base)
    examples, left_out = reference_examples(tasks, ChatTemplate(tokenizer), limits)
    if warm.warmup_window:
        examples = [w for e in examples for w in windows(e, warm.warmup_window)]
    if not examples:
        raise RuntimeError(f"no reference episode of the {len(tasks)} seed tasks passed in the environment, so "
                           "there is nothing to warm up on; set learner.warmup_steps=0 or add scored tasks")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if grpo.gradient_checkpointing and not warm.warmup_window:  # windows are short
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=warm.warmup_lr, weight_decay=0.0)
    order = _batches(len(examples), warm.warmup_batch, warm.warmup_steps, seed)
    losses, started = [], time.perf_counter()
    log.info("learner.warmup_started", base=str(base), examples=len(examples), left_out=left_out,
             steps=warm.warmup_steps, batch=warm.warmup_batch, lr=warm.warmup_lr)
    with tqdm(total=warm.warmup_steps, desc="warm-up", unit="step", file=sys.stderr) as bar:
        for batch in order:
            losses.append(_optimizer_step(model, optimizer, [examples[i] for i in batch], grpo))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    report = {"base": str(base), "examples": len(examples), "left_out": left_out, "losses": losses,
              "seconds": round(time.perf_counter() - started, 1), **asdict(warm)}
    (out / "warmup.json").write_text(json.dumps(report, indent=1))
    log.info("learner.warmup_finished", first_loss=round(losses[0], 4), last_loss=round(losses[-1], 4),
             seconds=report["seconds"], out=str(out))
    return f"warm-up of {base.name}: {warm.warmup_steps} steps on {len(examples)} reference episodes"


def windows(example: Example, size: int) -> list[Example]:
    """One example per generated reply: the reply and the `size` tokens before it."""
    ids, mask, out, start = example.token_ids, example.loss_mask, [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            lo = max(0, start - size)
            out.append(Example(ids[lo:i], mask[lo:i], example.task_id))
            start = None
    return out


def _batches(n: int, size: int, steps: int, seed: int) -> list[list[int]]:
    """`steps` batches of `size` example indexes: a seeded shuffle, reshuffled at each pass."""
    rng, pool, out = random.Random(seed), [], []
    for _ in range(steps):
        batch = []
        while len(batch) < min(size, n):
            if not pool:
                pool = list(range(n))
                rng.shuffle(pool)
            batch.append(pool.pop())
        out.append(batch)
    return out


def _optimizer_step(model, optimizer, batch: list[Example], grpo: GRPOConfig) -> float:
    """One optimizer step of token-mean cross-entropy over the batch's masked tokens; the mean loss."""
    import torch

    from coevolve.services.learner.trainer import grpo as maths

    total = sum(sum(e.loss_mask) for e in batch)
    loss_sum = 0.0
    bf16 = autocast_bf16(grpo.autocast, "cpu")  # the warm-up trains on the CPU
    for example in batch:  # one episode per forward: episodes are thousands of tokens long
        ids = torch.tensor([example.token_ids])
        mask = torch.tensor([example.loss_mask], dtype=torch.float32)
        keep = maths.kept_positions(mask)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits
        logp = maths.kept_logprobs(logits, ids, keep)
        loss = -(logp * mask).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.max_grad_norm or float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum
