"""Random-weight Llama-family models of named shapes, built from a config (nothing downloaded).

For the training benchmarks and the tests: `tiny` has a few million parameters, `smollm2-135m` has
SmolLM2-135M's architecture (weights random). The agent runtime's `tiny-random` model adds a
tokenizer; the learner needs none, since it trains on token ids.
"""
from __future__ import annotations

import torch

SHAPES: dict[str, dict] = {
    "tiny": dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                 tie_word_embeddings=True),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
}


def random_llama(shape: str = "tiny", seed: int = 0, **overrides) -> torch.nn.Module:
    """A `LlamaForCausalLM` of `shape` (fields overridable), initialized from `seed`, float32, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; use one of {', '.join(SHAPES)}")
    config = LlamaConfig(**{**SHAPES[shape], **overrides})
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()
