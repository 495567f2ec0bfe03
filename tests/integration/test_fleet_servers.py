"""Local fleet servers die with the process that started them, even when it is killed (SIGKILL)."""
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.heavy]

STARTER = """
import sys, time
from coevolve.services.fleet.config import FleetConfig
from coevolve.services.fleet.servers import LocalServers
from tests.agent_engines import TINY_RANDOM, backend_config, model_dir
config = backend_config(model=TINY_RANDOM, backend="vllm-server", kv_cache_gib=1.0, max_model_len=2048)
servers = LocalServers(str(model_dir(TINY_RANDOM)), config, FleetConfig(servers=1), sys.argv[1]).start()
print(servers.processes[0].pid, flush=True)
time.sleep(600)
"""


def session(pid: str) -> list[str]:
    return subprocess.run(["pgrep", "-s", pid], capture_output=True, text=True).stdout.split()


def test_a_killed_starter_leaves_no_server_engine_or_worker_behind(tmp_path):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                               cwd=os.getcwd())
    try:
        pid = starter.stdout.readline().strip()
        assert pid.isdigit(), "the server did not start"
        assert len(session(pid)) >= 2  # the API server and its engine core (and worker)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + 60
    while session(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert session(pid) == []
