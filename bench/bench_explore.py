"""Cost of the explorer and validator with a real model: seconds and tokens per explored signal and per
validated proposal.

    python -m bench.bench_explore [--model smollm2-135m-instruct] [--backend vllm] [--signals 4]

One boundary signal per train task (the first `--signals` train tasks), each explored alone the way
`coevolve explorer` does with its defaults: a reflection under the JSON schema (grammar-constrained
on vLLM), then R=3 exploration runs of at most S=8 calls, sampled at temperature 0.7 (256 new tokens
per generation, 1,024 per reflection). Each signal whose reflection was usable gives one exploration
group, which the validator checks the way `coevolve validator` does: an abstraction under the task
schema, the stages, and a greedy dual-pass attempt. Tokens are prompt plus completion tokens as the
backend counts them. The model's start-up is reported apart. Medians over the signals (and groups).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.common import machine

SAMPLING = {"temperature": 0.7, "max_new_tokens": 256}
JSON_TOKENS = 1024


def boundary_signal(index: int, task_id: str) -> dict:
    """A boundary signal on `task_id` whose evidence holds one failed and one passing rollout."""
    failed = [{"name": "ls", "arguments": "{}", "observation": '{"current_directory_content": []}'}]
    return {"event_id": f"bench-{index}", "kind": "boundary", "run_id": "bench", "step": 1, "subject": task_id,
            "task_id": task_id, "pattern": [], "incomplete": False, "produced_at": 0,
            "thresholds": {"success_threshold": 0.5, "window": 5, "rare_threshold": 5.0, "pattern_length": 1},
            "evidence": {"scores": [1.0, 0.0], "attempt_score": 0.5, "previous_scores": [], "pattern_count": 0,
                         "pattern_total": 0, "task_ids": [task_id],
                         "trajectories": [{"event_id": f"t{index}", "task_id": task_id, "rollout_index": 1,
                                           "score": 0.0, "actions": failed}]}}


def _tokens(backend) -> int:
    return backend.stats.prompt_tokens + backend.stats.completion_tokens


def _explore(backend, model: str, signal: dict) -> dict:
    from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
    from coevolve.services.explorer.config import ExplorerConfig
    from coevolve.services.explorer.exploring import Budget, explore_plan
    from coevolve.services.explorer.planning import SignalBuffer

    config = ExplorerConfig(step_grace_s=0)
    buffer = SignalBuffer(config)
    buffer.add(signal, 0.0)
    (plan,) = buffer.step_completed("bench", 1, 0.0)
    sampling = SamplingConfig(seed=0, **SAMPLING)
    json_sampling = SamplingConfig(temperature=SAMPLING["temperature"], max_new_tokens=JSON_TOKENS, seed=0)
    before, started = _tokens(backend), time.perf_counter()
    out = explore_plan(plan, backend, config, sampling, Budget(), model, [], EpisodeLimits(), json_sampling)
    return {"seconds": time.perf_counter() - started, "tokens": _tokens(backend) - before,
            "explored": bool(out.records), "calls": out.calls, "records": out.records,
            "rejected": [reason for _, _, reason in out.rejected]}


def _validate(backend, records: list[dict], index) -> dict:
    from coevolve.services.agent.config import EpisodeLimits, SamplingConfig
    from coevolve.services.validator.config import ValidatorConfig
    from coevolve.services.validator.proposing import check_group

    sampling = SamplingConfig(temperature=SAMPLING["temperature"], max_new_tokens=JSON_TOKENS, seed=0)
    attempt = SamplingConfig(temperature=0.0, max_new_tokens=SAMPLING["max_new_tokens"])
    before, started = _tokens(backend), time.perf_counter()
    result = check_group(records, backend, index, ValidatorConfig(), sampling,
                         EpisodeLimits(max_calls_per_turn=10), attempt)
    outcome = (result.record["stage"] or "validated") if result.record else f"dead letter ({result.error_type})"
    return {"seconds": time.perf_counter() - started, "tokens": _tokens(backend) - before, "outcome": outcome}


def _median(rows: list[dict], key: str) -> float | None:
    return statistics.median(r[key] for r in rows) if rows else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--signals", type=int, default=4)
    args = parser.parse_args()

    from coevolve.services.agent.backends import make_backend
    from coevolve.services.agent.config import BackendConfig
    from coevolve.services.envs.bfcl_data import load_tasks
    from coevolve.services.validator.novelty import NoveltyIndex

    started = time.perf_counter()
    backend = make_backend(BackendConfig(model=args.model, backend=args.backend, max_model_len=8192))
    startup = time.perf_counter() - started
    index = NoveltyIndex(load_tasks(split="all"))
    tasks = [t.task_id for t in load_tasks(split="train")[:args.signals]]
    explored, checked = [], []
    for i, task_id in enumerate(tasks):
        row = _explore(backend, args.model, boundary_signal(i, task_id))
        explored.append(row)
        print(f"signal on {task_id}: {row['seconds']:.1f} s, {row['tokens']} tokens, "
              f"{'explored' if row['explored'] else 'not explored: ' + '; '.join(row['rejected'])[:160]}", flush=True)
        if row["explored"]:
            checked.append(_validate(backend, row["records"], index))
            print(f"  its proposal: {checked[-1]['seconds']:.1f} s, {checked[-1]['tokens']} tokens, "
                  f"{checked[-1]['outcome']}", flush=True)
    backend.close()
    summary = {
        "machine": machine(), "model": args.model, "backend": args.backend, "startup_seconds": round(startup, 1),
        "signals": len(explored), "explored": sum(r["explored"] for r in explored),
        "seconds_per_signal": _median(explored, "seconds"), "tokens_per_signal": _median(explored, "tokens"),
        "calls_per_signal": _median(explored, "calls"),
        "seconds_per_proposal": _median(checked, "seconds"), "tokens_per_proposal": _median(checked, "tokens"),
        "outcomes": [c["outcome"] for c in checked],
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
