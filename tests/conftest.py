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

