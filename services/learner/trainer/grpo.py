"""GRPO maths as pure functions of tensors: advantages, log-probs, clipped loss, k3 KL, aggregation.

Shapes: B sequences of T tokens; `mask` is 1 on the tokens the policy generated (the agent runtime's
loss mask) and 0 on prompt, tool output and padding. Per-token quantities are aligned to the token
ids: position t holds a quantity about token t given tokens < t, so position 0 has none.

One GRPO loss, per token t of sequence i with advantage A_i:

    ratio_t = exp(logp_t - old_logp_t)
    pg_t    = max(-A_i * ratio_t, -A_i * clip(ratio_t, 1 - eps_low, 1 + eps_high))
    kl_t    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1                  (k3, only if beta > 0)
    loss    = sum_{i,t} w_{i,t} * (pg_t + beta * kl_t)

with weights w from `sequence_scales` (token-mean by default). No I/O, no model, no optimizer here.
"""
from __future__ import annotations

import math

import torch

from coevolve.services.learner.config import LOSS_AGG_MODES

# Log-ratios beyond this are clamped before exp: exp(20) is already a ratio of 5e8, clipped anyway.
_MAX_LOG_RATIO = 20.0


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor,
                     eps: float = 1e-6) -> tuple[torch.Tensor, int]:
    """Normalize rewards within each group: A_i = (r_i - mean_g) / (std_g + eps).

    `groups[i]` is the integer id of the task whose rollout i is (its K rollouts share the id).
    std_g is the sample standard deviation (Bessel's n - 1, as TRL and verl compute it). A group whose
    rewards are all equal (K = 1 included) gives A_i = 0, so no gradient; such groups are counted and
    the count is returned with the advantages. A group of one has no baseline to compare with:
    unlike verl, which then passes the raw reward through, it gets 0 here.
    """
    if rewards.shape != groups.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and groups {tuple(groups.shape)} must be "
                         "1-D and of the same length")
    rewards = rewards.double()
    _, index = torch.unique(groups, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(rewards))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, rewards) / count
    centered = rewards - mean[index]
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, centered**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    lo = torch.full((n_groups,), float("inf"), dtype=torch.float64).scatter_reduce_(0, index, rewards, "amin")
    hi = torch.full((n_groups,), -float("inf"), dtype=torch.float64).scatter_reduce_(0, index, rewards, "amax")
    flat = hi == lo
    advantages = torch.where(flat[index], torch.zeros_like(rewards), centered / (std[index] + eps))
    return advantages.float(), int(flat.sum())


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log p(token_t | tokens_<t) for every t, aligned to `token_ids`; position 0 gets 0.

    logits[:, t] predicts token t + 1, so out[:, t] = log_softmax(logits[:, t - 1] / temperature)
    at token_ids[:, t], computed as the gathered logit minus the logsumexp, in float32, without
    materializing a second (B, T, V) tensor. Divide by the sampling temperature so the ratio against
    the rollout log-probs compares like with like.
    """
    out = target_logprobs(logits[:, :-1], token_ids[:, 1:], temperature)
    return torch.cat([torch.zeros_like(out[:, :1]), out], dim=1)


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / temperature) at `targets` (logits' shape without the vocabulary axis), in
    float32, as the gathered logit minus the logsumexp."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


def kept_positions(mask: torch.Tensor) -> torch.Tensor:
    """The logit positions a masked loss needs: t - 1 for every t that is 1 in any row of `mask`.

    A multi-turn episode is mostly prompt and tool output; computing the (T, V) logits only where a
    generated token is predicted saves most of the LM head's time and memory.
    """
    return torch.nonzero(mask[:, 1:].bool().any(0)).flatten()


def kept_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
    """`token_logprobs` from logits computed only at `positions` (B, P, V); 0 at every other position.

    logits[:, j] is the prediction at position positions[j], i.e. of token positions[j] + 1.
    """
    picked = target_logprobs(logits, token_ids[:, positions + 1], temperature)
    out = torch.zeros(token_ids.shape, dtype=picked.dtype, device=picked.device)
    return out.index_copy(1, positions + 1, picked)


def clipped_pg_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_low: float = 0.20,
                    clip_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped loss and a 0/1 tensor of the tokens where the clip was active.

        ratio = exp(logp - old_logp)
        loss  = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))

    `advantages` is per sequence (B,) or per token (B, T). The asymmetric range (DAPO's clip-higher,
    the paper's 0.20 / 0.28) lets unlikely tokens with A > 0 grow further before the clip stops them.
    Where mask is 0 the log-ratio is set to 0 first, so arbitrary old log-probs there (the runtime
    writes 0.0) can never overflow into inf or NaN; those positions get loss 0.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    keep = mask.bool()
    log_ratio = torch.where(keep, logp - old_logp, torch.zeros_like(logp))
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped) & keep
    return torch.where(keep, loss, torch.zeros_like(loss)), was_clipped.float()


def decoupled_pg_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor,
                      advantages: torch.Tensor, mask: torch.Tensor, clip_low: float = 0.20, clip_high: float = 0.28,
                      cap: float = 2.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token decoupled PPO loss with a truncated behaviour weight, for rollouts of an older policy.

        w_t     = min(exp(prox_t - behav_t), cap)         behaviour importance weight, truncated (TIS)
        ratio_t = exp(logp_t - prox_t)
        pg_t    = w_t * max(-A * ratio_t, -A * clip(ratio_t, 1 - clip_low, 1 + clip_high))

    `behav` are the log-probs the rollout was sampled with (a policy up to `max_policy_lag` versions
    old), `prox` those of the proximal policy (the one being updated, before the update) and `logp` the
    current ones. The clip keeps the update near the proximal policy, not near the stale behaviour
    policy; the weight corrects for sampling from the latter, truncated at `cap` so one token sampled
    where the policy has since moved far cannot dominate the batch. With prox = behav the weight is 1
    and this is `clipped_pg_loss(logp, behav, ...)` exactly. Returns the loss, the clip indicator and
    the weights (1 where masked).
    """
    pg, clipped = clipped_pg_loss(logp, prox_logp, advantages, mask, clip_low, clip_high)
    keep = mask.bool()
    log_w = torch.where(keep, prox_logp - behav_logp, torch.zeros_like(prox_logp))
    weight = torch.exp(log_w.clamp(-_MAX_LOG_RATIO, math.log(cap))).detach()
    return pg * weight, clipped, weight


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1, 0 where masked.

    Schulman's k3 is unbiased for tokens sampled from pi and never negative; the difference is
    clamped to +-20 (as verl does) so a far-off reference cannot overflow exp.
    """
    keep = mask.bool()
    diff = torch.where(keep, ref_logp - logp, torch.zeros_like(logp)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(diff) - diff - 1.0


def sequence_scales(token_counts: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Per-sequence weight s_i so that loss = sum_i s_i * sum_t mask_it * loss_it.

    With n_i the number of loss tokens of sequence i, N = sum_i n_i, and S the number of sequences
    with n_i > 0:
    - `token-mean` (default; DAPO, the paper): s_i = 1 / N, every generated token counts the same.
    - `seq-mean-token-sum`: s_i = 1 / S, each sequence's summed loss averaged over sequences (verl's
      name; Dr. GRPO's fix for the length bias, up to a constant).
    - `seq-mean-token-mean`: s_i = 1 / (S * n_i), the original GRPO: mean over tokens, then sequences.
    A sequence without loss tokens (an empty episode) gets 0 and is not counted in S, so adding one
    to a batch changes nothing. Computing the scales over the whole batch, then slicing them per
    micro-batch, makes gradient accumulation exact.
    """
    counts = token_counts.double()
    nonempty = counts > 0
    if mode == "token-mean":
        scales = torch.full_like(counts, 1.0 / max(float(counts.sum()), 1.0))
    elif mode == "seq-mean-token-sum":
        scales = torch.full_like(counts, 1.0 / max(int(nonempty.sum()), 1))
    elif mode == "seq-mean-token-mean":
        scales = 1.0 / (counts.clamp(min=1) * max(int(nonempty.sum()), 1))
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; use one of {', '.join(LOSS_AGG_MODES)}")
    return torch.where(nonempty, scales, torch.zeros_like(scales)).float()


def aggregate(values: torch.Tensor, mask: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """sum_{i,t} scales_i * mask_it * values_it; masked positions are dropped, never multiplied."""
    weights = mask * scales.unsqueeze(-1)
    return torch.where(weights > 0, values * weights, torch.zeros_like(values)).sum()


def aggregate_loss(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Aggregate per-token values over one whole batch with `mode` (see `sequence_scales`)."""
    return aggregate(values, mask, sequence_scales(mask.sum(-1), mode).to(values.device))
