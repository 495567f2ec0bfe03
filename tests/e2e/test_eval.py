"""`coevolve eval` end to end: SmolLM2 through vLLM, greedy, on the first 2 held-out BFCL tasks."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.services.envs.bfcl import score_calls
from coevolve.services.envs.bfcl_data import get_task, load_tasks

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_coevolve_eval_prints_the_accuracy_and_writes_rescorable_results(tmp_path):
    output = tmp_path / "results.json"
    exe = str(Path(sys.executable).with_name("coevolve"))
    done = subprocess.run([exe, "eval", "--env", "bfcl", "--split", "test", "--model", "smollm2-135m-instruct",
                           "--backend", "vllm", "--limit", "2", "--max-new-tokens", "64", "--output", str(output)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    accuracy, passed, total, mean = re.search(r"^accuracy: ([\d.]+) \((\d+)/(\d+)\), mean score: ([\d.]+)$",
                                              done.stdout, re.M).groups()
    assert int(total) == 2 and "2/2" in done.stderr  # the progress bar reached every task

    results = json.loads(output.read_text())
    assert results["model"] == "smollm2-135m-instruct" and results["backend"] == "vllm"
    assert results["split"] == "test" and results["tasks"] == 2 and results["passed"] == int(passed)
    expected_ids = [t.task_id for t in load_tasks(split="test")[:2]]
    assert [r["task_id"] for r in results["results"]] == expected_ids
    assert results["accuracy"] == pytest.approx(float(accuracy), abs=1e-4)
    assert results["mean_score"] == pytest.approx(sum(r["score"] for r in results["results"]) / 2)
    assert float(mean) == pytest.approx(results["mean_score"], abs=1e-4)
    for entry in results["results"]:
        task = get_task(entry["task_id"])
        assert set(entry) >= {"task_id", "success", "score", "turns", "calls"}
        assert len(entry["calls"]) == len(task.turns) and 1 <= entry["turns"] <= len(task.turns)
        assert all(isinstance(c, str) for turn in entry["calls"] for c in turn)
        assert not (entry["truncated"] or "").startswith("backend error"), entry["truncated"]
        if entry["truncated"] is None:
            assert score_calls(task, entry["calls"][:entry["turns"]])["score"] == entry["score"]
