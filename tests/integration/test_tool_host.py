"""Tool calls in the tool host (services/envs/host.py): a call past its limit fails with no effect, a dead
host is replaced, open episodes keep their state through both, and one that cannot be rebuilt ends."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from coevolve.services.agent.config import EpisodeLimits
from coevolve.services.envs.base import Task
from coevolve.services.envs.bfcl import BfclEnv
from coevolve.services.envs.hosts import bounded_tool_calls
from coevolve.services.validator.stages import check_executable

pytestmark = pytest.mark.integration

LIMITS = EpisodeLimits(call_limit_s=2.0, call_memory_mb=512)
STATE = {"GorillaFileSystem": {"root": {"w": {"type": "directory", "contents": {}}}}}
TASK = Task("host-1", ("make a directory a",), STATE, ("GorillaFileSystem", "MathAPI"), (("mkdir(dir_name='a')",),))
# CPython computes 10**(10**7) in one C call: about 20 s on the reference machine, unbounded in-process.
STALL = "round_number(number=1, decimal_places=-10000000)"


def _content(result) -> str:
    return result.observations[0]["content"]


def test_a_call_past_its_limit_fails_with_no_effect_and_every_open_episode_goes_on():
    with bounded_tool_calls(LIMITS) as host:
        done, stalled = BfclEnv(), BfclEnv()
        done.reset(TASK)
        stalled.reset(TASK)
        assert _content(done.step("mkdir(dir_name='a')")) == "None"
        stalled.step("mkdir(dir_name='b')")

        started = time.monotonic()
        result = stalled.step(STALL)
        assert time.monotonic() - started < 10
        assert "ran past its limit of 2 s" in _content(result) and "had no effect" in _content(result)
        assert (host.restarts, host.stopped, host.lost) == (1, 1, 0)

        assert _content(stalled.step("ls()")) == '{"current_directory_content": ["b"]}'
        assert _content(stalled.step("add(a=1, b=2)")) == '{"result": 3}'
        assert _content(done.step("ls()")) == '{"current_directory_content": ["a"]}'
        verdict = done.step("").info["verdict"]
        assert verdict["passed"], verdict  # the reference workspace was rebuilt too
        assert done.success and not stalled.done


def test_a_host_killed_while_idle_is_replaced_and_no_call_or_task_takes_the_blame():
    """The OOM killer or an operator kills the host between requests: the next call, and the next task
    loaded, run on a new host; neither fails, so no seed task is dropped and no proposal rejected."""
    with bounded_tool_calls(LIMITS) as host:
        env = BfclEnv()
        env.reset(TASK)
        env.step("mkdir(dir_name='a')")
        first = host._process.pid
        os.kill(first, signal.SIGKILL)
        host._process.wait()
        assert _content(env.step("mkdir(dir_name='c')")) == "None"
        assert host._process.pid != first and (host.restarts, host.stopped, host.lost) == (1, 0, 0)
        assert _content(env.step("ls()")) == '{"current_directory_content": ["a", "c"]}'

        second = host._process.pid
        os.kill(second, signal.SIGKILL)
        host._process.wait()
        loaded = BfclEnv()
        loaded.reset(TASK)  # before: InvalidTask, and the pool dropped the seed task for good
        assert host._process.pid != second and host.restarts == 2
        assert _content(loaded.step("mkdir(dir_name='a')")) == "None"
        assert loaded.step("").info["verdict"]["passed"]


def test_a_host_that_dies_under_a_call_fails_that_call_and_open_episodes_keep_their_state():
    with bounded_tool_calls(LIMITS) as host:
        env = BfclEnv()
        env.reset(TASK)
        env.step("mkdir(dir_name='a')")
        first = host._process.pid
        threading.Timer(0.5, os.kill, (first, signal.SIGKILL)).start()  # inside the 2 s the stall is given
        result = env.step(STALL)
        assert "ended with the tool host, which exited" in _content(result) and "had no effect" in _content(result)
        assert host._process.pid != first and (host.restarts, host.stopped) == (1, 1)
        assert _content(env.step("ls()")) == '{"current_directory_content": ["a"]}'
        assert env.step("").info["verdict"]["passed"]


def test_a_workspace_freed_while_the_host_rebuilds_is_skipped():
    with bounded_tool_calls(LIMITS) as host:
        kept, freed = BfclEnv(), BfclEnv()
        kept.reset(TASK)
        freed.reset(TASK)
        kept.step("mkdir(dir_name='a')")
        gone = freed.work.ws
        rerun = host._rerun

        def frees_the_other(ws, entry):  # the look-ahead thread drops its episode mid-rebuild
            if ws != gone:
                host.collect(gone)
            return rerun(ws, entry)

        host._rerun = frees_the_other
        assert "ran past its limit" in _content(kept.step(STALL))  # before: KeyError out of the rebuild
        assert gone not in host._logs and host.lost == 0
        assert _content(kept.step("ls()")) == '{"current_directory_content": ["a"]}'


def test_an_episode_whose_replay_differs_is_lost_and_ends_with_the_reason():
    with bounded_tool_calls(LIMITS) as host:
        kept, lost = BfclEnv(), BfclEnv()
        kept.reset(TASK)
        lost.reset(TASK)
        kept.step("mkdir(dir_name='a')")
        lost.step("mkdir(dir_name='a')")
        call, _ = host._logs[lost.work.ws].calls[0]
        host._logs[lost.work.ws].calls[0] = (call, "a result the backend never gave")
        kept.step(STALL)

        result = lost.step("ls()")
        assert host.lost == 1
        assert lost.done and not lost.success
        assert "state was lost" in lost.terminated and "mkdir returned 'None'" in lost.terminated
        assert "Episode ended" in result.observations[-1]["content"]
        assert _content(kept.step("ls()")) == '{"current_directory_content": ["a"]}'


def test_the_host_runs_under_its_address_space_limit_and_ends_with_its_scope():
    with bounded_tool_calls(LIMITS) as host:
        BfclEnv().reset(TASK)
        process = host._process
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        line = next(row for row in limits.splitlines() if row.startswith("Max address space"))
        assert line.split()[3:5] == [str(512 << 20)] * 2
    assert process.poll() is not None
    with bounded_tool_calls(EpisodeLimits(call_limit_s=0)) as none:
        assert none is None


def test_the_validator_rejects_a_task_whose_reference_runs_past_the_limit():
    task = Task("host-2", ("round it",), {}, ("MathAPI",), ((STALL,),))
    with bounded_tool_calls(LIMITS):
        started = time.monotonic()
        outcome = check_executable(task)
    assert time.monotonic() - started < 10
    assert not outcome.passed and "ran past its limit" in outcome.reason


def test_the_host_gets_no_secret_writes_no_large_file_and_answers_in_json(monkeypatch):
    """The host is a boundary: model-written calls run there without the service's secrets, a reply is
    data (JSON; the calling process unpickled them before), and a file write is bounded."""
    import resource

    from coevolve.services.envs import host_child

    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("CLICKHOUSE_URL", "clickhouse://user:s3cret@db:8123")
    with bounded_tool_calls(LIMITS) as host:
        BfclEnv().reset(TASK)
        pid = host._process.pid
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if b"s3cret" in v] and any(v.startswith(b"PATH=") for v in environ)
        limits = Path(f"/proc/{pid}/limits").read_text()
        line = next(row for row in limits.splitlines() if row.startswith("Max file size"))
        assert line.split()[3:5] == [str(host_child.FILE_LIMIT_MB << 20)] * 2
        host._send.send_bytes(host_child.pickle.dumps(("run", 10 ** 6, None)))  # no such workspace
        raw = host._recv.recv_bytes()
        kind, why = json.loads(raw)
        assert kind == "error" and "KeyError" in why
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY  # the caller's own is untouched


def test_a_call_stalled_in_one_thread_holds_no_other_threads_episodes():
    """Each thread gets its own host: the learner's evaluation goes on while its look-ahead thread's call
    runs to its limit (before, one host and one lock held every episode of the process that long)."""
    limits = EpisodeLimits(call_limit_s=12.0, call_memory_mb=512)
    with bounded_tool_calls(limits) as host:
        stalled = BfclEnv()
        started, answered = threading.Event(), {}

        def stall():
            stalled.reset(TASK)  # opened in this thread: its host
            started.set()
            answered["stalled"] = _content(stalled.step(STALL.replace("10000000", "100000000")))  # minutes

        worker = threading.Thread(target=stall)
        worker.start()
        started.wait()
        time.sleep(0.5)  # the stalled call is in the host
        other = time.monotonic()
        quick = BfclEnv()  # this thread's own host
        quick.reset(TASK)
        assert _content(quick.step("mkdir(dir_name='a')")) == "None"
        answered["quick_s"] = time.monotonic() - other
        worker.join(60)
        assert "ran past its limit of 12 s" in answered["stalled"]
        assert answered["quick_s"] < 8, answered  # not held until the stalled call's limit
        assert quick.work.host is host and stalled.work.host is not host
