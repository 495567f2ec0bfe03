"""Learner step time split into rollout, scoring, training, weight push and publishing (the `demo` shape).

    python -m bench.bench_learner_step [--model smollm2-135m-instruct] [--backend vllm] [--steps 3]
                                       [--batch-tasks 2] [--group-size 4] [--max-new-tokens 64]
                                       [--user-turns 1] [--autocast off|bf16] [--reward task|parity]
                                       [--gradient-checkpointing]

Runs the real `coevolve learner` service in this process against an embedded broker: BFCL
multi_turn_base train tasks, K rollouts each through the backend, GRPO on the episodes, the weights
pushed into the backend, every trajectory and the StepCompleted published and confirmed. Each step's
phase seconds come from its StepCompleted record; the report gives the median over the steps (step 1
included: nothing warms up across steps but the backend's caches), the tokens trained and the
blocked share. Checkpoints go to a temporary folder.

SmolLM2 scores 0 on nearly every BFCL task, so with the task's own reward (`--reward task`) most
groups are flat and the step skips training and the push. `--reward parity` (the default here)
rewards a rollout whose first generated token id is odd: meaningless as a goal, but it gives every
group reward variance, so each step times a real update and weight push on real episodes.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from bench.common import machine
from coevolve.services.agent.config import BackendConfig, EpisodeLimits
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.topics import create_topics
from coevolve.services.learner.config import GRPOConfig, LearnerConfig, LearnerSettings
from coevolve.services.learner.loop.service import Learner
from coevolve.services.learner.loop.record import PHASES


def parity(episode) -> float:
    """1 when the first generated token id is odd: a stand-in reward with variance in every group."""
    first = episode.token_ids[episode.prompt_len:episode.prompt_len + 1]
    return float(first[0] % 2) if first else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-tasks", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--user-turns", type=int, default=1)
    parser.add_argument("--autocast", default="off")
    parser.add_argument("--reward", default="parity", choices=("task", "parity"))
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as workdir:
        create_topics(broker.bootstrap)
        cfg = LearnerConfig(kafka_bootstrap=broker.bootstrap, workdir=workdir, steps=args.steps,
                            batch_tasks=args.batch_tasks, group_size=args.group_size, checkpoint_every=10**6,
                            max_new_tokens=args.max_new_tokens)
        grpo = GRPOConfig(lr=1e-6, temperature=1.0, micro_batch_size=1, autocast=args.autocast,
                          gradient_checkpointing=args.gradient_checkpointing)
        backend = BackendConfig(model=args.model, backend=args.backend)
        limits = EpisodeLimits(max_user_turns=args.user_turns)
        reward = parity if args.reward == "parity" else None
        learner = Learner(LearnerSettings(cfg, grpo, backend=backend, limits=limits), reward=reward)
        records = []
        started = time.monotonic()
        learner.start()
        try:
            for _ in range(args.steps):
                learner.poll()
                records.append(learner.last.record.to_event())
        finally:
            learner.finish()
        wall = time.monotonic() - started
    print(f"machine: {machine()}")
    print(f"{args.model} via {args.backend}, B={args.batch_tasks}, K={args.group_size}, "
          f"{args.max_new_tokens} new tokens, {args.user_turns} user turn(s), autocast {args.autocast}, "
          f"reward {args.reward}")
    for phase in PHASES:
        values = [r[f"{phase}_seconds"] or 0.0 for r in records]
        print(f"{phase:10s} median {statistics.median(values):8.2f} s   (steps: "
              f"{', '.join(f'{v:.2f}' for v in values)})")
    steps = [r["duration_seconds"] for r in records]
    print(f"{'step':10s} median {statistics.median(steps):8.2f} s   tokens trained per step: "
          f"{', '.join(str(r['tokens_trained']) for r in records)}; trajectories per step: "
          f"{records[0]['trajectory_count']}")
    print(f"blocked share of the learner's wall time (start-up included): "
          f"{sum(r['blocked_seconds'] for r in records) / wall:.2e}")


if __name__ == "__main__":
    main()
