"""`coevolve ablate`'s pieces: arms as overlays at equal budget, seeds, resumable cells, the interval over
seeds, the table and its separability, the plot."""
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


def test_the_interval_is_students_t_over_seeds():
    mean, ci = ablate.mean_ci95([0.2, 0.4])
    assert mean == pytest.approx(0.3)
    assert ci == pytest.approx([0.3 - 12.706 * 0.1, 0.3 + 12.706 * 0.1])  # sd 0.1414 / sqrt 2 = 0.1
    assert ablate.mean_ci95([0.5]) == (0.5, None)
    assert ablate.mean_ci95([]) == (None, None)


def _summary(workdir, run_id, scores, validated=1, state="completed"):
    workdir.mkdir(parents=True)
    (workdir / "summary.json").write_text(json.dumps({
        "run_id": run_id, "state": state, "tasks_validated": validated, "synthesized_trained": 4 * validated,
        "signals": {"forgetting": 0, "boundary": 1, "rare": 3}, "train_reward": {"1": 0.1, "2": 0.25},
        "wall_seconds": {"start": 10.0, "train": 50.5},
        "evaluations": [{"step": s, "success_rate": v / 2, "mean_score": v} for s, v in scores.items()],
        "origin": {"validated": {"signal-guided": validated}, "trained": {"signal-guided": 1}},
        "targeting": {"signal-guided": {"tasks": validated, "targeted": 1, "share": 1 / validated}},
        "repair": {"explored": {"measured": 1, "change": 0.5}, "not_explored": {"measured": 0, "change": None}}}))


def test_a_finished_cell_is_collected_and_the_table_says_what_cannot_be_separated(tmp_path):
    cells = {arm: [ablate.Cell(arm, s, tmp_path / arm / f"seed-{s}") for s in (0, 1)] for arm in ("random", "coevolve")}
    _summary(cells["random"][0].workdir, "r0", {2: 0.2, 3: 0.3})
    _summary(cells["random"][1].workdir, "r1", {2: 0.2, 3: 0.5})
    _summary(cells["coevolve"][0].workdir, "c0", {2: 0.3, 3: 0.4}, validated=3)
    _summary(cells["coevolve"][1].workdir, "c1", {2: 0.3, 3: 0.6}, state="failed")
    assert cells["random"][0].finished() and not cells["coevolve"][1].finished()
    assert not ablate.Cell("random", 5, tmp_path / "none").finished()

    row = ablate.collect(cells["random"][1])
    assert row == {"seed": 1, "run_id": "r1", "workdir": str(cells["random"][1].workdir), "eval_success": 0.25,
                   "eval_mean_score": 0.5, "train_reward_last": 0.25, "tasks_validated": 1, "synthesized_trained": 4,
                   "signals": {"forgetting": 0, "boundary": 1, "rare": 3}, "wall_seconds": 60.5,
                   "evaluations": {2: 0.2, 3: 0.5},
                   "origin": {"validated": {"signal-guided": 1}, "trained": {"signal-guided": 1}},
                   "targeting": {"signal-guided": {"tasks": 1, "targeted": 1, "share": 1.0}},
                   "repair": {"explored": {"measured": 1, "change": 0.5}, "not_explored": {"measured": 0,
                                                                                          "change": None}}}
    rows = {"random": [ablate.collect(c) for c in cells["random"]],
            "coevolve": [ablate.collect(cells["coevolve"][0]), ablate.collect(cells["coevolve"][0])]}
    doc = ablate.aggregate("smoke", {"steps": 3, "batch_tasks": 2, "group_size": 4, "eval_tasks": 2,
                                     "eval_every": 3, "eval_split": "test"}, rows)
    random_arm = doc["arms"][0]
    assert random_arm["arm"] == "random" and random_arm["eval_mean_score_mean"] == pytest.approx(0.4)
    assert random_arm["eval_success_ci95"][0] < 0.2 < random_arm["eval_success_ci95"][1]
    assert doc["arms"][1]["eval_mean_score_ci95"] == pytest.approx([0.4, 0.4])  # two equal seeds: no spread
    table = ablate.markdown(doc)
    assert "| random | 0.200 [" in table and "| coevolve | 0.200 [0.200, 0.200] | 0.400 [0.400, 0.400] |" in table
    assert "- random vs coevolve: not separable at this budget (the 95% intervals overlap)" in table
    coevolve = doc["arms"][1]  # two runs of 3 validated tasks, 1 of each on a weak spot's tools
    assert coevolve["origin"] == {"validated": {"signal-guided": 6}, "trained": {"signal-guided": 2}}
    assert coevolve["targeting"] == {"signal-guided": {"tasks": 6, "targeted": 2, "share": pytest.approx(1 / 3)}}
    assert coevolve["repair"] == {"explored": {"measured": 2, "change": 0.5}, "not_explored": {"measured": 0,
                                                                                              "change": None}}
    assert ("| coevolve | 6 signal-guided | 2 signal-guided | signal-guided 2/6 | +0.500 (n=2) | n/a (n=0) |"
            in table)
    ablate.plot(doc, tmp_path / "ablation.png")
    assert (tmp_path / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_seed_gives_no_interval_and_says_so(tmp_path):
    cell = ablate.Cell("random", 0, tmp_path / "random" / "seed-0")
    _summary(cell.workdir, "r0", {3: 0.3})
    doc = ablate.aggregate("smoke", {"steps": 3, "batch_tasks": 2, "group_size": 4, "eval_tasks": 0,
                                     "eval_every": 3, "eval_split": "test"},
                           {"coevolve": [ablate.collect(cell)], "random": [ablate.collect(cell)]})
    assert doc["arms"][0]["eval_mean_score_ci95"] is None
    assert "- random vs coevolve: one seed: no interval, not separable" in ablate.markdown(doc)
