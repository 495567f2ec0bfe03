"""The README's examples that take seconds run as shown, in order, in an empty folder: simulate a run,
replay and compare its signals, archive it, analyse it, show a task and score its reference."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_docs_commands import ROOT, examples_in

COEVOLVE = str(Path(sys.executable).with_name("coevolve"))
# The README's quick examples, in the order that gives each the files it reads.
QUICK = ["coevolve simulate --output run.avro", "coevolve replay --input run.avro --compare base.jsonl",
         "coevolve archive import --input run.avro", "coevolve analyze --workdir .coevolve",
         "coevolve env show --task-id multi_turn_base_0",
         "coevolve env score --task-id multi_turn_base_0 --calls calls.json"]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run([COEVOLVE, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"coevolve {' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.timeout(900)
def test_the_readmes_quick_examples_run_as_shown(tmp_path):
    shown = {e.text for e in examples_in(ROOT / "README.md")}
    assert set(QUICK) <= shown, sorted(set(QUICK) - shown)
    out = {}
    for text in QUICK:
        args = shlex.split(text)[1:]
        if text.startswith("coevolve replay"):  # the baseline it compares against, first
            run(["replay", "--input", "run.avro", "--output", "base.jsonl"], tmp_path)
        if text.startswith("coevolve env score"):
            task = json.loads(run(["env", "show", "--task-id", "multi_turn_base_0", "--json"], tmp_path))
            (tmp_path / "calls.json").write_text(json.dumps(task["reference_solution"]))
        out[args[0] + (" " + args[1] if args[0] in ("env", "archive") else "")] = run(args, tmp_path)
    assert (tmp_path / "run.avro").is_file() and "TrajectoryRecorded=2560" in out["simulate"]
    assert re.search(r"compared with [1-9]\d* signals: \+0 -0", out["replay"])  # same log, same signals
    assert "into chdb://" in out["archive import"]
    assert (tmp_path / ".coevolve" / "report" / "index.html").is_file()
    assert "multi_turn_base_0" in out["env show"]
    assert json.loads(out["env score"])["success"] is True
