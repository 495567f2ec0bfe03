"""BFCL environment throughput: full episodes that replay the ground truth and score every turn.

    python -m bench.bench_env [--category multi_turn_base] [--repeats R] [--call-limit-s S]

Each episode is reset (fresh backend instances from the initial state), one tool-calling step per
turn with that turn's reference calls, one turn-ending message per turn (which runs the reference on
the shadow instances and compares states and results). Single thread. Episodes run in-process, as
`BfclEnv()` does outside a service, and then in the tool host the services use (`envs/host.py`,
`--call-limit-s`), where every call, load and comparison is a round trip to a child process.
"""
from __future__ import annotations

import argparse

from bench.common import machine, median_rate, report
from coevolve.services.agent.config import EpisodeLimits
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.bfcl import BfclEnv
from coevolve.services.envs.hosts import bounded_tool_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--category", default="multi_turn_base", choices=bfcl_data.CATEGORIES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--call-limit-s", type=float, default=10.0, help="the tool host's limit per call")
    args = parser.parse_args()

    tasks = bfcl_data.load_category(args.category)
    calls = sum(len(turn) for t in tasks for turn in t.reference)
    print(f"machine: {machine()}")
    print(f"{len(tasks)} {args.category} tasks, {sum(len(t.turns) for t in tasks)} turns, {calls} reference calls")

    def episodes() -> int:
        env = BfclEnv()
        for task in tasks:
            env.reset(task)
            for turn in task.reference:
                if turn:
                    env.step(list(turn))
                result = env.step("done")
            if not result.success:
                raise SystemExit(f"{task.task_id}: ground truth did not score success")
        return len(tasks)

    rate, runs = median_rate(episodes, args.repeats)
    report(f"episodes ({args.category}, ground truth, in-process)", rate, "episodes/s", runs)
    with bounded_tool_calls(EpisodeLimits(call_limit_s=args.call_limit_s)):
        rate, runs = median_rate(episodes, args.repeats)
    report(f"episodes ({args.category}, ground truth, tool host)", rate, "episodes/s", runs)


if __name__ == "__main__":
    main()
