"""Local `vllm serve` processes for the rollout fleet, each ready for gloo weight transfer.

Each server runs with the RL dev routes on (`VLLM_SERVER_DEV_MODE=1`), the `gloo` weight-transfer
engine (registered by this package's vLLM plugin), processed log-probs (after temperature, as the
learner computes them) and whitespace-free structured output (see `agent/vllm_quirks.py`). Each runs
in a session of its own, so that stopping it also ends its engine-core and worker processes: they
outlive an API server that is killed alone, holding their memory. A server also stops when the
process that started it dies (`runtime.processes.WITH_PARENT`: SIGTERM, which vLLM answers by stopping
its engine core and worker), so a killed learner leaves no server behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

from coevolve.services.agent.config import BackendConfig
from coevolve.services.agent.precision import resolve_dtype
from coevolve.services.fleet.config import FleetConfig
from coevolve.services.runtime.logfiles import prune
from coevolve.services.runtime.ports import free_port
from coevolve.services.runtime.processes import WITH_PARENT

KEPT_SERVER_LOGS = 16  # the newest server logs kept in a log folder (each start writes one)


class ServerStartError(RuntimeError):
    """A local server exited or did not answer /health in time."""


def server_command(model_dir: str, name: str, port: int, config: BackendConfig) -> list[str]:
    """The command line of one server."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", resolve_dtype(config.dtype), "--seed", str(config.seed),
               "--max-model-len", str(config.max_model_len), "--logprobs-mode", "processed_logprobs",
               "--weight-transfer-config", json.dumps({"backend": "gloo"}),
               "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]
    return command + (["--enforce-eager"] if config.enforce_eager else [])


def server_environment(config: BackendConfig) -> dict[str, str]:
    """The process environment of a server: dev routes, bounded KV cache, no reserved core."""
    return {**os.environ, "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(config.kv_cache_gib))),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}


class LocalServers:
    """`count` servers of one model on loopback; a context manager that stops them on exit."""

    def __init__(self, model_dir: str, config: BackendConfig, fleet: FleetConfig, log_dir: str | Path,
                 count: int | None = None, name: str | None = None):
        self.model_dir = str(model_dir)
        self.name = name or config.model
        self.config = config
        self.fleet = fleet
        self.count = fleet.servers if count is None else count
        self.log_dir = Path(log_dir)
        self.processes: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self.logs: list[Path] = []
        self._files: list[IO] = []

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def start(self) -> "LocalServers":
        """Launch every server at once, then wait until each answers /health."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        prune(self.log_dir, "vllm-server-*.log", keep=KEPT_SERVER_LOGS)  # one per server start, across runs
        env = server_environment(self.config)
        try:
            for _ in range(self.count):
                port = free_port()
                log = self.log_dir / f"vllm-server-{port}.log"
                handle = log.open("w")
                self._files.append(handle)
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-c", WITH_PARENT, str(os.getpid()),
                     *server_command(self.model_dir, self.name, port, self.config)],
                    env=env, stdout=handle,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
                self.ports.append(port)
                self.logs.append(log)
            deadline = time.monotonic() + self.fleet.server_start_timeout_s
            for process, url, log in zip(self.processes, self.urls, self.logs):
                self._wait_healthy(process, url, log, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, process: subprocess.Popen, url: str, log: Path, deadline: float) -> None:
        while True:
            if process.poll() is not None:
                raise ServerStartError(f"vLLM server {url} exited with code {process.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"vLLM server {url} did not answer /health within "
                                       f"{self.fleet.server_start_timeout_s:.0f} s; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)

    def kill(self, index: int) -> None:
        """Kill server `index` at once, with its engine and worker processes (a crash, as seen from outside)."""
        _kill_group(self.processes[index])
        self.processes[index].wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Terminate every server, then kill what is left of each (engine and worker processes included)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _kill_group(process)
            process.wait()
        for handle in self._files:
            handle.close()
        self._files = []

    def __enter__(self) -> "LocalServers":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the server's session: an API server killed alone leaves its engine core and worker running."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
