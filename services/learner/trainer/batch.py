"""Training sequences and their collation into padded tensors.

The contract with the agent runtime's `Episode`: `token_ids` (the exact generated ids plus the
template-rendered ids of everything else), `loss_mask` (1 only on generated tokens), `logprobs`
(the sampling log-probabilities, aligned to `token_ids`, 0.0 where the mask is 0). The learner adds
one advantage per sequence.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainSequence:
    """One rollout ready for a GRPO step."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    advantage: float

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if n == 0:
            raise ValueError("token_ids is empty; a sequence needs at least its prompt")
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"token_ids, loss_mask and logprobs must align (lengths {n}, "
                             f"{len(self.loss_mask)}, {len(self.logprobs)})")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask holds values other than 0 and 1")
        if self.loss_mask[0]:
            raise ValueError("loss_mask[0] is 1, but the first token has no context to be generated "
                             "from; an episode starts with its prompt")
        if not math.isfinite(self.advantage):
            raise ValueError(f"advantage {self.advantage} is not finite")
        if any(m and not math.isfinite(lp) for m, lp in zip(self.loss_mask, self.logprobs)):
            raise ValueError("a generated token has a non-finite rollout log-prob")

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @classmethod
    def from_episode(cls, episode, advantage: float) -> "TrainSequence":
        """Take `token_ids`, `loss_mask` and `logprobs` from an agent-runtime episode."""
        return cls(list(episode.token_ids), list(episode.loss_mask), list(episode.logprobs), float(advantage))


@dataclass(frozen=True)
class Collated:
    """A right-padded micro-batch: (B, T) tensors and the advantages (B,)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor

    def to(self, device: torch.device) -> "Collated":
        return Collated(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.loss_mask,
                                                 self.old_logprobs, self.advantages)))


def collate(seqs: Sequence[TrainSequence], pad_id: int = 0) -> Collated:
    """Pad on the right to the longest sequence; padding has attention 0 and loss mask 0."""
    width = max(len(s.token_ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    old = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attention[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    return Collated(ids, attention, mask, old, advantages)


def micro_batches(n: int, size: int) -> list[slice]:
    """Consecutive slices of at most `size` sequences covering range(n)."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]
