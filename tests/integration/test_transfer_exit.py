"""A process that ends while a weight-transfer thread still runs (a broadcast to a dead server that fails
late) waits for it before the interpreter finalizes: a thread that ended during finalization aborted the
process inside gloo's C++ frames (exit code 134, "terminate called without an active exception")."""
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
import sys, time
from coevolve.services.fleet import transfer
done = transfer._background(time.sleep, 15.0)
print(time.time(), flush=True)
sys.exit(7)  # the process's own code, kept
"""


def test_the_exit_waits_for_a_running_transfer_thread_and_keeps_its_code():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert done.returncode == 7, done.stderr[-2000:]
    assert ended - float(done.stdout.split()[-1]) >= 14.5  # the exit waited for the 15 s thread
