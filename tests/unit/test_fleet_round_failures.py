"""A gloo round that fails on either side ends at once on both, not at gloo's timeout: two real
in-process ranks over loopback, the server's in a thread."""
import gc
import threading
import time
import traceback
from concurrent.futures import Future

import pytest
import torch

from coevolve.services.fleet import transfer
from coevolve.services.runtime.ports import free_port

TIMEOUT_S = 60.0  # gloo's own wait for a peer; every bound below is far under it
NUMEL = 4 * 1024 * 1024  # 16 MiB a chunk: more than a socket buffer holds, so a send waits for its reader
CHUNKS = 4
RECEIVE = transfer._broadcast  # the real one, for the server's side when a test patches the learner's


def info() -> transfer.GlooUpdateInfo:
    names = [f"w{i}" for i in range(CHUNKS)]
    return transfer.GlooUpdateInfo(names=names, dtype_names=["float32"] * CHUNKS, shapes=[[NUMEL]] * CHUNKS)


class Weights:
    """A re-readable source of the round's tensors, one chunk each."""

    def __iter__(self):
        for i in range(CHUNKS):
            yield f"w{i}", torch.full((NUMEL,), float(i))


class Server(threading.Thread):
    """The server's rank: receives `chunks` chunks (all by default), then holds its group until `release`."""

    def __init__(self, port: int, chunks: int = CHUNKS):
        super().__init__(daemon=True)
        self.port, self.chunks = port, chunks
        self.error: BaseException | None = None
        self.ended_at: float | None = None
        self.release = threading.Event()
        self.start()

    def run(self) -> None:
        store, group = transfer._group("127.0.0.1", self.port, 1, 2, TIMEOUT_S, is_master=False)
        try:
            for _ in range(self.chunks):
                RECEIVE(group, torch.empty(NUMEL))
            self.release.wait(TIMEOUT_S)
        except BaseException as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            del group, store


class SlowToLeave(Future):
    """A future whose thread is still inside its function for a while after the failure is handed over."""

    def set_exception(self, exception):
        super().set_exception(exception)
        time.sleep(3)


@pytest.mark.parametrize("thread_leaves", ["at once", "after the learner cleaned up"])
def test_a_round_the_learner_breaks_releases_the_server_at_once(monkeypatch, thread_leaves):
    if thread_leaves != "at once":  # the learner clears the failure's frames while the thread's is still running
        monkeypatch.setattr(transfer, "Future", SlowToLeave)
    port = free_port()
    server = Server(port)
    store, group = transfer._group("127.0.0.1", port, 0, 2, TIMEOUT_S, is_master=True)
    sent = []

    def breaks_at_the_third_chunk(g, tensor):
        sent.append(tensor.numel())
        if len(sent) == 3:
            raise ConnectionError("link lost")
        RECEIVE(g, tensor)

    monkeypatch.setattr(transfer, "_broadcast", breaks_at_the_third_chunk)
    with pytest.raises(ConnectionError) as raised:
        transfer.broadcast_round(group, Weights(), info(), NUMEL * 4, received=Future())
    broke = time.monotonic()
    # As send_weights does: it clears the failure's frames and drops the group, then waits for the server
    # to leave the round with the failure still in hand.
    traceback.clear_frames(raised.value.__traceback__)
    del group, store
    gc.collect()
    server.join(TIMEOUT_S)
    assert raised.value.args == ("link lost",)
    assert isinstance(server.error, RuntimeError), server.error
    assert server.ended_at - broke < 10, "the server waited for gloo's timeout: the learner's group outlived it"


def test_a_server_that_leaves_the_round_ends_the_broadcast_at_once():
    port = free_port()
    server = Server(port, chunks=1)  # takes one chunk, then stops reading, as a killed server does
    store, group = transfer._group("127.0.0.1", port, 0, 2, TIMEOUT_S, is_master=True)
    received: Future = Future()
    threading.Timer(1.0, received.set_exception, [ConnectionResetError("the server's process died")]).start()
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionResetError):
            transfer.broadcast_round(group, Weights(), info(), NUMEL * 4, received=received)
        assert time.monotonic() - started < 10, "the broadcast waited for gloo's timeout"
    finally:
        server.release.set()
        server.join(TIMEOUT_S)
