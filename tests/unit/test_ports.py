"""Ports handed to child listeners stay out of the range outgoing connections take theirs from."""
import random
import socket

from coevolve.services.runtime.ports import ephemeral_low, free_port


def test_ports_lie_below_the_ephemeral_range_and_can_be_bound():
    low = ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_is_never_handed_out_twice_by_one_process():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_port_something_listens_on_is_skipped(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        candidates = iter([busy, busy, *range(busy - 1, busy - 50, -1)])
        monkeypatch.setattr("coevolve.services.runtime.ports.ephemeral_low", lambda: 65536)
        monkeypatch.setattr("coevolve.services.runtime.ports._candidates.randrange", lambda lo, hi: next(candidates))
        assert free_port() != busy


def test_a_reseeded_random_module_does_not_replay_the_ports_handed_out():
    random.seed(7)
    first = [free_port() for _ in range(5)]
    random.seed(7)  # as torch or transformers' set_seed does between two services' starts
    # Candidates drawn from the reseeded module would replay `first`, all handed out, and exhaust 3 tries;
    # from the OS's randomness, 3 tries all hitting a taken port among 12,000 is about 1 in 10,000 or rarer.
    again = [free_port(attempts=3) for _ in range(5)]
    assert not set(first) & set(again)
