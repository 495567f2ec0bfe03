"""Rollout throughput of the agent runtime on the BFCL episode workload, vLLM against transformers.

    python -m bench.bench_rollout [--model smollm2-135m-instruct] [--tasks 4] [--rollouts 4]
                                  [--max-new-tokens 64] [--turns 1] [--repeats 3]
                                  [--parts throughput,update,startup]

Workload: `--tasks` held-out BFCL tasks, `--rollouts` rollouts each (all in flight at once), sampled
at temperature 1 with a fixed seed, at most `--max-new-tokens` per generation, the first `--turns`
user turns. Every rollout of a task shares its system prompt with the tool schemas (a few thousand
tokens), which vLLM's prefix cache serves once. Each backend runs in its own process (so its peak
resident memory is its own) and reports generated tokens per second of wall time and episodes per
minute. `update`: seconds to push the model's full state dict into the vLLM engine. `startup`:
seconds to build a vLLM engine, with and without `enforce_eager`, each in a fresh process.
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


def _workload(args):
    from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
    from coevolve.services.envs.bfcl_data import load_tasks

    tasks = [t for t in load_tasks(split="test")[:args.tasks] for _ in range(args.rollouts)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    return tasks, sampling, EpisodeLimits(max_user_turns=args.turns, max_context_tokens=6144)


def _worker(args) -> dict:
    """Run the workload `--repeats` times on one backend in this process; print the figures."""
    from coevolve.services.agent.backends import make_backend
    from coevolve.services.agent.config import BackendConfig
    from coevolve.services.agent.episodes import run_episodes

    config = BackendConfig(model=args.model, backend=args.worker, max_model_len=6144)
    backend = make_backend(config)
    tasks, sampling, limits = _workload(args)
    run_episodes(tasks[:1], "bfcl", backend, sampling, limits)  # warm-up: first-call allocations
    tokens_per_s, episodes_per_min = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        episodes = run_episodes(tasks, "bfcl", backend, sampling, limits, max_in_flight=len(tasks))
        seconds = time.perf_counter() - started
        tokens_per_s.append(sum(e.completion_tokens for e in episodes) / seconds)
        episodes_per_min.append(60 * len(episodes) / seconds)
    out = {"backend": args.worker, "tokens_per_s": tokens_per_s, "episodes_per_min": episodes_per_min}
    if args.worker == "vllm" and "update" in args.parts:
        out["update_s"] = _update_seconds(backend, config, args.repeats)
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
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

    make_backend(BackendConfig(model=args.model, backend="vllm", max_model_len=6144)).close()  # model cached
    started = time.perf_counter()
    backend = make_backend(BackendConfig(model=args.model, backend="vllm", max_model_len=6144,
                                         enforce_eager=bool(args.eager)))
    seconds = time.perf_counter() - started
    backend.close()
    return {"eager": bool(args.eager), "startup_s": seconds}


def _child(args, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "bench.bench_rollout", "--model", args.model, "--tasks", str(args.tasks),
           "--rollouts", str(args.rollouts), "--max-new-tokens", str(args.max_new_tokens),
           "--repeats", str(args.repeats), "--turns", str(args.turns), "--parts", ",".join(args.parts), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} (runs: {', '.join(f'{v:,.2f}' for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--turns", type=int, default=1, help="user turns played per episode")
    parser.add_argument("--parts", type=lambda s: s.split(","), default=["throughput", "update", "startup"])
    parser.add_argument("--worker", choices=["vllm", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--startup-eager", dest="eager", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args)))
        return
    if args.eager is not None:
        print(json.dumps(_startup(args)))
        return
    print(f"machine: {machine()}")
    print(f"workload: {args.tasks} tasks x {args.rollouts} rollouts in flight, {args.max_new_tokens} new tokens, "
          f"{args.turns} user turn(s), model {args.model}, medians of {args.repeats}")
    results = {}
    for backend in ("vllm", "transformers") if "throughput" in args.parts else ("vllm",):
        results[backend] = r = _child(args, "--worker", backend)
        print(f"{backend:13s} generated tokens/s {_median(r['tokens_per_s'])}")
        print(f"{backend:13s} episodes/min      {_median(r['episodes_per_min'])}")
        print(f"{backend:13s} peak RSS GiB      {r['peak_rss_gib']:.2f}")
    if "throughput" in args.parts:
        ratio = statistics.median(results["vllm"]["tokens_per_s"]) / statistics.median(results["transformers"]["tokens_per_s"])
        print(f"vllm / transformers tokens/s: {ratio:.1f}x")
    if "update_s" in results.get("vllm", {}):
        print(f"weight update into vLLM, s: {_median(results['vllm']['update_s'])}")
    if "startup" in args.parts:
        for eager in (1, 0):
            runs = [_child(args, "--startup-eager", str(eager))["startup_s"] for _ in range(args.repeats if eager else 1)]
            print(f"vLLM start-up, enforce_eager={bool(eager)}, s: {_median(runs)}")


if __name__ == "__main__":
    main()
