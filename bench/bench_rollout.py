"""Rollout throughput of the agent runtime on the BFCL episode workload, vLLM against transformers.

    python -m bench.bench_rollout [--model smollm2-135m-instruct] [--repeats 3]
                                  [--parts episodes,compare,startup]

`episodes` (vLLM): 4 held-out BFCL tasks x 4 rollouts, all 16 in flight, sampled at temperature 1
with a fixed seed, 64 new tokens per generation, the first user turn, at most 4 calls in it:
episodes per minute, generated tokens per second of wall time, the peak resident memory of the
process (default engine settings), and the seconds to push the full state dict into the engine.
`compare`: the same kind of workload small enough for transformers (1 task x 4 rollouts, 32 new
tokens, at most 1 call), on both backends. Every rollout of a task shares its system prompt with the
tool schemas (about 3,500 tokens), which vLLM's prefix cache serves once and `generate` recomputes
for every sequence and round. `startup`: seconds to build a vLLM engine with and without
`enforce_eager`, each in a fresh process. Each backend runs in its own process.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from bench.common import machine

WORKLOADS = {  # tasks, rollouts, new tokens, calls per turn
    "episodes": (4, 4, 64, 4),
    "compare": (1, 4, 32, 1),
}


def _workload(name: str):
    from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
    from coevolve.services.envs.bfcl_data import load_tasks

    n_tasks, rollouts, new_tokens, calls = WORKLOADS[name]
    tasks = [t for t in load_tasks(split="test")[:n_tasks] for _ in range(rollouts)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    return tasks, sampling, EpisodeLimits(max_user_turns=1, max_calls_per_turn=calls, max_context_tokens=6144)


def _worker(args) -> dict:
    """Run one workload `--repeats` times on one backend in this process."""
    from coevolve.services.agent.backends import make_backend
    from coevolve.services.agent.config import BackendConfig
    from coevolve.services.agent.episodes import run_episodes

    config = BackendConfig(model=args.model, backend=args.backend, max_model_len=6144, dtype=args.dtype)
    backend = make_backend(config)
    tasks, sampling, limits = _workload(args.workload)
    tokens_per_s, episodes_per_min = [], []
    for _ in range(args.repeats):
        if args.backend == "vllm":
            backend.llm.reset_prefix_cache()  # every repeat pays for its prompts once, like a new step
        started = time.perf_counter()
        episodes = run_episodes(tasks, "bfcl", backend, sampling, limits, max_in_flight=len(tasks))
        seconds = time.perf_counter() - started
        tokens_per_s.append(sum(e.completion_tokens for e in episodes) / seconds)
        episodes_per_min.append(60 * len(episodes) / seconds)
    out = {"tokens_per_s": tokens_per_s, "episodes_per_min": episodes_per_min,
           "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if args.backend == "vllm" and args.workload == "episodes":
        out["update_s"] = _update_seconds(backend, config, args.repeats)
    backend.close()
    return out


def _update_seconds(backend, config, repeats: int) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    from coevolve.services.agent.models import resolve_model

    state = AutoModelForCausalLM.from_pretrained(resolve_model(config.model, config.coevolve_home),
                                                 dtype=torch.float32).state_dict()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        backend.update_weights(state.items())
        times.append(time.perf_counter() - started)
    return times


def _startup(args) -> dict:
    from coevolve.services.agent.backends import make_backend
    from coevolve.services.agent.config import BackendConfig
    from coevolve.services.agent.models import resolve_model

    config = BackendConfig(model=args.model, backend="vllm", max_model_len=6144, enforce_eager=bool(args.eager))
    resolve_model(config.model, config.coevolve_home)  # the model is built and cached beforehand
    started = time.perf_counter()
    backend = make_backend(config)
    seconds = time.perf_counter() - started
    backend.close()
    return {"startup_s": seconds}


def _child(args, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "bench.bench_rollout", "--model", args.model, "--repeats", str(args.repeats),
           "--dtype", args.dtype, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} (runs: {', '.join(f'{v:,.2f}' for v in values)})"


def _print(label: str, r: dict) -> None:
    print(f"{label:22s} generated tokens/s {_median(r['tokens_per_s'])}")
    print(f"{label:22s} episodes/min       {_median(r['episodes_per_min'])}")
    print(f"{label:22s} peak RSS GiB       {r['peak_rss_gib']:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", help="weights dtype of both backends (auto: bfloat16 where native)")
    parser.add_argument("--parts", type=lambda s: s.split(","), default=["episodes", "compare", "startup"])
    parser.add_argument("--backend", choices=["vllm", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=list(WORKLOADS), help=argparse.SUPPRESS)
    parser.add_argument("--startup-eager", dest="eager", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(_worker(args)))
        return
    if args.eager is not None:
        print(json.dumps(_startup(args)))
        return
    print(f"machine: {machine()}\nmodel {args.model} ({args.dtype}), medians of {args.repeats}", flush=True)
    if "episodes" in args.parts:
        r = _child(args, "--backend", "vllm", "--workload", "episodes")
        _print("vllm, 16 in flight", r)
        print(f"weight update into vLLM, s: {_median(r['update_s'])}", flush=True)
    if "compare" in args.parts:
        rates = {}
        for backend in ("vllm", "transformers"):
            r = _child(args, "--backend", backend, "--workload", "compare")
            _print(f"{backend}, 4 in flight", r)
            rates[backend] = statistics.median(r["tokens_per_s"])
        print(f"vllm / transformers tokens/s: {rates['vllm'] / rates['transformers']:.1f}x", flush=True)
    if "startup" in args.parts:
        for eager in (1, 0):
            runs = [_child(args, "--startup-eager", str(eager))["startup_s"] for _ in range(args.repeats if eager else 1)]
            print(f"vLLM start-up, enforce_eager={bool(eager)}, s: {_median(runs)}", flush=True)


if __name__ == "__main__":
    main()
