"""Training sequences: the Episode contract is checked, and collation pads without leaking loss."""
from types import SimpleNamespace

import pytest
import torch

from coevolve.services.learner.trainer.batch import TrainSequence, collate, micro_batches


def test_an_episode_becomes_a_training_sequence():
    episode = SimpleNamespace(token_ids=(5, 6, 7), loss_mask=(0, 1, 1), logprobs=(0.0, -0.5, -1.5), score=1.0)
    seq = TrainSequence.from_episode(episode, advantage=0.7)
    assert seq == TrainSequence([5, 6, 7], [0, 1, 1], [0.0, -0.5, -1.5], 0.7)
    assert seq.loss_tokens == 2


@pytest.mark.parametrize("args,match", [
    (([], [], [], 0.0), "token_ids is empty"),
    (([1, 2], [0], [0.0, 0.0], 0.0), "must align"),
    (([1, 2], [0, 2], [0.0, 0.0], 0.0), "other than 0 and 1"),
    (([1, 2], [1, 1], [-1.0, -1.0], 0.0), "first token has no context"),
    (([1, 2], [0, 1], [0.0, -1.0], float("nan")), "not finite"),
    (([1, 2], [0, 1], [0.0, float("-inf")], 0.0), "non-finite rollout log-prob"),
])
def test_malformed_sequences_are_refused_with_the_reason(args, match):
    with pytest.raises(ValueError, match=match):
        TrainSequence(*args)


def test_collate_pads_on_the_right_with_no_attention_and_no_loss():
    seqs = [TrainSequence([1, 2, 3], [0, 1, 1], [0.0, -1.0, -2.0], 1.0),
            TrainSequence([4], [0], [0.0], -1.0)]
    mb = collate(seqs, pad_id=9)
    assert mb.input_ids.tolist() == [[1, 2, 3], [4, 9, 9]]
    assert mb.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert mb.loss_mask.tolist() == [[0, 1, 1], [0, 0, 0]]
    assert mb.old_logprobs.tolist() == [[0.0, -1.0, -2.0], [0.0, 0.0, 0.0]]
    assert mb.advantages.tolist() == [1.0, -1.0]
    assert mb.input_ids.dtype == torch.long and mb.loss_mask.dtype == torch.float32


def test_micro_batches_cover_the_batch_in_order():
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_batches(2, 8) == [slice(0, 2)]
