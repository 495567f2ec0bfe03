"""A learner SIGKILLed after a step was published and before its checkpoint resumes by replaying that step
from its journal, against the real embedded broker with the `tiny-random` model.

The run checkpoints every 2 steps, publishes step 3 (with an evaluation), and is killed in the rollouts
of step 4. A resume must not re-run step 3 (its ids would come again with other rollouts): every event
id of the run appears with one content however often it is sent, step 3's records are sent again as
they were, and the weights after the replayed update equal those of a run that was never interrupted
(a second child; both children start alike, so their rollouts are the same).
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coevolve.services.kafka.topics import EVALUATIONS, STEPS, TRAJECTORIES
from coevolve.services.learner.loop import journal
from coevolve.services.learner.loop.checkpoint import latest_checkpoint
from tests.integration.test_learner_service import learner, odd_length, read

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def child(bootstrap: str, workdir: str, run_id: str, steps: str, eval_every: str, kill_at: str,
          weights: str = "") -> None:
    """A learner process checkpointing every 2 steps: SIGKILL itself in the rollouts of step `kill_at`
    (0: never), or save its weights to `weights` after `steps` steps."""
    service = None

    def reward(episode) -> float:
        if service.done + 1 == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)
        return odd_length(episode)

    service = learner(bootstrap, Path(workdir), steps=int(steps), reward=reward, run_id=run_id, checkpoint_every=2,
                      eval_every=int(eval_every), eval_tasks=1)
    service.run()
    if weights:
        torch.save(service.trainer.state_dict(), weights)


def spawn(*args: str) -> subprocess.Popen:
    code = "import sys; from tests.integration.test_learner_journal import child; child(*sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def by_id(events: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for event in events:
        out.setdefault(event["event_id"], []).append(event)
    return out


def test_a_step_published_before_a_crash_is_replayed_not_rerun(bootstrap, tmp_path):
    crashed, reference = tmp_path / "crashed", tmp_path / "reference"
    children = [spawn(bootstrap, str(crashed), "run-crash", "50", "3", "4"),  # evaluates at step 3
                spawn(bootstrap, str(reference), "run-ref", "3", "0", "0", str(tmp_path / "reference.pt"))]
    outputs = [c.communicate(timeout=240)[0] for c in children]
    assert children[0].returncode == -signal.SIGKILL, outputs[0][-3000:]
    assert children[1].returncode == 0, outputs[1][-3000:]
    assert latest_checkpoint(crashed).step == 2
    assert [p.name for p in journal.entries_after(crashed, 2)] == ["step-000003"]

    replayed = {}
    service = None

    def reward(episode) -> float:  # the first rollout of step 4: the weights are those of the replay
        if not replayed:
            replayed.update(service.trainer.state_dict())
        return odd_length(episode)

    service = learner(bootstrap, crashed, steps=4, reward=reward, resume=True, checkpoint_every=2)
    service.run()

    trajectories = read(bootstrap, [TRAJECTORIES.name])
    steps = read(bootstrap, [STEPS.name])
    evaluations = read(bootstrap, [EVALUATIONS.name])
    mine = [e for e in trajectories + steps + evaluations if e["run_id"] == "run-crash"]
    copies = by_id(mine)
    assert [i for i, same in copies.items() if any(c != same[0] for c in same)] == []  # ids sent with two contents
    sent = sorted((e["step"], len(copies[e["event_id"]])) for e in trajectories if e["run_id"] == "run-crash")
    assert sorted(set(sent)) == [(1, 1), (2, 1), (3, 2), (4, 1)]
    step_records = sorted((s for s in steps if s["run_id"] == "run-crash"), key=lambda s: s["step"])
    assert [s["step"] for s in step_records] == [1, 2, 3, 3, 4]
    assert [e["step"] for e in evaluations if e["run_id"] == "run-crash"] == [3, 3]  # sent again, not re-run
    third = step_records[2]
    assert third["tokens_trained"] > 0  # step 3 updated the policy: the weights below show its replay
    assert {t["policy_version"] for t in trajectories if t["run_id"] == "run-crash" and t["step"] == 4} == \
        {third["policy_version"]}

    (ref_third,) = [s for s in steps if s["run_id"] == "run-ref" and s["step"] == 3]
    assert ref_third["loss"] == third["loss"]  # the two children rolled out alike
    expected = torch.load(tmp_path / "reference.pt", weights_only=True)
    assert replayed.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.allclose(replayed[name], tensor, atol=1e-6, rtol=0), name
    assert latest_checkpoint(crashed).step == 4 and list(journal.complete(crashed)) == [4]
