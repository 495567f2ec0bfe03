"""Whole runs: the loop (`run`), the ablation table, the data-plane check, a simulated run and the
held-out evaluation."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from coevolve.services.agent.config import EvalSettings
from coevolve.services.cli.common import BootstrapOpt, app, load, require, settings_flags
from coevolve.services.runtime.config import ConfigError
from coevolve.services.simulate import SimulationConfig


@app.command()
def run(
    preset: str = typer.Option("demo", help="smoke (CI size, tiny-random), demo (SmolLM2, the default), paper "
                               "(a GPU cluster's settings), or a YAML file of the same shape."),
    workdir: Path = typer.Option(Path(".coevolve"), help="Where the run keeps logs, checkpoints, archive, "
                                 "report and summary.json."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --workdir from its last checkpoint."),
    steps: Optional[int] = typer.Option(None, help="Training steps (the preset's run.steps)."),
    model: Optional[str] = typer.Option(None, help="Model of the learner, and of the explorer and validator "
                                        "unless they act with the learner's policy (run.shared_policy)."),
    settings: Optional[list[str]] = typer.Option(None, "--set", help="Override one preset field: "
                                                 "SECTION.FIELD=VALUE, e.g. --set learner.lr=1e-5 (repeatable)."),
    run_id: Optional[str] = typer.Option(None, help="Run id of a new run (default: run-<UTC time>-<random>)."),
    bootstrap: Optional[str] = BootstrapOpt,
) -> None:
    """Run the co-evolution loop: learner, signal worker, explorer, validator and archiver, then the report."""
    from coevolve.services.run.command import run_loop
    from coevolve.services.run.plan import make_plan

    overrides = list(settings or [])
    if steps is not None:
        overrides.append(f"run.steps={steps}")
    try:
        if model is not None:  # a process acting with the learner's policy (run.shared_policy) takes its model
            sharing = make_plan(preset, overrides).run.sharing
            overrides += [f"{service}.model={model}" for service in ("learner", "explorer", "validator")
                          if service not in sharing]
        plan = make_plan(preset, overrides)
        summary = run_loop(plan, workdir, bootstrap=bootstrap, resume=resume, run_id=run_id)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if summary["state"] in ("interrupted", "killed"):
        raise typer.Exit(130)
    if summary["state"] != "completed":
        raise typer.Exit(1)


@app.command()
def ablate(
    preset: str = typer.Option("smoke", help="The preset every arm overlays (smoke, demo, study, paper, or a YAML file)."),
    arms: str = typer.Option("zero-shot,static,random,coevolve", help="Comma-separated arms: zero-shot, static, "
                             "random, coevolve, forgetting, boundary, rare, no-validation."),
    seeds: int = typer.Option(2, help="Seeds per arm (0..N-1); arms pair by (seed, held-out task)."),
    workdir: Path = typer.Option(Path(".coevolve-ablation"), help="Where each arm x seed runs "
                                 "(<arm>/seed-<s>/) and ablation.json, ablation.md and ablation.png go."),
    settings: Optional[list[str]] = typer.Option(None, "--set", help="Override one preset field for every arm: "
                                                 "SECTION.FIELD=VALUE (repeatable)."),
) -> None:
    """Run the paper's ablation table: each arm x seed an ordinary run at equal budget; resumable."""
    from coevolve.services.run.ablate import AblationFailed, run_ablation

    try:
        run_ablation(preset, [a.strip() for a in arms.split(",") if a.strip()], seeds, workdir, list(settings or []))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    except AblationFailed as exc:
        print(f"ablation stopped: {exc}", flush=True)
        raise typer.Exit(1) from None


@app.command()
def check(
    workdir: Path = typer.Option(Path(".coevolve-check"), help="Where the check keeps its archive and report."),
    steps: int = typer.Option(12, help="Simulated training steps."),
    bootstrap: Optional[str] = BootstrapOpt,
) -> None:
    """Check the data plane on a simulated workload: live signals equal `coevolve replay`'s, then archive."""
    from coevolve.services.pipeline import run_pipeline

    summary = run_pipeline(workdir, steps, bootstrap=bootstrap)
    if not summary.signals_agree:
        print(f"live signals differ from replay; the worker's log is {workdir / 'streams-worker.log'}",
              file=sys.stderr)
        raise typer.Exit(1)


@app.command()
@settings_flags(SimulationConfig, "run_id", "tasks", "steps", "batch_tasks", "group_size", "forget_probability",
                 "zipf_exponent", "synthesized_per_step", "validation_pass_rate", "seed",
                 group_size=("--group-size", "-k"))
def simulate(
    flags: dict,
    kafka_bootstrap: Optional[str] = BootstrapOpt,
    output: Optional[Path] = typer.Option(None, help="Write an Avro log file instead of publishing "
                                          "(trajectories here, other events beside it)."),
    rate: float = typer.Option(0.0, help="Events per second to publish; 0 publishes as fast as possible."),
) -> None:
    """Publish a simulated run's event stream (trajectories, steps, task verdicts); SIMULATE_<FIELD> too."""
    from coevolve.services.simulate import publish, write_file

    cfg = load(SimulationConfig, "simulate", flags)
    if output is not None:
        counts, files = write_file(cfg, output)
        for path in files:
            print(f"wrote {path}")
    else:
        counts = publish(cfg, require(kafka_bootstrap), rate)
    print(" ".join(f"{name}={n}" for name, n in sorted(counts.items())))


@app.command("eval")
@settings_flags(EvalSettings, "env", "split", "model", "backend", "base_url", "limit", "max_new_tokens",
                 "in_flight")
def eval_command(
    flags: dict,
    output: Path = typer.Option(Path("results.json"), help="Where to write the per-task results."),
) -> None:
    """Run greedy episodes on a split and print the paper's metric (BFCL multi-turn accuracy).

    Every setting of EvalSettings (services/agent/config.py) is also read from EVAL_<FIELD>."""
    from coevolve.services.agent.evaluate import headline, run_eval
    from coevolve.services.agent.models import ModelError

    settings = load(EvalSettings, "eval", flags)
    try:
        summary = run_eval(settings.backend, settings.eval, settings.limits, output)
    except ModelError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    print(headline(summary))
