"""Guided exploration with the embedded default model, SmolLM2 on in-process vLLM: the reflection is
grammar-constrained, every exploration call is constrained to the task's tools, and a signal on a task
the loop made is explored from that task (slow: an engine start and CPU generation)."""
import json

import pytest

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.envs import bfcl_data
from coevolve.services.envs.catalog import TaskCatalog
from coevolve.services.explorer.config import ExplorerConfig
from coevolve.services.explorer.exploring import Budget, explore_plan
from coevolve.services.explorer.random_strategy import is_error_observation
from tests.agent_engines import SMOLLM2, vllm_backend
from tests.unit.test_explorer_reflection import boundary_signal
from tests.unit.test_explorer_service import _plan
from tests.unit.test_explorer_subjects import CHILD_ID, _validated

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy]

# Whether a sampled call works is chance (CPU kernels need not reproduce a sample under another load): on
# multi_turn_base_0 (files and a social network) all 20 failed in two of about ten runs here; the car
# task's tools mostly act on the car's own state, and 3 to 12 of its 20 worked over four sampling seeds.
VEHICLE_TASK = "multi_turn_base_64"
CONFIG = ExplorerConfig(runs=4, calls_per_run=5, signals_per_step=1)
CALLS = SamplingConfig(temperature=1.0, max_new_tokens=96, seed=0)
REFLECTIONS = SamplingConfig(temperature=1.0, max_new_tokens=512, seed=0)


def _tools(task_id: str, catalog: TaskCatalog) -> set[str]:
    task = catalog.get(task_id)
    return {t["function"]["name"] for t in bfcl_data.tools_at(task, len(task.turns) - 1)}


def _explore(signal: dict, catalog: TaskCatalog):
    return explore_plan(_plan(CONFIG, signal), vllm_backend(SMOLLM2), CONFIG, CALLS, Budget(), SMOLLM2, [],
                        catalog, json_sampling=REFLECTIONS)


def _engine_signal() -> dict:
    """A boundary signal on a car task whose failing rollout started the engine without the brake."""
    signal = boundary_signal("s1", task_id=VEHICLE_TASK)
    signal["evidence"]["trajectories"][0]["actions"] = [
        {"name": "startEngine", "arguments": '{"ignitionMode": "START"}',
         "observation": '{"error": "Brake pedal needs to be pressed when starting the engine."}'}]
    return signal


@pytest.mark.timeout(1200)
def test_a_boundary_clusters_runs_make_only_valid_calls_to_the_tasks_tools_and_one_succeeds():
    catalog = TaskCatalog()
    out = _explore(_engine_signal(), catalog)
    assert out.rejected == [] and out.unusable == 0 and len(out.records) == CONFIG.runs
    tools = _tools(VEHICLE_TASK, catalog)
    calls = [t for r in out.records for t in r["tuples"]]
    assert len(calls) == CONFIG.runs * CONFIG.calls_per_run
    assert all(t["name"] in tools and isinstance(json.loads(t["arguments"]), dict) for t in calls)
    assert not any(t["observation"].startswith("Invalid action") for t in calls)  # every call parsed
    assert any(not is_error_observation(t["observation"]) for t in calls), [t["observation"] for t in calls]
    context = json.loads(out.records[0]["context"])
    assert set(context["location"]["tools"]) <= tools and out.records[0]["strategy"] == "signal-guided"


@pytest.mark.timeout(1200)
def test_a_signal_on_a_synthesized_task_is_explored_from_that_task():
    catalog = TaskCatalog()
    catalog.add(_validated())
    out = _explore(boundary_signal("s2", task_id=CHILD_ID), catalog)
    assert out.rejected == [] and {r["task_id"] for r in out.records} == {CHILD_ID}
    tools = _tools(CHILD_ID, catalog)
    assert all(t["name"] in tools and t["task_id"] == CHILD_ID for r in out.records for t in r["tuples"])
    assert catalog.lineage(CHILD_ID) == ["multi_turn_base_0"]
