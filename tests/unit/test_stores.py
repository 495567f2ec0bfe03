"""A TCPStore this project hosts listens on the address its clients dial (loopback in the embedded
default), not on every interface as torch's own server does."""
import datetime

import torch.distributed as dist

from coevolve.services.runtime.stores import hosted_store

TIMEOUT = datetime.timedelta(seconds=10)


def listeners(port: int) -> set[str]:
    """The local addresses listening on `port` (hex as /proc/net/tcp* writes them)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_a_store_on_loopback_listens_on_loopback_alone_and_serves_its_clients():
    store = hosted_store("127.0.0.1", 0, 1, TIMEOUT, wait_for_workers=False)
    assert listeners(store.port) == {"0100007F"}  # 127.0.0.1, and no 0.0.0.0 or ::
    store.set("k", "v")
    assert dist.TCPStore("127.0.0.1", store.port, 1, is_master=False, timeout=TIMEOUT).get("k") == b"v"


def test_torchs_own_master_listens_on_every_interface():  # what hosted_store avoids
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    assert listeners(store.port) - {"0100007F"}


def test_a_host_name_is_bound_on_the_address_it_resolves_to():
    store = hosted_store("localhost", 0, 1, TIMEOUT, wait_for_workers=False)
    assert listeners(store.port) <= {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 or ::1
