"""`coevolve ablate --preset smoke` with two arms and one seed: each arm an ordinary run whose summary shows
what the arm changes, ablation.json/.md/.png written, and a second invocation runs nothing new."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.services.clickhouse.client import chdb_url, connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EXE = str(Path(sys.executable).with_name("coevolve"))


def _explorations(workdir: Path, sql: str) -> list:
    client = connect(chdb_url(workdir), create=False)
    try:
        return client.query(sql).result_rows
    finally:
        client.close()


def _exploration_steps(workdir: Path) -> set[int]:
    return {row[0] for row in _explorations(workdir, "SELECT DISTINCT step FROM coevolve.explorations FINAL")}


@pytest.mark.timeout(2400)  # two smoke runs, the static one waiting 150 s for its tasks
def test_ablate_runs_each_arm_at_equal_budget_and_a_second_call_runs_nothing_new(tmp_path):
    cmd = [EXE, "ablate", "--preset", "smoke", "--arms", "static,random", "--seeds", "1", "--workdir", str(tmp_path)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    doc = json.loads((tmp_path / "ablation.json").read_text())
    assert doc["preset"] == "smoke" and [a["arm"] for a in doc["arms"]] == ["static", "random"]
    assert doc["budget"] == {"steps": 3, "batch_tasks": 2, "group_size": 4, "eval_tasks": 2, "eval_every": 3,
                             "eval_split": "test"}
    summaries = {}
    for arm in doc["arms"]:
        (run,) = arm["runs"]
        summary = summaries[arm["arm"]] = json.loads((Path(run["workdir"]) / "summary.json").read_text())
        assert summary["state"] == "completed" and summary["steps"] == 3 and run["run_id"] == summary["run_id"]
        assert run["eval_mean_score"] == summary["evaluations"][-1]["mean_score"] == arm["eval_mean_score_mean"]
        assert arm["held_out_units"] == 2  # one seed x the preset's 2 held-out tasks
        assert f"[{arm['arm']} seed 0] step 3/3" in first.stdout  # progress: arm, seed, step
    # static: its tasks were explored once, before training (step 0), and nothing during training.
    assert set(summaries["static"]["explorations"]) == {"static"}
    assert _exploration_steps(Path(doc["arms"][0]["runs"][0]["workdir"])) == {0}
    # random: every exploration is the explorer's model on a random seed task; none read a signal.
    assert set(summaries["random"]["explorations"]) <= {"random"}
    rows = _explorations(Path(doc["arms"][1]["runs"][0]["workdir"]), "SELECT model, context, signal_id, "
                         "length(tuples) FROM coevolve.explorations FINAL")
    assert all(model and context == "" and signal is None for model, context, signal, _ in rows)
    assert not rows or sum(calls for *_, calls in rows) > 0  # explored only where the run raised signals
    table = (tmp_path / "ablation.md").read_text()
    assert "| static |" in table and "| random |" in table and "- random - static: " in table
    assert "over 2 (seed, task) pairs" in table and [c["pairs"] for c in doc["comparisons"]] == [2]
    assert (tmp_path / "ablation.png").stat().st_size > 0

    before = {arm: (tmp_path / arm / "seed-0" / "summary.json").stat().st_mtime_ns for arm in ("static", "random")}
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-4000:]
    assert second.stdout.count("not run again") == 2 and "== " not in second.stdout
    assert before == {arm: (tmp_path / arm / "seed-0" / "summary.json").stat().st_mtime_ns for arm in before}
