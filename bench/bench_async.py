"""Learner step time with bounded staleness: learner.max_policy_lag L = 0 (synchronous) against L = 1.

    python -m bench.bench_async [--repeats 2] [--steps 3] [--preset demo] [--workdir DIR] [--out FILE]

Each run is a standalone `coevolve learner` process with the preset's learner settings (by default the
`demo` preset: SmolLM2-135M-Instruct warmed, via vLLM, B = 2, K = 4, partial reward) and
LEARNER_MAX_POLICY_LAG = L, against one embedded broker, a fresh --workdir and --run-id each. No
explorer or validator runs, so the pool stays the seed tasks and both arms draw the same tasks with
the same seeds. The runs alternate L0, L1, L0, L1 ... for `--repeats` rounds, so both arms see the
same load from other jobs. The held-out evaluation is off (learner.eval_every=0): it runs after a
step, outside the step's time, and only lengthens each run.

Per step, the StepCompleted record gives duration_seconds, rollout_seconds (with L = 1 the time the
step waited for rollouts the look-ahead started during the previous step), training_seconds,
push_seconds and staleness_max. An arm's medians are over steps 2..N of all its runs: step 1 of
L = 1 has nothing generated ahead, so it is left out of both arms. With L = 1 the rollouts of step s+1
run in a background thread of the same process while step s trains and pushes; on a machine where
generation and training share the same cores they compete for them, so the overlap buys little there
and the figures move with the machine's load. Where they sit on different devices (a rollout fleet on its own GPU or cores) a step
approaches max(rollout, training + push) instead of their sum: the report gives that figure computed
from the L = 0 medians, labelled as computed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.topics import STEPS, create_topics
from coevolve.services.run.plan import make_plan

FIELDS = ("duration_seconds", "rollout_seconds", "scoring_seconds", "training_seconds", "push_seconds",
          "publish_seconds", "staleness_max", "staleness_mean", "tokens_trained", "policy_version")


def learner_env(preset: str, steps: int, lag: int, evaluate: bool) -> dict[str, str]:
    """The process environment: this one without LEARNER_* variables, then the preset's learner section."""
    extra = {"max_policy_lag": lag} if evaluate else {"max_policy_lag": lag, "eval_every": 0}
    plan = make_plan(preset, [f"run.steps={steps}"])
    base = {k: v for k, v in os.environ.items() if not k.startswith("LEARNER_")}
    return base | plan.env("learner", **extra)


def step_records(bootstrap: str, run_id: str) -> list[dict]:
    """The StepCompleted records of one run, in step order."""
    reader = EventConsumer(bootstrap, [STEPS.name], service="bench-async")
    try:
        events = [d.event for d in reader.read_to_end()]
    finally:
        reader.close()
    mine = {e["step"]: e for e in events if e["run_id"] == run_id}
    return [mine[s] for s in sorted(mine)]


def run_once(bootstrap: str, root: Path, preset: str, steps: int, lag: int, index: int, evaluate: bool) -> dict:
    run_id = f"bench-async-{index:02d}-lag{lag}"
    workdir = root / run_id
    workdir.mkdir(parents=True)
    coevolve = Path(sys.executable).parent / "coevolve"
    cmd = [str(coevolve), "learner", "--bootstrap", bootstrap, "--workdir", str(workdir), "--run-id", run_id]
    started = time.monotonic()
    with open(workdir / "learner.log", "w") as log:
        proc = subprocess.run(cmd, env=learner_env(preset, steps, lag, evaluate), stdout=log,
                              stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    records = step_records(bootstrap, run_id)
    out = {"run_id": run_id, "lag": lag, "exit_code": proc.returncode, "wall_seconds": round(wall, 1),
           "steps": [{"step": r["step"], **{k: r.get(k) for k in FIELDS}} for r in records]}
    if proc.returncode or len(records) != steps:
        out["log_tail"] = (workdir / "learner.log").read_text()[-3000:]
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(runs: list[dict], lag: int) -> dict:
    """An arm's medians over steps 2..N of its runs."""
    steps = [s for r in runs if r["lag"] == lag and not r["exit_code"] for s in r["steps"] if s["step"] >= 2]
    first = [s for r in runs if r["lag"] == lag and not r["exit_code"] for s in r["steps"] if s["step"] == 1]
    train_push = [(s["training_seconds"] or 0.0) + (s["push_seconds"] or 0.0) for s in steps]
    lags = [s["staleness_max"] for s in steps if s["staleness_max"] is not None]
    return {"lag": lag, "steps_counted": len(steps),
            "step_seconds": median([s["duration_seconds"] for s in steps]),
            "rollout_seconds": median([s["rollout_seconds"] for s in steps]),
            "training_seconds": median([s["training_seconds"] or 0.0 for s in steps]),
            "push_seconds": median([s["push_seconds"] or 0.0 for s in steps]),
            "training_plus_push_seconds": median(train_push),
            "staleness_max": max(lags) if lags else None,
            "step1_seconds": median([s["duration_seconds"] for s in first]),
            "all_step_seconds": [round(s["duration_seconds"], 2) for s in steps]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="Rounds of one L=0 and one L=1 run.")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--evaluate", action="store_true", help="Keep the preset's held-out evaluation.")
    parser.add_argument("--workdir", type=Path, default=None, help="Where the runs go (default: a temporary folder).")
    parser.add_argument("--out", type=Path, default=None, help="Write the runs and medians as JSON here.")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be 2 or more: step 1 is left out of the medians")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-async-"))
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f} at start", flush=True)
    runs: list[dict] = []
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap)
        index = 0
        for round_ in range(1, args.repeats + 1):
            for lag in (0, 1):
                index += 1
                result = run_once(broker.bootstrap, root, args.preset, args.steps, lag, index, args.evaluate)
                runs.append(result)
                per_step = ", ".join(f"{s['step']}: {s['duration_seconds']:.1f} s (rollout "
                                     f"{s['rollout_seconds']:.1f}, train {s['training_seconds'] or 0:.1f}, push "
                                     f"{s['push_seconds'] or 0:.1f}, lag {s['staleness_max']})"
                                     for s in result["steps"])
                print(f"round {round_}/{args.repeats} L={lag}: exit {result['exit_code']}, wall "
                      f"{result['wall_seconds']:.0f} s, load {os.getloadavg()[0]:.1f}; steps {per_step}", flush=True)
                if "log_tail" in result:
                    print(result["log_tail"], flush=True)
    arms = {f"L{lag}": summarize(runs, lag) for lag in (0, 1)}
    l0, l1 = arms["L0"], arms["L1"]
    ratio = l1["step_seconds"] / l0["step_seconds"] if l0["step_seconds"] and l1["step_seconds"] else None
    overlapped = (max(l0["rollout_seconds"], l0["training_plus_push_seconds"])
                  if l0["rollout_seconds"] is not None else None)
    summary = {"machine": machine(), "preset": args.preset, "steps": args.steps, "repeats": args.repeats,
               "arms": arms, "ratio_L1_over_L0": ratio,
               "computed_overlapped_step_seconds": overlapped,
               "computed_note": "max(rollout, training + push) of the L=0 medians: the step time generation "
                                "on its own device would approach; computed, not measured",
               "runs": runs}
    for name, arm in arms.items():
        if arm["step_seconds"] is None:
            print(f"{name}: no completed steps 2..N")
            continue
        print(f"{name}: median step {arm['step_seconds']:.1f} s, rollout wait {arm['rollout_seconds']:.1f} s, "
              f"training {arm['training_seconds']:.1f} s, push {arm['push_seconds']:.1f} s over "
              f"{arm['steps_counted']} steps (2..{args.steps}); staleness max {arm['staleness_max']}; "
              f"step 1 median {arm['step1_seconds']:.1f} s")
    if ratio is not None:
        print(f"median step L=1 / L=0: {ratio:.2f} (generation and training share these cores: the "
              f"look-ahead's generation competes with the training it overlaps)")
    if overlapped is not None:
        print(f"computed, not measured: with generation on its own device a step would approach "
              f"max(rollout {l0['rollout_seconds']:.1f}, training + push {l0['training_plus_push_seconds']:.1f}) "
              f"= {overlapped:.1f} s against the measured L=0 median {l0['step_seconds']:.1f} s")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
