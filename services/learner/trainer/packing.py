"""Shared-prompt packing: a group's K rollouts are trained as one row that holds their prompt once.

The K rollouts of a task start with the same prompt (on BFCL the system prompt, the function docs and
the first user turn: 94-97% of an episode's tokens). Unpacked, each of the K rows recomputes it in
the forward and the backward. A pack lays the rows out as

    [ prompt[:P] | seq_1[P:] | seq_2[P:] | ... ]     positions 0..P-1, then P.. again for each seq_i

and `shared_prefix_attention` lets the prompt attend causally to itself and each continuation attend
to the whole prompt and causally to itself, never to another continuation. Every token therefore
sees exactly the context it has in its own sequence: log-probs and gradients equal the unpacked ones
up to float rounding, and the prompt's forward and backward run once per pack instead of once per
rollout. P stops one token before the first generated token, so the logit that predicts each
rollout's first generated token lies in that rollout's own continuation.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from coevolve.services.learner.trainer.batch import TrainSequence, micro_batches
from coevolve.services.learner.trainer.grpo import target_logprobs

ATTENTION = "coevolve_shared_prefix"
"""The name under which the attention is registered with transformers' AttentionInterface."""


def shared_prefix_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, shared_prefix: tuple | None = None,
                            **_: object) -> tuple[torch.Tensor, None]:
    """SDPA over a packed row (B = 1), laid out by `shared_prefix` = (P, ((start, end), ...)).

    Without a layout it is plain causal SDPA (or SDPA under `attention_mask` when one is given), so a
    model switched to this attention computes as before on ordinary rows."""
    groups = getattr(module, "num_key_value_groups", 1)
    key = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    value = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    dropout = dropout if module.training else 0.0
    if shared_prefix is None:
        causal = attention_mask is None and query.shape[2] > 1
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             is_causal=causal, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    prefix, spans = shared_prefix
    parts = []
    if prefix:  # the prompt: causal among itself, the fast path
        parts.append(F.scaled_dot_product_attention(query[:, :, :prefix], key[:, :, :prefix], value[:, :, :prefix],
                                                    dropout_p=dropout, is_causal=True, scale=scaling))
    for start, end in spans:  # a continuation: all of the prompt, then causal among itself
        width = end - start
        keys = torch.cat([key[:, :, :prefix], key[:, :, start:end]], dim=2)
        values = torch.cat([value[:, :, :prefix], value[:, :, start:end]], dim=2)
        mask = torch.ones(width, prefix + width, dtype=torch.bool, device=query.device).tril(prefix)
        parts.append(F.scaled_dot_product_attention(query[:, :, start:end], keys, values, attn_mask=mask,
                                                    dropout_p=dropout, scale=scaling))
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def use_shared_prefix_attention(model: torch.nn.Module) -> None:
    """Switch a transformers model to `shared_prefix_attention` (registered on first use)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, shared_prefix_attention)
    model.set_attn_implementation(ATTENTION)
    if model.config._attn_implementation != ATTENTION:  # the model ignores AttentionInterface
        raise ValueError(f"{type(model).__name__} cannot take a custom attention, so its rollouts cannot be "
                         "packed; set learner.shared_prefix=false (LEARNER_SHARED_PREFIX=false)")


def prompt_length(seq: TrainSequence) -> int:
    """Tokens before the first generated one (the whole sequence when nothing was generated)."""
    return seq.loss_mask.index(1) if seq.loss_tokens else len(seq.token_ids)


def plan(batch: Sequence[TrainSequence], size: int) -> list[list[int]]:
    """Indexes of `batch` in packs of at most `size` sequences with the same prompt, in first-seen order."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, seq in enumerate(batch):
        by_prompt.setdefault(tuple(seq.token_ids[:prompt_length(seq)]), []).append(i)
    return [members[part] for members in by_prompt.values() for part in micro_batches(len(members), size)]


@dataclass(frozen=True)
class Pack:
    """One packed row, and where each of its kept logits lands in the unpacked (B, T) layout."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    layout: tuple[int, tuple[tuple[int, int], ...]]
    keep: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor

    def to(self, device: torch.device) -> "Pack":
        moved = (t.to(device) for t in (self.input_ids, self.position_ids, self.keep, self.rows, self.cols))
        input_ids, position_ids, keep, rows, cols = moved
        return Pack(input_ids, position_ids, self.layout, keep, rows, cols)

    def model_inputs(self) -> dict:
        """Keyword arguments of the model's forward for this pack."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False,
                "logits_to_keep": self.keep, "shared_prefix": self.layout}

    def logprobs(self, logits: torch.Tensor, shape: torch.Size, temperature: float = 1.0) -> torch.Tensor:
        """Log-probs of the generated tokens from the pack's kept logits (1, n, V), scattered into a
        (B, T) tensor aligned to the unpacked token ids (0 elsewhere), as `grpo.kept_logprobs` gives."""
        picked = target_logprobs(logits[0], self.input_ids[0, self.keep + 1], temperature)
        out = torch.zeros(shape, dtype=picked.dtype, device=picked.device)
        return out.index_put((self.rows, self.cols), picked)


def pack(seqs: Sequence[TrainSequence]) -> Pack:
    """Pack sequences that share their prompt (as `plan` groups them) into one row."""
    prefix = prompt_length(seqs[0]) - 1
    if any(prompt_length(s) - 1 != prefix or s.token_ids[:prefix] != seqs[0].token_ids[:prefix] for s in seqs):
        raise ValueError("pack() takes sequences with the same prompt; group them with plan()")
    ids, positions = [seqs[0].token_ids[:prefix]], [list(range(prefix))]
    spans, keep, rows, cols, offset = [], [], [], [], prefix
    for row, seq in enumerate(seqs):
        rest = seq.token_ids[prefix:]
        ids.append(rest)
        positions.append(list(range(prefix, len(seq.token_ids))))
        spans.append((offset, offset + len(rest)))
        targets = [t for t in range(prefix + 1, len(seq.token_ids)) if seq.loss_mask[t]]
        keep += [offset + t - 1 - prefix for t in targets]
        rows += [row] * len(targets)
        cols += targets
        offset += len(rest)
    flat = [t for part in ids for t in part]
    return Pack(torch.tensor([flat]), torch.tensor([[p for part in positions for p in part]]),
                (prefix, tuple(spans)), torch.tensor(keep, dtype=torch.long),
                torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long))
