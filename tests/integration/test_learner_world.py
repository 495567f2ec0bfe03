"""`coevolve learner` on two ranks (torchrun, gloo, CPU) against the real embedded broker, `tiny-random`.

Stopped by SIGTERM after a step, both ranks exit 0 and `--resume` continues at the next step; every
step and trajectory is published once; the checkpoint holds both ranks' shards and refuses another
world size. A rank killed mid-run stops the whole group with a message naming it, leaves no process
behind, and `--resume` continues; with `max_restarts`, torchrun restarts the group and the run completes.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.topics import STEPS, TRAJECTORIES
from coevolve.services.learner.loop.checkpoint import latest_checkpoint
from coevolve.services.runtime.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]

B, K = 2, 2
ENV = {"LEARNER_BATCH_TASKS": str(B), "LEARNER_GROUP_SIZE": str(K), "LEARNER_SEED_TASKS": "3",
       "LEARNER_MAX_USER_TURNS": "1", "LEARNER_MAX_CONTEXT_TOKENS": "8000", "LEARNER_DTYPE": "float32",
       "LEARNER_WORLD_SIZE": "2"}


def command(bootstrap: str, workdir: Path, *extra: str) -> list[str]:
    return [str(Path(sys.executable).with_name("coevolve")), "learner", "--bootstrap", bootstrap, "--workdir",
            str(workdir), "--model", "tiny-random", "--backend", "transformers", "--max-new-tokens", "8",
            "--run-id", "run-ranks", *extra]


def environment(**extra: str) -> dict:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **ENV, **extra}


def read(bootstrap: str, topic: str) -> list[dict]:
    consumer = EventConsumer(bootstrap, [topic])
    try:
        return [d.event for d in consumer.drain(idle_s=1.5)]
    finally:
        consumer.close()


def wait_for_step(bootstrap: str, child: subprocess.Popen, timeout_s: float = 240) -> None:
    consumer = EventConsumer(bootstrap, [STEPS.name])
    deadline = time.monotonic() + timeout_s
    try:
        while not consumer.poll(0.5):
            assert child.poll() is None, child.stdout.read()
            assert time.monotonic() < deadline, "no step published"
    finally:
        consumer.close()


def port_pair() -> int:
    """A free port whose next one is free too: rank 0's metrics port and rank 1's."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def rank_pids(parent: int) -> dict[int, int]:
    """rank -> pid of the learner's ranks (processes below `parent` whose environment has RANK)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = dict(item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item)
            ppids = [int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])]
        except (OSError, ValueError, IndexError):
            continue
        if environ.get("TORCHELASTIC_RUN_ID") and "RANK" in environ and str(parent) in ancestors(ppids[0]):
            found[int(environ["RANK"])] = int(proc.name)
    return found


def ancestors(pid: int) -> list[str]:
    chain = []
    while pid > 1:
        chain.append(str(pid))
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def kill_rank_1_after_a_step(bootstrap: str, tmp_path: Path, steps: int, timeout: int,
                             **env: str) -> tuple[int, str, dict]:
    """Run the learner, SIGKILL rank 1 once a step is published: the exit code within `timeout` seconds, the
    output, the first ranks."""
    child = subprocess.Popen(command(bootstrap, tmp_path, "--steps", str(steps)), env=environment(**env),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_step(bootstrap, child)
    ranks = rank_pids(child.pid)
    os.kill(ranks[1], signal.SIGKILL)
    out, _ = child.communicate(timeout=timeout)
    return child.returncode, out, ranks


def assert_published_once(bootstrap: str, last: int) -> None:
    steps = read(bootstrap, STEPS.name)
    assert sorted(s["step"] for s in {s["event_id"]: s for s in steps}.values()) == list(range(1, last + 1))
    trajectories = {t["event_id"]: t for t in read(bootstrap, TRAJECTORIES.name)}.values()
    assert Counter(t["step"] for t in trajectories) == {s: B * K for s in range(1, last + 1)}


@pytest.mark.timeout(900)
def test_two_ranks_stop_together_resume_at_the_next_step_and_refuse_another_world_size(bootstrap, tmp_path):
    port = port_pair()
    child = subprocess.Popen(command(bootstrap, tmp_path, "--steps", "50", "--metrics-port", str(port)),
                             env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_step(bootstrap, child)
    ranks = rank_pids(child.pid)
    assert sorted(ranks) == [0, 1]
    # rank 0 is the service; rank 1 serves its own /healthz and /metrics on the next port
    assert json.loads(get(f"http://127.0.0.1:{port}/healthz"))["world_size"] == 2
    assert json.loads(get(f"http://127.0.0.1:{port + 1}/healthz"))["rank"] == 1
    assert "learner_rank_updates_total" in get(f"http://127.0.0.1:{port + 1}/metrics")
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=240)
    assert child.returncode == 0, out[-4000:]
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks.values())
    saved = latest_checkpoint(tmp_path)
    assert saved.world_size == 2 and saved.step >= 1
    assert len(list((saved.path / "dcp").glob("*.distcp"))) == 2  # each rank's shard
    assert json.loads((saved.path / "state.json").read_text())["world_size"] == 2

    refused = subprocess.run(command(bootstrap, tmp_path, "--steps", str(saved.step + 1), "--resume"),
                             env=environment(LEARNER_WORLD_SIZE="1"), capture_output=True, text=True, timeout=240)
    assert refused.returncode == 2 and "learner.world_size=2" in refused.stderr

    target = saved.step + 1
    done = subprocess.run(command(bootstrap, tmp_path, "--steps", str(target), "--resume"), env=environment(),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"completed step {target} of {target}" in done.stdout
    assert latest_checkpoint(tmp_path).step == target
    assert_published_once(bootstrap, target)


@pytest.mark.timeout(900)
def test_a_killed_rank_stops_the_group_with_its_name_and_resume_continues(bootstrap, tmp_path):
    code, out, ranks = kill_rank_1_after_a_step(bootstrap, tmp_path, steps=50, timeout=240)
    assert code == 1, out[-4000:]
    failed = [json.loads(line) for line in out.splitlines() if '"learner.rank_failed"' in line]
    assert failed and failed[0]["rank"] == 1 and failed[0]["how"] == "killed by SIGKILL", out[-4000:]
    time.sleep(2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks.values())  # nothing left holding the group

    # the kill may land before step 1's checkpoint: the resume replays the journal then
    target = max(s["step"] for s in read(bootstrap, STEPS.name)) + 1
    done = subprocess.run(command(bootstrap, tmp_path, "--steps", str(target), "--resume"), env=environment(),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    assert_published_once(bootstrap, target)


@pytest.mark.timeout(900)
def test_with_max_restarts_torchrun_restarts_the_group_and_the_run_completes(bootstrap, tmp_path):
    """`learner.max_restarts = 1`: a rank killed mid-run makes torchrun restart the whole group, whose
    rank 0 resumes from the latest checkpoint or the journal; the run ends as if nothing happened."""
    target = 3
    code, out, first = kill_rank_1_after_a_step(bootstrap, tmp_path, steps=target, timeout=600,
                                                LEARNER_MAX_RESTARTS="1")
    assert code == 0, out[-4000:]
    assert f"completed step {target} of {target}" in out
    started = [json.loads(line) for line in out.splitlines() if '"learner.started"' in line]
    assert len(started) == 2 and started[0]["resumed_at"] == 0, out[-4000:]
    assert started[1]["resumed_at"] >= 1, started  # the restarted rank 0 went on from step 1 at least
    assert not any(Path(f"/proc/{pid}").exists() for pid in first.values())
    assert_published_once(bootstrap, target)
