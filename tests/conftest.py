"""Shared fixtures. Integration tests start the real embedded broker (Tansu) themselves."""
from __future__ import annotations

import functools

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
    """The whole-loop runs of tests/e2e first, then the `heavy` files, then the rest: under `make test` (two
    workers, below) one worker takes the e2e runs and the other the heavy files, one after another (they share
    one cached engine per worker, and two never run side by side), and both end on the many light files."""
    def rank(item) -> int:
        return 0 if item.nodeid.startswith("tests/e2e/") else 1 if item.get_closest_marker("heavy") else 2

    items.sort(key=rank)  # stable: each file's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs two workers (`-n 2`): each test file on one of them, so a module's fixtures are built
    once; the whole-loop runs of tests/e2e (10-14 GiB each) are one unit of work, and the heavy files another,
    each on one worker, in the order above."""
    from xdist.scheduler import LoadScopeScheduling

    @functools.lru_cache(maxsize=None)
    def heavy(path: str) -> bool:  # the controller collects nothing: it reads the module's marks
        return "pytest.mark.heavy" in (config.rootpath / path).read_text()

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.startswith("tests/e2e/"):
                return "tests/e2e"
            return "heavy" if heavy(path) else path

    config.option.loadscopereorder = False  # keep the order above
    return ByFile(config, log)
