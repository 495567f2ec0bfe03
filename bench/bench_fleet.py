"""The rollout fleet against the in-process engine: tokens/s on the same episodes, seconds per weight update.

    python -m bench.bench_fleet [--model smollm2-135m-instruct] [--repeats 3] [--out FILE]

Each backend runs in its own process on the same workload: 4 held-out BFCL tasks x 4 rollouts, all 16
in flight, temperature 1, 64 new tokens per generation, the first user turn (at most 4 calls), float32
weights. `vllm` is the learner's in-process engine (`VllmBackend`); `vllm-server` is one local `vllm
serve` process driven over HTTP (`FleetBackend`: token ids in, ids and log-probs out). Reported per
backend: generated tokens per second of wall time (median over `repeats` runs, after one warm-up run),
and the seconds to push the model's full weights (median of `repeats` pushes): `reload_weights` in
place for the engine, the gloo transfer through vLLM's weight-transfer routes for the server (pause,
broadcast, finish with the version, prefix-cache reset, resume). Both processes share the machine's
cores with nothing else of the benchmark's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import machine


def _workload():
    from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
    from coevolve.services.envs.bfcl_data import load_tasks

    tasks = [t for t in load_tasks(split="test")[:4] for _ in range(4)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=64, seed=0)
    return tasks, sampling, EpisodeLimits(max_user_turns=1, max_calls_per_turn=4, max_context_tokens=6144)


def _worker(args) -> dict:
    """Time the workload and the pushes on one backend, in this process."""
    import torch
    from transformers import AutoModelForCausalLM

    from coevolve.services.agent.config import BackendConfig
    from coevolve.services.agent.episodes import run_episodes
    from coevolve.services.agent.models import resolve_model

    config = BackendConfig(model=args.model, backend=args.backend, max_model_len=6144, dtype="float32")
    model_dir = str(resolve_model(config.model, config.coevolve_home))
    servers = None
    if args.backend == "vllm-server":
        from coevolve.services.fleet.backend import FleetBackend
        from coevolve.services.fleet.config import FleetConfig
        from coevolve.services.fleet.servers import LocalServers

        fleet = FleetConfig(servers=1)
        servers = LocalServers(model_dir, config, fleet, tempfile.mkdtemp(prefix="bench-fleet-")).start()
        backend = FleetBackend(servers.urls, model_dir, config, fleet, model_name=config.model, run_id="bench")
    else:
        from coevolve.services.agent.backends import make_backend

        backend = make_backend(config)
    try:
        tasks, sampling, limits = _workload()
        rates = []
        for i in range(args.repeats + 1):
            started = time.perf_counter()
            episodes = run_episodes(tasks, "bfcl", backend, sampling, limits, max_in_flight=len(tasks))
            seconds = time.perf_counter() - started
            if i:  # the first run warms the engine up
                rates.append(sum(e.completion_tokens for e in episodes) / seconds)
            print(f"  {args.backend}: run {i} {seconds:.1f} s", file=sys.stderr, flush=True)
        policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        pushes = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            backend.update_weights(policy.named_parameters(), version=backend.version + 1)
            pushes.append(time.perf_counter() - started)
        size = sum(p.numel() * p.element_size() for p in policy.parameters())
        return {"backend": args.backend, "tokens_per_s": statistics.median(rates), "runs": rates,
                "push_seconds": statistics.median(pushes), "pushes": pushes, "bytes": size}
    finally:
        backend.close()
        if servers is not None:
            servers.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="")
    parser.add_argument("--backend", default="", choices=("", "vllm", "vllm-server"),
                        help="time only this backend, in this process (the benchmark runs each so)")
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(_worker(args)))
        return
    results = []
    for backend in ("vllm", "vllm-server"):
        done = subprocess.run([sys.executable, "-m", "bench.bench_fleet", "--backend", backend, "--model", args.model,
                               "--repeats", str(args.repeats)], capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            sys.exit(f"{backend} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"machine: {machine()}")
    print(f"workload: 16 BFCL episodes (4 tasks x 4 rollouts), 64 new tokens, {args.model}, float32")
    for r in results:
        print(f"{r['backend']:12s} {r['tokens_per_s']:8.1f} tokens/s (runs {', '.join(f'{x:.1f}' for x in r['runs'])})"
              f"   push {r['push_seconds']:.2f} s of {r['bytes'] / 2**20:.0f} MiB "
              f"(pushes {', '.join(f'{x:.2f}' for x in r['pushes'])})")
    engine, fleet = results
    print(f"fleet / in-process: tokens/s {fleet['tokens_per_s'] / engine['tokens_per_s']:.2f}x, "
          f"push seconds {fleet['push_seconds'] / engine['push_seconds']:.2f}x")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": machine(), "model": args.model, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
