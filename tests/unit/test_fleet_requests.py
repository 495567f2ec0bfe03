"""A request's transport failure marks its server down only when the server no longer answers: a
keep-alive connection the server closed as the request went out fails with "Server disconnected
without sending a response" from a healthy server, and a one-server fleet would end the step on it."""
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
import torch

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.agent.generation import BackendStats, Request
from coevolve.services.fleet.backend import FleetBackend
from coevolve.services.fleet.client import REQUEST_RETRIES, FleetError, Server, WeightTransferError
from coevolve.services.fleet.config import FleetConfig

CLOSED = "Server disconnected without sending a response."


class Reply:
    def __init__(self, body, status_code=200):
        self.body, self.status_code, self.text = body, status_code, str(body)

    def json(self):
        return self.body


class Http:
    """One server: each POST raises the next of `failures`, then completes; GET answers unless `down`."""

    def __init__(self, failures, down=False):
        self.failures, self.down, self.posts, self.health = list(failures), down, 0, 0

    def get(self, url, timeout):
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused")
        if url.endswith("/health"):
            self.health += 1
            return Reply({})
        return Reply({"weight_version": "r@3"})

    def post(self, url, json):
        self.posts += 1
        if self.failures:
            raise self.failures.pop(0)
        return Reply({"choices": [{"text": "ok", "token_ids": [5, 6], "finish_reason": "stop",
                                   "logprobs": {"token_logprobs": [-0.1, -0.2]}}]})


@pytest.fixture
def backend():
    made = FleetBackend.__new__(FleetBackend)
    made.fleet, made.version, made.max_model_len, made.per_server = FleetConfig(), 3, 64, 2
    made.run_id = "r"
    made.served_model, made.template = "policy", SimpleNamespace(stop_token_ids=lambda: [0])
    made.servers = [Server("http://a", 0, version=3)]
    made.stats = BackendStats(extra={"servers": 1.0, "servers_down": 0.0, "servers_behind": 0.0})
    made._cond, made._updating, made._generating, made._turn = threading.Condition(), False, 0, itertools.count()
    made.pool = ThreadPoolExecutor(max_workers=2)
    yield made
    made.pool.shutdown()


def generate(backend, http):
    backend.http = http
    return backend.generate([Request(prompt_ids=[1, 2, 3])], SamplingConfig(temperature=1.0, max_new_tokens=4))


def test_a_connection_closed_under_a_request_is_retried_while_the_server_answers(backend):
    http = Http([httpx.RemoteProtocolError(CLOSED)])
    (completion,) = generate(backend, http)
    assert completion.error is None and completion.token_ids == (5, 6) and completion.policy_version == 3
    assert http.posts == 2 and http.health == 1
    assert backend.servers[0].up and backend.stats.extra["servers_down"] == 0.0


def test_a_server_that_does_not_answer_is_down_and_with_none_left_generate_says_so(backend):
    http = Http([httpx.ConnectError("[Errno 111] Connection refused")], down=True)
    with pytest.raises(FleetError, match="every vLLM server of the fleet is down .*Connection refused"):
        generate(backend, http)
    assert http.posts == 1 and not backend.servers[0].up


def test_a_server_that_answers_but_fails_every_try_is_taken_out_after_the_retries(backend):
    http = Http([httpx.RemoteProtocolError(CLOSED)] * (REQUEST_RETRIES + 5))
    with pytest.raises(FleetError, match=CLOSED):
        generate(backend, http)
    assert http.posts == REQUEST_RETRIES + 1 and not backend.servers[0].up


class Routes:
    """One server's weight-sync routes: `resume` meets a closed connection `closed` times, then resumes."""

    def __init__(self, closed):
        self.closed, self.calls, self.paused = closed, [], False

    def post(self, url, json=None, params=None):
        path = url.rsplit("/", 1)[1]
        self.calls.append(path)
        if path == "resume" and self.closed:
            self.closed -= 1
            raise httpx.RemoteProtocolError(CLOSED)
        self.paused = {"pause": True, "resume": False}.get(path, self.paused)
        return SimpleNamespace(status_code=200, content=b"")

    def get(self, url, timeout):
        return Reply({})


class BrokenRound:
    def send_weights(self, version, source):
        raise RuntimeError("Connection closed by peer")

    def shutdown(self):
        pass


@pytest.mark.parametrize("closed", [1, REQUEST_RETRIES + 1])
def test_a_server_is_resumed_after_a_broken_round_or_taken_out_never_left_paused(backend, closed):
    """The failed round's route answers 500 and uvicorn then closes its connection, which the resume
    that follows may be sent on. A server left paused holds every request until `server_timeout_s`."""
    backend.dtype, backend._revive = "float32", lambda: None
    backend.http = routes = Routes(closed)
    backend.servers[0].engine = BrokenRound()
    with pytest.raises(WeightTransferError, match="no server took version 4: .*Connection closed by peer"):
        backend.update_weights([("w", torch.ones(2))])
    server = backend.servers[0]
    if closed <= REQUEST_RETRIES:
        assert routes.calls == ["pause", "resume", "resume"] and not routes.paused and server.up
    else:
        assert routes.calls == ["pause"] + ["resume"] * (REQUEST_RETRIES + 1) and routes.paused
        assert not server.up and "could not be resumed after a weight transfer" in server.error
