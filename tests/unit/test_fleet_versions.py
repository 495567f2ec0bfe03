"""A server's version is what it holds. A transfer that breaks half-way: on this package's gloo engine the
server keeps its old weights and version (tests/integration/test_fleet.py shows it on real servers); on
vLLM's nccl engine, which loads each layer as it arrives, the server may hold two versions' layers, so it
is taken out until an update lands in full. A server restarted behind the learner's back reports its
starting weights, and its completions carry that version, not the last one pushed."""
import threading

import pytest
import torch

from coevolve.services.agent.generation import BackendStats
from coevolve.services.fleet.backend import FleetBackend
from coevolve.services.fleet.client import FOREIGN, Server, version_label
from coevolve.services.fleet.config import FleetConfig


def fleet(engine: str) -> FleetBackend:
    """A two-server fleet at version 3 (no HTTP: each server's push is the test's)."""
    backend = FleetBackend.__new__(FleetBackend)
    backend.fleet, backend.dtype, backend.version = FleetConfig(weight_transfer=engine), "float32", 3
    backend.run_id = "r"
    backend.servers = [Server("http://a", 0, version=3), Server("http://b", 1, version=3)]
    backend.stats = BackendStats(extra={"servers": 2.0, "servers_down": 0.0, "servers_behind": 0.0})
    backend._cond, backend._updating, backend._generating = threading.Condition(), False, 0
    backend._revive = lambda: None
    backend.http = Http({"http://a": "r@3", "http://b": "r@3"})

    def push(server, source, version):
        if server.url == "http://b":
            raise RuntimeError("peer closed the transfer after 3 of 30 layers")
        server.version = version

    backend._push = push
    return backend


@pytest.mark.parametrize("engine, b_up", [("gloo", True), ("nccl", False)])
def test_a_half_way_transfer_takes_the_server_out_only_where_its_layers_may_be_mixed(engine, b_up):
    backend = fleet(engine)
    pushed = backend.update_weights([("w", torch.ones(2))])
    a, b = backend.servers
    assert pushed.version == 4 and pushed.servers == 1 and (a.up, a.version) == (True, 4)
    assert b.up is b_up and b.version == 3  # never labelled with a version it may not hold whole
    if not b_up:
        assert "broke half-way on nccl" in b.error and "after a complete update" in b.error
        assert backend.stats.extra["servers_down"] == 1.0


def test_a_server_that_died_in_the_round_is_down_even_when_gloo_noticed_before_its_transfer_call():
    backend = fleet("gloo")
    backend.http.versions["http://b"] = None  # b's process is gone; its broadcast broke first
    pushed = backend.update_weights([("w", torch.ones(2))])
    b = backend.servers[1]
    assert pushed.servers == 1 and b.up is False and b.version == 3
    assert "stopped answering in the transfer of version 4" in b.error and "peer closed" in b.error


class Reply:
    def __init__(self, version):
        self.status_code, self.version = 200, version

    def json(self):
        return {"weight_version": self.version}


class Http:
    """`/weight_info` of each server: a restarted one answers vLLM's "default"; one is unreachable."""

    def __init__(self, versions):
        self.versions = versions

    def get(self, url, timeout):
        version = self.versions[url.rsplit("/", 1)[0]]
        if version is None:
            raise ConnectionError("refused")
        return Reply(version)


def test_a_server_restarted_behind_the_learners_back_is_behind_and_its_completions_say_so():
    backend = fleet("gloo")
    backend.servers.append(Server("http://c", 2, version=3))
    backend.servers[0].engine = backend.servers[1].engine = object()
    backend.http = Http({"http://a": "r@3", "http://b": "default", "http://c": None})
    backend._confirm_versions()
    a, b, c = backend.servers
    assert (a.version, b.version, c.version) == (3, 0, 3)  # b serves its starting weights; c is left to requests
    assert a.engine is not None and b.engine is None  # the restarted process's transfer group is gone


def test_a_server_holding_another_runs_weights_serves_nothing_until_this_runs_update_lands():
    """A long-lived server the last run left at its version 40 would pass for a policy ahead of this run's
    learner (at 3), and its rollouts for fresh ones."""
    backend = fleet("gloo")
    backend.servers[0].engine = backend.servers[1].engine = object()
    backend.http = Http({"http://a": "r@3", "http://b": "earlier-run@40"})
    backend._confirm_versions()
    a, b = backend.servers
    assert (a.up, a.version) == (True, 3) and (b.up, b.version) == (False, FOREIGN)
    assert "another run's weights" in b.error and "run r lands" in b.error
    backend.http.versions["http://b"] = "40"  # unlabelled: no run's for sure
    assert backend._version(b) == FOREIGN
    backend.http.versions["http://b"] = version_label("r", 4)
    assert backend._version(b) == 4 and version_label("r", 4) == "r@4"
