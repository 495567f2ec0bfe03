"""Shared-prompt packing: the layout's bookkeeping and the attention, on plain tensors."""
import pytest
import torch
import torch.nn.functional as F

from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.trainer.packing import pack, shared_prefix_attention


def seq(ids, mask):
    return TrainSequence(ids, mask, [-1.0 if m else 0.0 for m in mask], 1.0)


def test_a_pack_holds_the_prompt_once_and_maps_every_generated_token_back():
    prompt = [7, 8, 9, 10]
    seqs = [seq(prompt + [20, 21, 5, 22], [0, 0, 0, 0, 1, 1, 0, 1]), seq(prompt + [30], [0, 0, 0, 0, 1])]
    pk = pack(seqs)
    # P = 3: the last prompt token starts each continuation, so it can predict that rollout's first reply token
    assert pk.input_ids.tolist() == [[7, 8, 9, 10, 20, 21, 5, 22, 10, 30]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 3, 4]]
    assert pk.layout == (3, ((3, 8), (8, 10)))
    assert list(zip(pk.rows.tolist(), pk.cols.tolist())) == [(0, 4), (0, 5), (0, 7), (1, 4)]
    for k, row, col in zip(pk.keep.tolist(), pk.rows.tolist(), pk.cols.tolist()):
        assert pk.input_ids[0, k + 1] == seqs[row].token_ids[col]  # the kept logit predicts that token
        assert pk.position_ids[0, k] == col - 1


def test_logprobs_land_where_the_unpacked_layout_has_them():
    prompt = [1, 2, 3]
    pk = pack([seq(prompt + [4, 5], [0, 0, 0, 1, 1]), seq(prompt + [6], [0, 0, 0, 1])])
    logits = torch.randn(1, len(pk.keep), 11)
    out = pk.logprobs(logits, torch.Size((2, 5)), temperature=0.5)
    expected = torch.log_softmax(logits[0] / 0.5, -1)
    assert out[0, 3] == pytest.approx(float(expected[0, 4])) and out[0, 4] == pytest.approx(float(expected[1, 5]))
    assert out[1, 3] == pytest.approx(float(expected[2, 6]))
    assert int((out != 0).sum()) == 3


def test_sequences_with_different_prompts_are_refused():
    with pytest.raises(ValueError, match="same prompt"):
        pack([seq([1, 2, 3, 4], [0, 0, 1, 1]), seq([9, 2, 3, 4], [0, 0, 1, 1])])


def test_the_attention_equals_each_sequences_own_causal_attention():
    class Attn(torch.nn.Module):
        num_key_value_groups = 2

    gen = torch.Generator().manual_seed(0)
    prefix, widths, heads, kv_heads, dim = 6, (3, 5, 1), 4, 2, 8
    total = prefix + sum(widths)
    q = torch.randn(1, heads, total, dim, generator=gen)
    k, v = (torch.randn(1, kv_heads, total, dim, generator=gen) for _ in range(2))
    spans, start = [], prefix
    for width in widths:
        spans.append((start, start + width))
        start += width
    out, _ = shared_prefix_attention(Attn().eval(), q, k, v, None, scaling=0.3, shared_prefix=(prefix, tuple(spans)))
    for s, e in [(0, 0)] + spans:  # (0, 0): the prompt alone
        idx = torch.cat([torch.arange(prefix), torch.arange(s, e)])
        own = F.scaled_dot_product_attention(q[:, :, idx], k[:, :, idx].repeat_interleave(2, 1),
                                             v[:, :, idx].repeat_interleave(2, 1), is_causal=True, scale=0.3)
        assert torch.allclose(out[:, idx].transpose(1, 2), own, atol=1e-6)
    plain, _ = shared_prefix_attention(Attn().eval(), q, k, v, None, scaling=0.3)
    reference = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                               is_causal=True, scale=0.3)
    assert torch.allclose(plain.transpose(1, 2), reference, atol=1e-6)
