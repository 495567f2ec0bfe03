"""GRPO maths against numbers computed by hand."""
import math

import pytest
import torch

from coevolve.services.learner.trainer import grpo

LN = math.log


def test_advantages_are_normalized_within_each_group_with_the_sample_std():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([7, 7, 7, 3, 3])
    adv, flat = grpo.group_advantages(rewards, groups, eps=0.0)
    # group 7: mean 2/3, sample variance ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3
    # group 3: mean 1/2, sample std sqrt(1/2)
    s3 = 1 / math.sqrt(3)
    expected = [(1 / 3) / s3, (-2 / 3) / s3, (1 / 3) / s3, -0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    assert flat == 0


def test_equal_rewards_and_groups_of_one_give_zero_and_are_counted():
    rewards = torch.tensor([0.5, 0.5, 0.5, 2.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 2, 2])
    adv, flat = grpo.group_advantages(rewards, groups)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert flat == 2
    assert adv[4] == pytest.approx(1 / math.sqrt(0.5) * 0.5, abs=1e-5)


def test_a_whole_batch_of_single_rollouts_has_no_gradient_signal():
    adv, flat = grpo.group_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 1, 2]))
    assert adv.tolist() == [0.0, 0.0, 0.0] and flat == 3


def test_eps_keeps_a_tiny_spread_finite():
    adv, flat = grpo.group_advantages(torch.tensor([0.0, 1e-12]), torch.tensor([0, 0]), eps=1e-6)
    assert torch.isfinite(adv).all() and flat == 0 and adv[1] > 0


def test_advantage_inputs_must_align():
    with pytest.raises(ValueError, match="same length"):
        grpo.group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0]))


def test_token_logprobs_are_aligned_to_the_predicted_token():
    logits = torch.tensor([[[0.0, LN(3)], [LN(4), 0.0], [9.0, 9.0]]])  # position t predicts token t+1
    tokens = torch.tensor([[0, 1, 0]])
    out = grpo.token_logprobs(logits, tokens)
    assert out.tolist()[0] == pytest.approx([0.0, LN(3 / 4), LN(4 / 5)], abs=1e-6)
    hot = grpo.token_logprobs(logits, tokens, temperature=2.0)
    assert hot[0, 1].item() == pytest.approx(LN(math.sqrt(3) / (1 + math.sqrt(3))), abs=1e-6)


def _one_token(ratio: float, advantage: float, clip_low=0.20, clip_high=0.28):
    logp = torch.tensor([[0.0, LN(ratio) - 1.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1.0]])
    loss, clipped = grpo.clipped_pg_loss(logp, old, torch.tensor([advantage]), torch.tensor([[0.0, 1.0]]),
                                         clip_low, clip_high)
    loss.sum().backward()
    return loss[0, 1].item(), clipped[0, 1].item(), logp.grad[0, 1].item()


@pytest.mark.parametrize("ratio,adv,loss,clipped,grad", [
    (1.5, 1.0, -1.28, 1.0, 0.0),    # A > 0 above 1 + 0.28: clipped, no gradient
    (1.25, 1.0, -1.25, 0.0, -1.25),  # inside the higher range: a symmetric 0.2 clip would stop it
    (0.5, 1.0, -0.5, 0.0, -0.5),    # A > 0 below the range: the pessimistic (unclipped) term stays
    (0.5, -1.0, 0.8, 1.0, 0.0),     # A < 0 below 1 - 0.20: clipped, no gradient
    (0.78, -1.0, 0.8, 1.0, 0.0),
    (1.5, -1.0, 1.5, 0.0, 1.5),     # A < 0 above the range: unclipped, still pushed down
    (1.1, 2.0, -2.2, 0.0, -2.2),
])
def test_clipped_loss_on_both_sides(ratio, adv, loss, clipped, grad):
    got = _one_token(ratio, adv)
    assert got == pytest.approx((loss, clipped, grad), abs=1e-5)


def test_k3_against_hand_values():
    logp = torch.tensor([[LN(0.5), LN(0.2), LN(0.5)]])
    ref = torch.tensor([[LN(0.25), LN(0.2), LN(1.0)]])
    kl = grpo.k3_kl(logp, ref, torch.ones(1, 3))
    # r = ref/p: 0.5 -> 0.5 - ln 0.5 - 1; 1 -> 0; 2 -> 2 - ln 2 - 1
    assert kl.tolist()[0] == pytest.approx([0.5 + LN(2) - 1, 0.0, 1 - LN(2)], abs=1e-6)
    assert (kl >= 0).all()


def test_masked_tokens_contribute_nothing_and_never_produce_nan():
    logp = torch.tensor([[-50.0, -0.5, -60.0, -1.0]], requires_grad=True)
    old = torch.tensor([[0.0, -0.6, 0.0, -1e9]])  # junk where the mask is 0
    mask = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    pg, clipped = grpo.clipped_pg_loss(logp, old, torch.tensor([1.0]), mask)
    kl = grpo.k3_kl(logp, torch.tensor([[1e9, -0.5, 1e9, -1e9]]), mask)  # equal where it counts
    total = grpo.aggregate_loss(pg + 0.1 * kl, mask)
    total.backward()
    assert torch.isfinite(total) and torch.isfinite(logp.grad).all()
    assert pg[0, [0, 2, 3]].tolist() == [0.0, 0.0, 0.0] and kl[0, [0, 2, 3]].tolist() == [0.0, 0.0, 0.0]
    assert logp.grad[0, [0, 2, 3]].tolist() == [0.0, 0.0, 0.0]
    assert total.item() == pytest.approx(-math.exp(0.1), abs=1e-6)


VALUES = torch.tensor([[4.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
MASK = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (4 + 1 + 2 + 3) / 4),
    ("seq-mean-token-sum", (4 + 6) / 2),
    ("seq-mean-token-mean", (4 / 1 + 6 / 3) / 2),
])
def test_aggregation_modes(mode, expected):
    assert grpo.aggregate_loss(VALUES, MASK, mode).item() == pytest.approx(expected)
    # an empty episode (no generated token, junk values) changes nothing and yields no NaN
    values = torch.cat([VALUES, torch.tensor([[float("nan"), float("inf"), 5.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3)])
    assert grpo.aggregate_loss(values, mask, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", grpo.LOSS_AGG_MODES)
def test_micro_batches_with_whole_batch_scales_add_up_to_the_batch_loss(mode):
    scales = grpo.sequence_scales(MASK.sum(-1), mode)
    parts = [grpo.aggregate(VALUES[i:i + 1], MASK[i:i + 1], scales[i:i + 1]) for i in range(2)]
    assert sum(parts).item() == pytest.approx(grpo.aggregate_loss(VALUES, MASK, mode).item())


@pytest.mark.parametrize("mode", grpo.LOSS_AGG_MODES)
def test_a_batch_with_no_generated_token_aggregates_to_zero(mode):
    assert grpo.aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode).item() == 0.0


def test_unknown_aggregation_says_which_exist():
    with pytest.raises(ValueError, match="token-mean"):
        grpo.sequence_scales(torch.tensor([1]), "sum")


def test_logprobs_from_kept_positions_equal_the_full_ones_where_the_mask_is_one():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 6, 11, generator=gen)
    tokens = torch.randint(0, 11, (2, 6), generator=gen)
    mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0]], dtype=torch.float32)
    keep = grpo.kept_positions(mask)
    assert keep.tolist() == [1, 2, 3]
    full = grpo.token_logprobs(logits, tokens, temperature=0.7)
    kept = grpo.kept_logprobs(logits[:, keep], tokens, keep, temperature=0.7)
    assert torch.allclose(kept[mask.bool()], full[mask.bool()])
    assert kept[:, [0, 1, 5]].abs().sum() == 0
    empty = grpo.kept_positions(torch.zeros(2, 6))
    assert grpo.kept_logprobs(logits[:, empty], tokens, empty).abs().sum() == 0


def test_the_decoupled_loss_with_the_proximal_policy_as_behaviour_is_the_clipped_loss_exactly():
    torch.manual_seed(0)
    logp = torch.randn(3, 6, requires_grad=True)
    old = torch.randn(3, 6)
    adv, mask = torch.tensor([1.0, -0.5, 2.0]), (torch.rand(3, 6) > 0.3).float()
    today, clipped_today = grpo.clipped_pg_loss(logp, old, adv, mask, 0.2, 0.28)
    decoupled, clipped, weight = grpo.decoupled_pg_loss(logp, old, old, adv, mask, 0.2, 0.28, cap=2.0)
    assert torch.equal(decoupled, today) and torch.equal(clipped, clipped_today)
    assert torch.equal(weight, torch.ones_like(weight))
    (g_today,) = torch.autograd.grad(today.sum(), logp)
    (g_decoupled,) = torch.autograd.grad(decoupled.sum(), logp)
    assert torch.equal(g_today, g_decoupled)


def test_the_decoupled_loss_weights_by_the_truncated_behaviour_ratio_by_hand():
    log = math.log
    # token 1: prox/behav = 0.4/0.1 = 4, truncated to 2; ratio 0.5/0.4 = 1.25 (inside the clip) -> 2 * -1.25
    # token 2: prox/behav = 1; ratio 0.22/0.25 = 0.88 -> -0.88
    # row 2, A = -1, token 1: prox/behav = 0.3/0.6 = 0.5; ratio 0.45/0.3 = 1.5 -> max(1.5, 1.28) = 1.5, * 0.5 = 0.75
    logp = torch.tensor([[0.0, log(0.5), log(0.22)], [0.0, log(0.45), 0.0]], requires_grad=True)
    prox = torch.tensor([[0.0, log(0.4), log(0.25)], [0.0, log(0.3), 0.0]])
    behav = torch.tensor([[0.0, log(0.1), log(0.25)], [0.0, log(0.6), 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    loss, clipped, weight = grpo.decoupled_pg_loss(logp, prox, behav, torch.tensor([1.0, -1.0]), mask,
                                                   0.2, 0.28, cap=2.0)
    expected = torch.tensor([[0.0, -2.5, -0.88], [0.0, 0.75, 0.0]])
    assert torch.allclose(loss, expected, atol=1e-6)
    assert torch.allclose(weight, torch.tensor([[1.0, 2.0, 1.0], [1.0, 0.5, 1.0]]), atol=1e-6)
    assert clipped.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    # d/dlogp of w * -A * ratio is w * -A * ratio itself: the same numbers
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.allclose(grad, expected, atol=1e-6)


def test_a_clipped_token_gets_no_gradient_and_the_weight_none():
    # A = 1, ratio 1.5 beyond 1 + 0.28: the clipped branch is constant, whatever the weight
    logp = torch.tensor([[0.0, math.log(0.6)]], requires_grad=True)
    prox = behav = torch.tensor([[0.0, math.log(0.4)]])
    loss, clipped, _ = grpo.decoupled_pg_loss(logp, prox, behav * 2, torch.tensor([1.0]), torch.tensor([[0.0, 1.0]]))
    assert clipped.tolist() == [[0.0, 1.0]]
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert grad.abs().sum() == 0
