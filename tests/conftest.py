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


@pytest.fixture(scope="module")
def module_bootstrap():
    """One broker with the catalog's topics for a whole test module (for read-only, keyed tests)."""
    with EmbeddedBroker() as embedded:
        create_topics(embedded.bootstrap)
        yield embedded.bootstrap
