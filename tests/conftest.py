"""Shared fixtures. Integration tests start the real embedded broker (Tansu) themselves."""
from __future__ import annotations

import pytest

from coevolve.services.kafka.embedded import EmbeddedBroker
from coevolve.services.kafka.topics import create_topics


@pytest.fixture
def broker():
    """A fresh embedded broker on a free port, always stopped afterwards."""
    embedded = EmbeddedBroker().start()
    try:
        yield embedded
    finally:
        embedded.stop()


@pytest.fixture
def bootstrap(broker) -> str:
    """The bootstrap address of a fresh broker with every catalog topic created."""
    create_topics(broker.bootstrap)
    return broker.bootstrap



def pytest_collection_modifyitems(items):
    """The whole-loop runs of tests/e2e first, the `heavy` files last: under `make test` (two workers, below)
    one worker takes the e2e runs while the other works through the lighter files, so the heavy ones meet
    each other at most, never an e2e run (each run holds 10-14 GiB of the 24)."""
    def rank(item) -> int:
        return 0 if item.nodeid.startswith("tests/e2e/") else 2 if item.get_closest_marker("heavy") else 1

    items.sort(key=rank)  # stable: each file's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs two workers (`-n 2`): each test file on one of them, so a module's fixtures are built
    once, and the whole-loop runs of tests/e2e all on the same one, in collection order (above)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/e2e" if path.startswith("tests/e2e/") else path

    config.option.loadscopereorder = False  # keep the order above
    return ByFile(config, log)
