"""The test tiers are their folders: unit/ runs in the test's process (no process, no broker: the guard in
unit/conftest.py fails a test that starts one), manifests/ renders and validates the Kubernetes tree with
its tools, integration/ starts the real broker, ClickHouse engine or processes and says so with the
`integration` marker, and e2e/ runs whole loops, each marked `integration` and `slow`."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from coevolve.services.kafka.embedded import EmbeddedBroker

TESTS = Path(__file__).resolve().parents[1]
TIERS = {"unit": set(), "manifests": set(), "integration": {"integration"}, "e2e": {"integration", "slow"}}


def _module_marks(path: Path) -> set[str]:
    """The markers a test module's `pytestmark` gives every test in it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)} - {"mark"}
    return set()


def test_a_unit_test_cannot_start_a_process_or_a_broker():
    with pytest.raises(AssertionError, match="move the test to tests/integration/"):
        subprocess.run(["true"], check=False)
    with pytest.raises(AssertionError, match="may not start a broker"):
        EmbeddedBroker().start()


def test_every_test_folder_is_a_tier_and_its_modules_carry_its_markers():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders == set(TIERS)
    wrong = [f"{path.relative_to(TESTS)}: {sorted(_module_marks(path) & {'integration', 'slow'})} "
             f"where its tier wants {sorted(marks)}"
             for tier, marks in TIERS.items() for path in sorted((TESTS / tier).glob("test_*.py"))
             if not (marks <= _module_marks(path) if marks else "integration" not in _module_marks(path))]
    assert wrong == []


def test_heavy_marks_only_integration_files_that_start_vllm():
    heavy = {path.relative_to(TESTS).as_posix() for path in TESTS.glob("*/test_*.py") if "heavy" in _module_marks(path)}
    assert heavy and all(p.startswith("integration/") for p in heavy)
    assert all("vllm" in (TESTS / p).read_text().lower() for p in heavy), heavy  # an engine, a server or a fleet
