"""The plain torch engine on a real (tiny, random) Llama: accumulation, masking, KL, export, LoRA."""
import pytest
import torch

from coevolve.services.learner.trainer.batch import TrainSequence
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.build import build_trainer
from bench.shapes import random_llama

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256)


def make_batch(n=6, seed=1, vocab=256):
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        length = 12 + 3 * i
        ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
        mask = [0] * 5 + [1] * (length - 5)
        logprobs = [-float(torch.rand(1, generator=gen)) - 5.0 if m else 0.0 for m in mask]
        seqs.append(TrainSequence(ids, mask, logprobs, advantage=float(i % 3) - 1.0))
    return seqs


def engine(seed=0, **fields):
    return build_trainer(random_llama("tiny", seed=seed, **SMALL), GRPOConfig(**{"lr": 1e-3, **fields}))


def weights(eng):
    return {name: tensor.clone() for name, tensor in eng.named_parameters()}


def max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batch_size_does_not_change_the_update(mode):
    one, whole = engine(micro_batch_size=1, loss_agg=mode), engine(micro_batch_size=16, loss_agg=mode)
    m1, m16 = one.update(make_batch()), whole.update(make_batch())
    assert m1["loss"] == pytest.approx(m16["loss"], abs=1e-5)
    assert m1["grad_norm"] == pytest.approx(m16["grad_norm"], rel=1e-4)
    # Adam's first step moves a weight by about lr (1e-3); the summation order of the accumulated
    # gradients differs by CPU, and an AVX2-only EPYC differed by up to 2.9e-6 where AVX-512 stayed below 1e-6.
    assert max_diff(weights(one), weights(whole)) < 1e-5
    assert m1["loss_tokens"] == sum(s.loss_tokens for s in make_batch())


def test_an_empty_episode_and_junk_under_the_mask_change_nothing():
    batch = make_batch()
    noisy = [TrainSequence(s.token_ids, s.loss_mask, [lp if m else -1e6 for m, lp in zip(s.loss_mask, s.logprobs)],
                           s.advantage) for s in batch]
    noisy.append(TrainSequence([3, 4, 5, 6], [0, 0, 0, 0], [0.0] * 4, advantage=5.0))
    clean, dirty = engine(micro_batch_size=2), engine(micro_batch_size=2)
    a, b = clean.update(batch), dirty.update(noisy)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert max_diff(weights(clean), weights(dirty)) < 1e-6


def test_zero_advantages_give_zero_gradient():
    batch = [TrainSequence(s.token_ids, s.loss_mask, s.logprobs, 0.0) for s in make_batch()]
    metrics = engine().update(batch)
    assert metrics["grad_norm"] == 0.0 and metrics["loss"] == 0.0


def test_training_moves_the_weights_and_export_follows_transformers_names():
    eng = engine()
    names = set(eng.model.state_dict())
    before = weights(eng)
    assert set(before) <= names and "model.layers.0.self_attn.q_proj.weight" in before
    eng.update(make_batch())
    assert max_diff(before, weights(eng)) > 1e-4
    assert set(eng.state_dict()) == set(before)


def test_kl_is_zero_at_the_start_then_grows_and_the_reference_stays_frozen():
    eng = engine(kl_beta=0.1)
    ref = {k: v.clone() for k, v in eng.reference.state_dict().items()}
    first = eng.update(make_batch())
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)
    second = eng.update(make_batch())
    assert second["kl"] > 1e-6
    assert second["loss"] == pytest.approx(second["pg_loss"] + 0.1 * second["kl"], abs=1e-6)
    assert all(torch.equal(ref[k], v) for k, v in eng.reference.state_dict().items())


def test_no_reference_is_built_without_kl():
    assert engine().reference is None


def test_lora_trains_adapters_only_and_exports_merged_base_names():
    base_names = set(random_llama("tiny", **SMALL).state_dict())
    eng = build_trainer(random_llama("tiny", seed=0, **SMALL),
                       GRPOConfig(lr=1e-2, lora_rank=4, lora_targets="q_proj,v_proj", kl_beta=0.1))
    assert eng.reference is None
    before = weights(eng)
    assert set(before) <= base_names and not any("lora_" in n or "base_layer" in n for n in before)
    first = eng.update(make_batch())
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # adapters start at B = 0: policy == reference
    eng.update(make_batch())
    after = weights(eng)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)
    merged = random_llama("tiny", **SMALL)
    merged.load_state_dict(after, strict=False)
    ids = torch.tensor([make_batch(1)[0].token_ids])
    with torch.no_grad():
        expect = eng.model(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, expect, atol=1e-5)


def test_an_empty_batch_is_refused():
    with pytest.raises(ValueError, match="at least one sequence"):
        engine().update([])


def test_bf16_autocast_trains_float32_weights_to_nearly_the_same_update():
    full, mixed = engine(), engine(autocast="bf16")
    start = weights(full)
    a, b = full.update(make_batch()), mixed.update(make_batch())
    assert b["loss"] == pytest.approx(a["loss"], rel=0.05, abs=0.02)
    assert all(t.dtype == torch.float32 for _, t in mixed.named_parameters())
    # Adam's first step moves each weight by about lr * sign(gradient): compare the update directions
    da = torch.cat([(t - start[k]).flatten() for k, t in weights(full).items()])
    db = torch.cat([(t - start[k]).flatten() for k, t in weights(mixed).items()])
    assert float(torch.nn.functional.cosine_similarity(da, db, dim=0)) > 0.8


def test_gradient_checkpointing_gives_the_same_update():
    plain, recomputed = engine(), engine(gradient_checkpointing=True)
    a, b = plain.update(make_batch()), recomputed.update(make_batch())
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert max_diff(weights(plain), weights(recomputed)) < 1e-6


def grouped_batch(seed=3, vocab=256):
    """Two tasks' groups of three rollouts (one prompt each, multi-turn masks with tool output between
    the replies), a lone rollout of a third prompt, and a rollout that generated nothing."""
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for prompt_len, advantages in ((40, (1.0, -0.5, -0.5)), (29, (0.7, 0.0, -0.7)), (17, (2.0,))):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=gen).tolist()
        for k, advantage in enumerate(advantages):
            reply, tool, second = 4 + 3 * k, 5, 2 + k
            rest = torch.randint(0, vocab, (reply + tool + second,), generator=gen).tolist()
            mask = [0] * prompt_len + [1] * reply + [0] * tool + [1] * second
            logprobs = [-float(torch.rand(1, generator=gen)) - 3.0 if m else 0.0 for m in mask]
            seqs.append(TrainSequence(prompt + rest, mask, logprobs, advantage))
    seqs.append(TrainSequence(seqs[0].token_ids[:40], [0] * 40, [0.0] * 40, 0.0))
    return seqs


def gradients(eng, batch):
    """The update's accumulated gradients (taken where the optimizer would step) and its metrics."""
    grads = {}

    def capture():
        grads.update({n: p.grad.clone() for n, p in eng.policy_module.named_parameters() if p.grad is not None})
        eng.optimizer.zero_grad(set_to_none=True)
        return 0.0
    eng.optimizer_step = capture
    return grads, eng.update(batch)


def test_rollouts_with_one_prompt_share_a_pack_of_at_most_the_micro_batch_size():
    from coevolve.services.learner.trainer.packing import plan

    # the rollout that generated nothing (7) is its prompt alone: it packs with its task's group
    assert plan(grouped_batch(), 4) == [[0, 1, 2, 7], [3, 4, 5], [6]]
    assert plan(grouped_batch(), 2) == [[0, 1], [2, 7], [3, 4], [5], [6]]


@pytest.mark.parametrize("fields", [{}, {"kl_beta": 0.5}, {"lora_rank": 4}, {"gradient_checkpointing": True},
                                    {"loss_agg": "seq-mean-token-mean", "micro_batch_size": 2}],
                         ids=["plain", "kl", "lora", "checkpointing", "seq-mean-packs-of-2"])
def test_packed_rollouts_give_the_unpacked_loss_and_gradients(fields):
    batch = grouped_batch()
    torch.manual_seed(0)  # LoRA draws its A matrices from the global generator: give both engines the same
    packed = engine(**fields)
    torch.manual_seed(0)
    unpacked = engine(shared_prefix=False, **fields)
    if fields.get("kl_beta"):  # move the policy off its reference first, so the KL term is not 0
        packed.update(batch), unpacked.update(batch)
    (g1, m1), (g2, m2) = gradients(packed, batch), gradients(unpacked, batch)
    assert set(g1) == set(g2) and g1
    scale = max(float(g.abs().max()) for g in g2.values())
    assert max(float((g1[k] - g2[k]).abs().max()) for k in g1) < 1e-5 * scale
    for key in ("loss", "pg_loss", "kl", "abs_log_ratio", "clip_fraction", "loss_tokens"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-7), key
    assert m1["kl"] > 0 if fields.get("kl_beta") else m1["kl"] == 0


def test_an_engine_refuses_a_model_not_prepared_for_its_config():
    from coevolve.services.learner.trainer.trainer import TorchTrainer
    from coevolve.services.learner.trainer.build import wrap_policy

    with pytest.raises(ValueError, match="packing attention first"):
        TorchTrainer(random_llama("tiny", seed=0, **SMALL), GRPOConfig(lr=1e-3))
    with pytest.raises(ValueError, match="lora_rank=2 but the model has no LoRA adapters"):
        TorchTrainer(random_llama("tiny", seed=0, **SMALL), GRPOConfig(lr=1e-3, shared_prefix=False, lora_rank=2))
    config = GRPOConfig(lr=1e-3, lora_rank=2, lora_targets="q_proj")
    assert TorchTrainer(wrap_policy(random_llama("tiny", seed=0, **SMALL), config), config).updates == 0
