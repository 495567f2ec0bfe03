"""The explorer and validator as processes through the real broker with the embedded default model,
SmolLM2 on vLLM, for one signal end to end (slow: each process builds its engine)."""
import pytest

from coevolve.services.kafka.topics import DEADLETTER, EXPLORATIONS, TASKS
from tests.integration.test_explorer_validator import (FAST, _assert_one_verdict_per_group, _assert_replays,
                                                       _publish_period, _read, _run)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy]

SMOLLM2 = ["--model", "smollm2-135m-instruct", "--backend", "vllm", "--max-new-tokens", "96",
           "--json-max-new-tokens", "512"]


@pytest.mark.timeout(2400)  # two engine start-ups and CPU generation, on a shared machine
def test_one_signal_end_to_end_with_smollm2_on_vllm(bootstrap, tmp_path):
    """The embedded default model, once: its reflection (grammar-constrained) is used, R runs explore,
    and the validator gives their group one verdict (or a dead letter with the reason)."""
    signal_ids = _publish_period(bootstrap)
    _run("explorer", bootstrap, [*SMOLLM2, *FAST, "--runs", "2", "--calls-per-run", "2", "--signals-per-step", "1",
                                 "--group-id", "smollm2"], tmp_path / "explorer.log", timeout=1200)
    explorations = _read(bootstrap, EXPLORATIONS.name)
    dead = [d for d in _read(bootstrap, DEADLETTER.name) if d["service"] == "explorer"]
    assert dead == [], dead[0]["reason"]
    assert len(explorations) == 2 and {e["strategy"] for e in explorations} == {"signal-guided"}
    assert len({e["signal_id"] for e in explorations}) == 1 and explorations[0]["signal_id"] in signal_ids
    assert all(e["context"] for e in explorations)
    _run("validator", bootstrap, [*SMOLLM2, "--metrics-port", "-1", "--rounds-per-group", "2", "--group-id",
                                  "smollm2"], tmp_path / "validator.log", timeout=1200)
    verdicts = _read(bootstrap, TASKS.name)
    validator_dead = [d for d in _read(bootstrap, DEADLETTER.name) if d["service"] == "validator"]
    _assert_one_verdict_per_group(explorations, verdicts, validator_dead)
    _assert_replays(verdicts)
