"""`coevolve analyze` on a run archived from the simulator: every plot written, with data; views
without their events print a note and draw nothing."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from coevolve.services.analytics.report import archive_and_analyze
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.simulate import SimulationConfig, Simulator, publish
from tests import loop_events
from tests.loop_events import loop_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]
COEVOLVE = str(Path(sys.executable).with_name("coevolve"))
PLOTS = {"signals_per_step.png", "validation_pass_rate.png", "turn_distribution.png", "reward_eval.png",
         "task_success_sim-run.png", "rare_patterns.png", "verdicts.png",  # the simulator's verdicts have reasons
         "task_origin.png"}  # its validated tasks, of unknown origin (no explorations)
LOOP_PLOTS = {"evaluation.png", "task_pool.png", "step_time.png", "explorations.png", "verdicts.png"}


def test_analyze_writes_every_plot(bootstrap, tmp_path):
    publish(SimulationConfig(steps=10, tasks=16, batch_tasks=8, group_size=4, forget_probability=0.2), bootstrap)
    archive_and_analyze(bootstrap, tmp_path, idle_s=1.5)
    report = tmp_path / "report"
    assert {p.name for p in report.glob("*.png")} == PLOTS
    for name in PLOTS:
        pixels = matplotlib.image.imread(report / name)
        assert pixels.shape[0] > 300 and pixels.std() > 0.05, name  # drawn, not blank
    assert all(f"src='{name}'" in (report / "index.html").read_text() for name in PLOTS)

    result = subprocess.run([COEVOLVE, "analyze", "--workdir", str(tmp_path), "--json"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    views = data["views"]
    for name in ("validation_per_step", "validation_per_stage", "turns", "reward_eval", "task_success",
                 "rare_patterns", "signals_per_step"):
        assert views[name]["rows"], name
    assert "recomputed" in views["signals_per_step"]["note"]  # the simulator raises no signals itself
    assert {r[0] for r in views["turns"]["rows"]} == {"seed", "synthesized"}
    assert len(views["validation_per_stage"]["rows"]) == 3
    assert data["forgetting"], "forgetting marks on the heatmap"
    for name in ("evaluation", "pool", "step_time", "time_share", "explorations", "stage_funnel"):
        assert not views[name]["rows"] and views[name]["note"], name  # the simulator sends none of these


def test_the_loops_events_get_their_plots_and_tables(bootstrap, tmp_path):
    publish(SimulationConfig(steps=4, tasks=8, batch_tasks=4, group_size=4), bootstrap)
    with EventProducer(bootstrap) as producer:
        for topic, name, event in loop_run():
            producer.send(topic, event, key=event["run_id"], record_name=name)
    archive_and_analyze(bootstrap, tmp_path, idle_s=1.5)
    report = tmp_path / "report"
    assert LOOP_PLOTS <= {p.name for p in report.glob("*.png")}
    for name in LOOP_PLOTS:
        pixels = matplotlib.image.imread(report / name)
        assert pixels.shape[0] > 300 and pixels.std() > 0.05, name
    page = (report / "index.html").read_text()
    assert all(f"src='{name}'" in page for name in LOOP_PLOTS | {"validation_pass_rate.png"})
    assert "<th>blocked_share</th>" in page and "<td>dual_pass</td>" in page

    result = subprocess.run([COEVOLVE, "analyze", "--workdir", str(tmp_path), "--run", "loop-run", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    views = json.loads(result.stdout)["views"]
    assert views["time_share"]["rows"][0][-1] == pytest.approx(loop_events.BLOCKED_SHARE)
    assert [r[4] for r in views["evaluation"]["rows"]] == [v[0] for _, v in sorted(loop_events.EVALUATED.items())]
    assert {(r[1], r[2]): r[4] for r in views["verdicts"]["rows"]} == loop_events.VERDICTS


def test_missing_events_say_so_and_draw_nothing(bootstrap, tmp_path):
    with EventProducer(bootstrap) as producer:  # trajectories only: no steps, no task verdicts
        for topic, key, name, event in Simulator(SimulationConfig(steps=4, tasks=8, batch_tasks=4)).events():
            if name == "TrajectoryRecorded":
                producer.send(topic, event, key=key, record_name=name)
    archive_and_analyze(bootstrap, tmp_path, idle_s=1.5)
    pngs = {p.name for p in (tmp_path / "report").glob("*.png")}
    assert "validation_pass_rate.png" not in pngs and "reward_eval.png" not in pngs
    assert "task_success_sim-run.png" in pngs
    result = subprocess.run([COEVOLVE, "analyze", "--workdir", str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "no TaskChecked events archived" in result.stdout
    assert "no StepCompleted events archived" in result.stdout
