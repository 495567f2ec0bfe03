"""A weight push streams the policy: the gloo sender holds one gathered tensor and the chunk it is packing,
never the whole policy, and a round that breaks ends the pass (every rank takes part in each gather)."""
import weakref

import pytest
import torch

from coevolve.services.fleet.transfer import GlooUpdateInfo, NamedTensorSource, broadcast_round, plan_chunks

SHAPES = [(f"layers.{i}.weight", (4, 8)) for i in range(12)]


class Gathered:
    """Re-readable weights, as a sharded trainer yields them: each pass makes each tensor anew."""

    def __init__(self):
        self.passes = self.ended = self.alive = self.most_alive = 0

    def _dead(self) -> None:
        self.alive -= 1

    def __iter__(self):
        self.passes += 1
        try:
            for i, (name, shape) in enumerate(SHAPES):
                tensor = torch.full(shape, float(i))
                self.alive += 1
                self.most_alive = max(self.most_alive, self.alive)
                weakref.finalize(tensor, self._dead)
                yield name, tensor
                del tensor
        finally:
            self.ended += 1


class Group:
    """A gloo group's broadcast, recorded; it fails from broadcast `fail_at` on."""

    def __init__(self, fail_at: int | None = None):
        self.sent: list[torch.Tensor] = []
        self.fail_at = fail_at

    def broadcast(self, tensors, options):
        if self.fail_at is not None and len(self.sent) == self.fail_at:
            raise RuntimeError("Connection closed by peer")
        self.sent.append(tensors[0].clone())
        return self

    def wait(self):
        return True


def push_round(weights, group, chunk_bytes, dtype=torch.bfloat16) -> GlooUpdateInfo:
    """One gloo round of a push of `weights` over `group`, as a server's round sends it."""
    source = NamedTensorSource(weights, dtype)
    info = GlooUpdateInfo.of(source.metadata())
    broadcast_round(group, source, info, chunk_bytes)
    return info


def test_a_push_holds_one_gathered_tensor_at_a_time_and_sends_the_chunks_in_order():
    weights, group = Gathered(), Group()
    info = push_round(weights, group, chunk_bytes=3 * 4 * 8 * 2)  # three bfloat16 tensors a chunk
    assert weights.most_alive == 1
    assert weights.passes == weights.ended == 2  # the metadata's pass, then the round's
    assert [len(c) for c in plan_chunks(info.dtype_names, info.shapes, 3 * 64)] == [3] * 4
    assert [t.numel() for t in group.sent] == [96] * 4 and all(t.dtype == torch.bfloat16 for t in group.sent)
    assert torch.equal(torch.cat(group.sent), torch.cat([torch.full((32,), float(i)) for i in range(12)]).bfloat16())


def test_a_broken_round_ends_its_pass_over_the_weights():
    weights = Gathered()
    with pytest.raises(RuntimeError, match="closed by peer"):
        push_round(weights, Group(fail_at=1), chunk_bytes=3 * 64)
    assert weights.passes == weights.ended == 2


def test_a_one_shot_iterator_is_read_once_and_serves_every_round():
    source = NamedTensorSource(iter([("w", torch.ones(2, 2)), ("b", torch.zeros(2))]))
    assert [m.name for m in source.metadata()] == ["w", "b"]
    assert [name for name, _ in source] == [name for name, _ in source] == ["w", "b"]
