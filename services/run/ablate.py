"""`coevolve ablate`: the paper's ablation table for one preset, as ordinary runs.

Each arm is an overlay on the preset (`arms/<arm>.yaml`: preset sections whose fields the arm changes)
and each arm x seed is one `coevolve run` in `<workdir>/<arm>/seed-<s>/`, with its own broker, archive,
summary and report. The budget (steps, B, K, evaluation tasks, evaluation cadence and split) is the
preset's for every arm, and an arm file may not change it; only `zero-shot` sets `run.steps: 0` (its
policy is evaluated, not trained). Seeds set every seed of the run (`learner.seed`, the explorer's and
validator's engines, the random strategy's calls).

A cell whose summary.json says `completed` is not run again, so an interrupted ablation resumes where
it stopped. At the end `ablation.json` holds every run, each arm's last held-out score and success as a
mean over (seed, task) units with a 95% interval, and the paired comparisons of the arms (`paired.py`);
`ablation.md` the table and `ablation.png` (held-out score per evaluated step per arm, with intervals).
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevolve.services.run.children import coevolve_command
from coevolve.services.run.paired import mean_ci95, paired, units, verdict
from coevolve.services.run.plan import _read, make_plan
from coevolve.services.runtime.config import ConfigError, load

ARMS = Path(__file__).resolve().parent / "arms"
BUDGET = ("run.steps", "learner.batch_tasks", "learner.group_size", "learner.eval_tasks", "learner.eval_every",
          "learner.eval_split")
SEEDS = ("learner.seed", "explorer.seed", "explorer.random_seed", "validator.seed")
COMPARISONS = (("coevolve", "random"), ("coevolve", "static"), ("random", "static"), ("static", "zero-shot"),
               ("coevolve", "zero-shot"))
"""The paper's comparisons, each arm against the one below it, where both arms ran."""


class AblationFailed(RuntimeError):
    """A cell's run did not complete; the message names its logs."""


def arm_names() -> list[str]:
    return sorted(p.stem for p in ARMS.glob("*.yaml"))


def arm_overrides(arm: str) -> list[str]:
    """The arm's overlay as `--set` overrides; refused when it changes the budget."""
    if arm not in arm_names():
        raise ConfigError(f"unknown arm {arm!r}; the arms are {', '.join(arm_names())}")
    _, data = _read(str(ARMS / f"{arm}.yaml"))
    flat = {f"{section}.{key}": value for section, values in data.items() for key, value in values.items()}
    changed = sorted(k for k in flat if k in BUDGET and not (arm == "zero-shot" and k == "run.steps"))
    if changed:
        raise ConfigError(f"arm {arm!r} changes the budget ({', '.join(changed)}); arms run at equal budget")
    return [f"{key}={json.dumps(value)}" for key, value in flat.items()]


def seed_overrides(seed: int) -> list[str]:
    return [f"{key}={seed}" for key in SEEDS]


@dataclass(frozen=True)
class Cell:
    """One arm x seed: an ordinary run in its own workdir."""

    arm: str
    seed: int
    workdir: Path

    @property
    def summary_path(self) -> Path:
        return self.workdir / "summary.json"

    def finished(self) -> bool:
        try:
            return json.loads(self.summary_path.read_text()).get("state") == "completed"
        except (OSError, ValueError):
            return False


def budget(preset: str, sets: list[str]) -> dict[str, Any]:
    """The budget every arm shares: the preset's, with the user's overrides and the learner's defaults."""
    from coevolve.services.learner.config import LearnerConfig

    plan = make_plan(preset, sets)
    learner = load(LearnerConfig, "learner", environ=plan.env("learner"))
    return {"steps": plan.run.steps, **{key.split(".")[1]: getattr(learner, key.split(".")[1]) for key in BUDGET[1:]}}


def plan_cells(preset: str, arms: list[str], seeds: int, root: Path, sets: list[str]) -> list[Cell]:
    """Every arm x seed, each checked as `coevolve run` would check it before anything starts."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds} must be at least 1")
    cells = []
    for arm in arms:
        for seed in range(seeds):
            make_plan(preset, [*sets, *arm_overrides(arm), *seed_overrides(seed)])
            cells.append(Cell(arm, seed, root / arm / f"seed-{seed}"))
    return cells


def run_command(cell: Cell, preset: str, sets: list[str]) -> list[str]:
    """The cell's `coevolve run`: the user's overrides, then the arm's, then the seed's; `--resume` where a
    run was started in its workdir before (an interrupted cell continues it)."""
    overrides = [*sets, *arm_overrides(cell.arm), *seed_overrides(cell.seed)]
    cmd = [coevolve_command(), "run", "--preset", preset, "--workdir", str(cell.workdir),
           *(a for o in overrides for a in ("--set", o))]
    return cmd + ["--resume"] if (cell.workdir / "run.json").is_file() else cmd


def run_cell(cell: Cell, preset: str, sets: list[str]) -> int:
    """`coevolve run` for one cell, its lines on the terminal under the cell's name; its exit code."""
    cmd = run_command(cell, preset, sets)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as child:
        for line in child.stdout:
            print(f"[{cell.arm} seed {cell.seed}] {line}", end="", flush=True)
    return child.returncode


def _last(values: dict) -> Any:
    """The value of the highest step in a summary's per-step map (JSON keys are strings)."""
    return values[max(values, key=int)] if values else None


def collect(cell: Cell) -> dict[str, Any]:
    """One run's row of the table, from its summary.json."""
    summary = json.loads(cell.summary_path.read_text())
    held_out = [e for e in summary["evaluations"] if e.get("split") != "subjects"]
    final = max(held_out, key=lambda e: e["step"], default=None)
    return {"seed": cell.seed, "run_id": summary["run_id"], "workdir": str(cell.workdir),
            "eval_success": final and final["success_rate"], "eval_mean_score": final and final["mean_score"],
            "train_reward_last": _last(summary["train_reward"]), "tasks_validated": summary["tasks_validated"],
            "synthesized_trained": summary.get("synthesized_trained"), "signals": summary["signals"],
            "wall_seconds": round(sum(summary["wall_seconds"].values()), 1),
            "evaluations": {e["step"]: e["mean_score"] for e in held_out},
            "held_out": {e["step"]: dict(zip(e.get("task_ids") or (), e.get("scores") or ())) for e in held_out},
            "calls_per_task": ((summary.get("task_shape") or {}).get("validated") or {}).get("mean_calls"),
            "origin": summary.get("origin") or {}, "targeting": summary.get("targeting") or {},
            "repair": summary.get("repair") or {}}


def mechanism(runs: list[dict]) -> dict[str, Any]:
    """An arm's origin counts summed over seeds, its targeting pooled per strategy, and its repair
    (mean change of explored and unexplored subjects' scores, weighted by subjects measured)."""
    origin: dict[str, dict[str, int]] = {}
    targeting: dict[str, dict[str, Any]] = {}
    repair: dict[str, dict[str, Any]] = {}
    for run in runs:
        for key, counts in run["origin"].items():
            summed = origin.setdefault(key, {})
            for name, n in counts.items():
                summed[name] = summed.get(name, 0) + n
        for strategy, t in run["targeting"].items():
            pooled = targeting.setdefault(strategy, {"tasks": 0, "targeted": 0})
            pooled["tasks"] += t["tasks"]
            pooled["targeted"] += t["targeted"]
        for group, r in run["repair"].items():
            if group not in ("explored", "not_explored"):
                continue
            pooled = repair.setdefault(group, {"measured": 0, "change_sum": 0.0})
            pooled["measured"] += r["measured"]
            pooled["change_sum"] += (r["change"] or 0.0) * r["measured"]
    for t in targeting.values():
        t["share"] = t["targeted"] / t["tasks"] if t["tasks"] else None
    repaired = {g: {"measured": r["measured"], "change": r["change_sum"] / r["measured"] if r["measured"] else None}
                for g, r in repair.items()}
    return {"origin": origin, "targeting": targeting, "repair": repaired}


def aggregate(preset: str, budget_: dict, rows: dict[str, list[dict]]) -> dict[str, Any]:
    """The ablation.json document: per arm its runs, mechanism and final held-out score and success over
    (seed, task) units; the paired comparisons of `COMPARISONS`."""
    arms = []
    for arm, runs in rows.items():
        entry: dict[str, Any] = {"arm": arm, "runs": runs, **mechanism(runs)}
        final = units(runs)
        entry["held_out_units"] = len(final)
        for key, values in (("eval_mean_score", list(final.values())),
                            ("eval_success", [float(v >= 1.0) for v in final.values()])):
            entry[f"{key}_mean"], entry[f"{key}_ci95"] = mean_ci95(values)
        arms.append(entry)
    finals = {arm: units(runs) for arm, runs in rows.items()}
    comparisons = [{"arm": a, "against": b, **paired(finals[a], finals[b])} for a, b in COMPARISONS
                   if a in finals and b in finals]
    return {"preset": preset, "budget": budget_, "arms": arms, "comparisons": comparisons}


def _fmt(mean: float | None, ci: list[float] | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{mean:.3f}"


def _avg(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{sum(values) / len(values):.3g}" if values else "n/a"


def comparisons(doc: dict[str, Any]) -> list[str]:
    """Each paired comparison in a line: the difference in held-out score, its interval, the verdict."""
    lines = []
    for c in doc.get("comparisons") or ():
        interval = f" [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]" if c["ci95"] else ""
        diff = f"{c['difference']:+.3f}" if c["difference"] is not None else "n/a"
        lines.append(f"- {c['arm']} - {c['against']}: {diff}{interval} over {c['pairs']} (seed, task) pairs, "
                     f"{c['discordant']} scored unlike; {verdict(c)}")
    return lines


def markdown(doc: dict[str, Any]) -> str:
    """The table as the paper lays it out: one row per arm, held-out score first, then the paired comparisons."""
    b = doc["budget"]
    seeds = max((len(a["runs"]) for a in doc["arms"]), default=0)
    head = [f"# Ablation: preset `{doc['preset']}`", "",
            f"Equal budget: {b['steps']} steps of B = {b['batch_tasks']} tasks x K = {b['group_size']} rollouts; "
            f"held-out evaluation on {b['eval_tasks'] or 'all'} `{b['eval_split']}` tasks; {seeds} seed(s) per arm. "
            "Held-out columns: the last evaluation, mean over (seed, task) units [95% interval, Student's t].", "",
            "| arm | held-out success | held-out score | units | train reward (last step) | tasks validated | "
            "calls per task | signals (f/b/r) | wall time (s) |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for arm in doc["arms"]:
        runs = arm["runs"]
        signals = "/".join(_avg([r["signals"].get(k) for r in runs]) for k in ("forgetting", "boundary", "rare"))
        rows.append(f"| {arm['arm']} | {_fmt(arm['eval_success_mean'], arm['eval_success_ci95'])} | "
                    f"{_fmt(arm['eval_mean_score_mean'], arm['eval_mean_score_ci95'])} | {arm['held_out_units']} | "
                    f"{_avg([r['train_reward_last'] for r in runs])} | {_avg([r['tasks_validated'] for r in runs])} | "
                    f"{_avg([r.get('calls_per_task') for r in runs])} | {signals} | "
                    f"{_avg([r['wall_seconds'] for r in runs])} |")
    return "\n".join([*head, *rows, "", "Paired differences of the held-out score (same seeds, same tasks):",
                      *comparisons(doc), "", *mechanism_table(doc), "![held-out score per evaluation](ablation.png)",
                      ""])


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "0"


def mechanism_table(doc: dict[str, Any]) -> list[str]:
    """Where each arm's tasks came from, whether they hit a weak spot's tools, and what became of the
    subjects (summed over seeds; docs/run.md, "summary.json")."""
    lines = ["Mechanism (over all seeds): validated and trained-on tasks by strategy; targeting = tasks whose "
             "reference uses a tool of a signal's evidence (for unguided strategies: of any signal raised "
             "before; the base rate); repair = mean change of a signal's subject's greedy score from step 0 to "
             "the last evaluation (explored: a task made from its signal was trained on).", "", "| arm | validated | trained on | targeting | repair: explored | repair: not explored |",
             "|---|---|---|---|---|---|"]
    for arm in doc["arms"]:
        targeting = ", ".join(f"{k} {t['targeted']}/{t['tasks']}" for k, t in sorted(arm["targeting"].items())) or "n/a"
        repair = [arm["repair"].get(g) or {"measured": 0, "change": None} for g in ("explored", "not_explored")]
        cells = [f"{r['change']:+.3f} (n={r['measured']})" if r["change"] is not None else "n/a (n=0)" for r in repair]
        lines.append(f"| {arm['arm']} | {_counts(arm['origin'].get('validated', {}))} | "
                     f"{_counts(arm['origin'].get('trained', {}))} | {targeting} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def plot(doc: dict[str, Any], path: Path) -> None:
    """Held-out score at each evaluated step, one line per arm: the mean over (seed, task) units with its 95%
    interval as an error bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    evaluated: set[int] = set()
    for number, arm in enumerate(doc["arms"]):
        by_step: dict[int, list[float]] = {}
        for run in arm["runs"]:
            for step, scores in (run.get("held_out") or {}).items():
                if scores:  # a summary of an older version keeps no per-task scores
                    by_step.setdefault(int(step), []).extend(scores.values())
        steps = sorted(by_step)
        evaluated.update(steps)
        stats = [mean_ci95(by_step[s]) for s in steps]
        errors = [[m - ci[0] if ci else 0.0 for m, ci in stats], [ci[1] - m if ci else 0.0 for m, ci in stats]]
        shift = (number - (len(doc["arms"]) - 1) / 2) * 0.06  # arms side by side at a shared step
        ax.errorbar([s + shift for s in steps], [m for m, _ in stats], yerr=errors, marker="o", capsize=3,
                    label=arm["arm"])
    ax.set_xticks(sorted(evaluated))
    ax.set_xlim(min(evaluated, default=0) - 0.5, max(evaluated, default=0) + 0.5)
    ax.set_ylim(-0.02, 1.02)
    ax.set(xlabel="step", ylabel="held-out score (mean over seed x task, 95% interval)",
           title=f"Ablation, preset {doc['preset']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_ablation(preset: str, arms: list[str], seeds: int, root: Path, sets: list[str]) -> dict[str, Any]:
    """Run every cell not finished before, then write ablation.json, ablation.md and ablation.png."""
    cells = plan_cells(preset, arms, seeds, root, sets)
    shared = budget(preset, sets)
    started = time.monotonic()
    for number, cell in enumerate(cells, 1):
        if cell.finished():
            print(f"[{cell.arm} seed {cell.seed}] finished before ({cell.summary_path}); not run again", flush=True)
            continue
        print(f"== {number}/{len(cells)}: arm {cell.arm}, seed {cell.seed}, in {cell.workdir}", flush=True)
        code = run_cell(cell, preset, sets)
        if code != 0 or not cell.finished():
            raise AblationFailed(f"arm {cell.arm}, seed {cell.seed} did not complete (exit {code}); its logs are in "
                                 f"{cell.workdir / 'logs'}. Run the same command again to resume: finished "
                                 "cells are kept.")
    doc = aggregate(preset, shared, {arm: [collect(c) for c in cells if c.arm == arm] for arm in arms})
    root.mkdir(parents=True, exist_ok=True)
    (root / "ablation.json").write_text(json.dumps(doc, indent=2) + "\n")
    table = markdown(doc)
    (root / "ablation.md").write_text(table)
    plot(doc, root / "ablation.png")
    print(table, flush=True)
    print(f"ablation: {len(cells)} runs in {time.monotonic() - started:.0f} s; {root / 'ablation.json'}, "
          f"{root / 'ablation.md'}", flush=True)
    return doc
