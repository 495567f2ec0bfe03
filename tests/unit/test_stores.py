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


def test_a_gloo_group_listens_where_its_store_is_reached_not_at_the_host_names_address():
    """gloo's own device listens at what the host name resolves to (a pod's address in a container, beyond
    loopback, unauthenticated). Over a store on 127.0.0.2, the hosting rank listens there and the other
    at its address on the route to the store; before, both listened at the host name's address."""
    import os
    import threading

    from coevolve.services.fleet.transfer import _group
    from coevolve.services.runtime.ports import free_port
    from coevolve.services.runtime.stores import gloo_address, gloo_interface

    port, before = free_port(), {address for address, _ in listening().values()}
    joined: list = []
    joiner = threading.Thread(target=lambda: joined.append(_group("127.0.0.2", port, 1, 2, 30.0, is_master=False)))
    joiner.start()
    store, group = _group("127.0.0.2", port, 0, 2, 30.0, is_master=True)
    joiner.join(30.0)
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            continue
    table = listening()
    opened = [table[link[8:-1]] for link in links if link.startswith("socket:[") and link[8:-1] in table]
    assert {address for address, _ in opened} <= {"127.0.0.2", "127.0.0.1"} and joined, (opened, before)
    assert sum(address == "127.0.0.2" for address, _ in opened) >= 2  # the store, and the hosting rank's gloo
    assert gloo_address("127.0.0.2", hosting=True) == "127.0.0.2"
    assert gloo_address("127.0.0.2", hosting=False) == "127.0.0.1" and gloo_interface("127.0.0.1", False) == "lo"
    del group, store, joined
