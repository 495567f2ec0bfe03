"""A TCPStore this project hosts listens on the address its clients dial (loopback in the embedded
default), not on every interface as torch's own server does."""
import datetime

import torch.distributed as dist

from coevolve.services.runtime.stores import hosted_store
from tests.sockets import listening

TIMEOUT = datetime.timedelta(seconds=10)


def listeners(port: int) -> set[str]:
    """The local addresses listening on `port`."""
    return {address for address, bound in listening().values() if bound == port}


def test_a_store_on_loopback_listens_on_loopback_alone_and_serves_its_clients():
    store = hosted_store("127.0.0.1", 0, 1, TIMEOUT, wait_for_workers=False)
    assert listeners(store.port) == {"127.0.0.1"}  # and no 0.0.0.0 or ::
    store.set("k", "v")
    assert dist.TCPStore("127.0.0.1", store.port, 1, is_master=False, timeout=TIMEOUT).get("k") == b"v"


def test_torchs_own_master_listens_on_every_interface():  # what hosted_store avoids
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    assert listeners(store.port) - {"127.0.0.1"}


def test_a_host_name_is_bound_on_the_address_it_resolves_to():
    store = hosted_store("localhost", 0, 1, TIMEOUT, wait_for_workers=False)
    assert listeners(store.port) <= {"127.0.0.1", "::1"}
