"""`coevolve ablate`'s pieces: arms as overlays at equal budget, seeds, resumable cells, held-out scores per
(seed, task), the paired comparisons, the table and the plot."""
import json

import pytest

from coevolve.services.run import ablate
from coevolve.services.runtime.config import ConfigError


def test_every_arm_the_paper_compares_is_an_overlay_file():
    assert set(ablate.arm_names()) == {"zero-shot", "static", "random", "random-calls", "coevolve", "forgetting",
                                       "boundary", "rare", "no-validation"}
    assert ablate.arm_overrides("coevolve") == []
    assert ablate.arm_overrides("random") == ['explorer.strategy="random"', "explorer.fallback_tasks=0"]
    assert ablate.arm_overrides("random-calls") == ['explorer.strategy="random-calls"', "explorer.fallback_tasks=0"]
    assert ablate.arm_overrides("rare") == ['explorer.signal_kinds="rare"']
    assert ablate.arm_overrides("zero-shot") == ["run.steps=0"]


def test_each_arm_and_seed_plans_as_an_ordinary_run_at_the_presets_budget(tmp_path):
    cells = ablate.plan_cells("smoke", ["static", "random"], 2, tmp_path, ["learner.eval_tasks=1"])
    assert [(c.arm, c.seed, c.workdir) for c in cells] == [
        ("static", 0, tmp_path / "static" / "seed-0"), ("static", 1, tmp_path / "static" / "seed-1"),
        ("random", 0, tmp_path / "random" / "seed-0"), ("random", 1, tmp_path / "random" / "seed-1")]
    budget = ablate.budget("smoke", ["learner.eval_tasks=1"])
    assert budget == {"steps": 3, "batch_tasks": 2, "group_size": 4, "eval_tasks": 1, "eval_every": 3,
                      "eval_split": "test"}
    assert ablate.seed_overrides(1) == ["learner.seed=1", "explorer.seed=1", "explorer.random_seed=1",
                                        "validator.seed=1"]


def test_a_cell_runs_the_arm_over_the_users_settings_and_resumes_only_a_started_run(tmp_path):
    cell = ablate.Cell("zero-shot", 1, tmp_path / "zero-shot" / "seed-1")
    cmd = ablate.run_command(cell, "smoke", ["run.steps=5"])
    assert cmd[1:6] == ["run", "--preset", "smoke", "--workdir", str(cell.workdir)]
    sets = cmd[7::2]
    assert sets == ["run.steps=5", "run.steps=0", *ablate.seed_overrides(1)]  # the arm's comes after the user's
    cell.workdir.mkdir(parents=True)  # a run that failed before it recorded itself: nothing to resume
    assert "--resume" not in ablate.run_command(cell, "smoke", [])
    (cell.workdir / "run.json").write_text('{"run_id": "r"}')
    assert ablate.run_command(cell, "smoke", [])[-1] == "--resume"


def test_unknown_arms_and_no_seeds_are_refused_with_the_choices():
    with pytest.raises(ConfigError, match="unknown arm 'curriculum'; the arms are boundary, coevolve"):
        ablate.plan_cells("smoke", ["curriculum"], 1, None, [])
    with pytest.raises(ConfigError, match="--seeds 0 must be at least 1"):
        ablate.plan_cells("smoke", ["random"], 0, None, [])


def test_an_arm_that_changes_the_budget_is_refused(monkeypatch, tmp_path):
    (tmp_path / "arms").mkdir()
    (tmp_path / "arms" / "bigger.yaml").write_text("learner:\n  group_size: 16\n")
    monkeypatch.setattr(ablate, "ARMS", tmp_path / "arms")
    with pytest.raises(ConfigError, match=r"arm 'bigger' changes the budget \(learner.group_size\)"):
        ablate.arm_overrides("bigger")


def _summary(workdir, run_id, scores, validated=1, state="completed"):
    """A run's summary whose held-out evaluations give `scores[step]`, a list of per-task scores of t0, t1..."""
    workdir.mkdir(parents=True)
    (workdir / "summary.json").write_text(json.dumps({
        "run_id": run_id, "state": state, "tasks_validated": validated, "synthesized_trained": 4 * validated,
        "signals": {"forgetting": 0, "boundary": 1, "rare": 3}, "train_reward": {"1": 0.1, "2": 0.25},
        "wall_seconds": {"start": 10.0, "train": 50.5}, "task_shape": {"validated": {"mean_calls": 2.5}},
        "evaluations": [{"step": s, "success_rate": sum(v == 1.0 for v in vs) / len(vs),
                         "mean_score": sum(vs) / len(vs), "task_ids": [f"t{i}" for i in range(len(vs))],
                         "scores": vs} for s, vs in scores.items()],
        "origin": {"validated": {"signal-guided": validated}, "trained": {"signal-guided": 1}},
        "targeting": {"signal-guided": {"tasks": validated, "targeted": 1, "share": 1 / validated}},
        "repair": {"before_step": 0, "after_step": 3, "explored": {"measured": 1, "change": 0.5},
                   "not_explored": {"measured": 0, "change": None}}}))


BUDGET = {"steps": 3, "batch_tasks": 2, "group_size": 4, "eval_tasks": 4, "eval_every": 3, "eval_split": "test"}


def test_a_finished_cell_is_collected_with_its_scores_per_task(tmp_path):
    cell = ablate.Cell("random", 1, tmp_path / "random" / "seed-1")
    _summary(cell.workdir, "r1", {0: [0.0, 0.0], 3: [1.0, 0.5]})
    failed = ablate.Cell("coevolve", 1, tmp_path / "coevolve" / "seed-1")
    _summary(failed.workdir, "c1", {3: [1.0]}, state="failed")
    assert cell.finished() and not failed.finished() and not ablate.Cell("random", 5, tmp_path / "none").finished()
    row = ablate.collect(cell)
    assert row["held_out"] == {0: {"t0": 0.0, "t1": 0.0}, 3: {"t0": 1.0, "t1": 0.5}}
    assert (row["eval_success"], row["eval_mean_score"], row["evaluations"]) == (0.5, 0.75, {0: 0.0, 3: 0.75})
    assert (row["calls_per_task"], row["wall_seconds"], row["train_reward_last"]) == (2.5, 60.5, 0.25)


def test_arms_pair_by_seed_and_task_and_the_table_says_what_the_design_resolves(tmp_path):
    cells = {arm: [ablate.Cell(arm, s, tmp_path / arm / f"seed-{s}") for s in (0, 1)]
             for arm in ("static", "coevolve")}
    _summary(cells["static"][0].workdir, "s0", {0: [0.0] * 4, 3: [0.0, 0.0, 1.0, 0.0]})
    _summary(cells["static"][1].workdir, "s1", {0: [0.0] * 4, 3: [0.0, 1.0, 0.0, 0.0]})
    _summary(cells["coevolve"][0].workdir, "c0", {0: [0.0] * 4, 3: [1.0, 1.0, 1.0, 0.0]}, validated=3)
    _summary(cells["coevolve"][1].workdir, "c1", {0: [0.0] * 4, 3: [1.0, 1.0, 1.0, 1.0]}, validated=3)
    rows = {arm: [ablate.collect(c) for c in cs] for arm, cs in cells.items()}
    doc = ablate.aggregate("smoke", BUDGET, rows)
    static, coevolve = doc["arms"]
    assert static["held_out_units"] == 8 and static["eval_mean_score_mean"] == pytest.approx(0.25)
    assert coevolve["eval_success_mean"] == pytest.approx(7 / 8)
    [comparison] = doc["comparisons"]
    # pairs: seed 0 (+1, +1, 0, 0), seed 1 (+1, 0, +1, +1): mean 5/8
    assert (comparison["arm"], comparison["against"], comparison["pairs"]) == ("coevolve", "static", 8)
    assert comparison["difference"] == pytest.approx(5 / 8) and comparison["discordant"] == 5
    assert comparison["ci95"][0] > 0 and comparison["detectable"] > 0
    table = ablate.markdown(doc)
    assert "| coevolve | 0.875 [" in table and "| 8 |" in table and "| 2.5 |" in table
    assert "- coevolve - static: +0.625 [+0." in table and "resolved: above 0 at 95%" in table
    assert doc["arms"][1]["origin"] == {"validated": {"signal-guided": 6}, "trained": {"signal-guided": 2}}
    assert doc["arms"][1]["repair"] == {"explored": {"measured": 2, "change": 0.5},
                                        "not_explored": {"measured": 0, "change": None}}
    assert "| coevolve | 6 signal-guided | 2 signal-guided | signal-guided 2/6 | +0.500 (n=2) | n/a (n=0) |" in table
    ablate.plot(doc, tmp_path / "ablation.png")
    assert (tmp_path / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arms_that_score_alike_on_every_pair_are_not_resolved_and_say_so(tmp_path):
    cell = ablate.Cell("random", 0, tmp_path / "random" / "seed-0")
    _summary(cell.workdir, "r0", {3: [0.0, 1.0]})
    doc = ablate.aggregate("smoke", BUDGET, {"coevolve": [ablate.collect(cell)], "random": [ablate.collect(cell)]})
    assert doc["comparisons"][0]["difference"] == 0.0
    assert "every pair scored alike: no difference at this budget" in ablate.markdown(doc)
