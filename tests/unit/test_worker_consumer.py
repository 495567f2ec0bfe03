"""Over a rebalance the worker's streams get nothing until the seek to committed offsets, then each
partition resumes at its seek target, in order (`faust_compat.resume_in_order`): no event is skipped,
none handed out twice or out of order, while table recovery reads the changelogs throughout."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from faust.types import TP

from coevolve.streams.worker.faust_compat import resume_in_order

TRAJECTORIES, UNCOMMITTED = TP("coevolve.trajectories", 1), TP("coevolve.trajectories", 3)
CHANGELOG = TP("app-step_to_counts-changelog", 1)
COMMITTED, SEEK = 696, "seek"


class Consumer:
    """What resume_in_order wraps: fetches (lists of (tp, offset) and SEEK) and the seek's answers."""

    def __init__(self, fetches: list[list]):
        self.fetches, self.sought = fetches, {}

    async def getmany(self, timeout: float):
        for item in self.fetches.pop(0):
            if item == SEEK:
                await self.seek_to_committed()  # recovery's seek, while this fetch is handed out
                continue
            tp, offset = item
            yield tp, SimpleNamespace(offset=offset)

    async def seek_to_committed(self) -> dict:
        return {TRAJECTORIES: COMMITTED, UNCOMMITTED: None, CHANGELOG: None}

    async def seek_wait(self, targets: dict) -> None:
        self.sought.update(targets)

    async def earliest_offsets(self, *tps) -> dict:
        return {tp: 0 for tp in tps}


async def handed_out(fetches: list[list]) -> tuple[list, Consumer]:
    consumer = Consumer(fetches)
    app = SimpleNamespace(consumer=consumer, on_rebalance_start=lambda: None,
                          tables=SimpleNamespace(changelog_topics={CHANGELOG.topic}))
    resume_in_order(app)
    app.on_rebalance_start()
    out = []
    while consumer.fetches:
        out += [(tp, m.offset) async for tp, m in consumer.getmany(timeout=1.0)]
    return out, consumer


def test_a_partition_resumes_in_order_at_its_seek_target_after_a_rebalance():
    before = [(TRAJECTORIES, o) for o in range(COMMITTED, 700)] + [(CHANGELOG, 0), (UNCOMMITTED, 40)]
    across = [(TRAJECTORIES, o) for o in range(700, 705)] + [(UNCOMMITTED, 41)]
    again = [(TRAJECTORIES, o) for o in range(COMMITTED, 708)] + [(UNCOMMITTED, o) for o in range(0, 3)]
    out, consumer = asyncio.run(handed_out([before + [SEEK] + across, again]))
    # every source partition is sought at once, the uncommitted one to its first offset (aiokafka alone
    # leaves that one where the last fetch ended)
    assert consumer.sought == {TRAJECTORIES: COMMITTED, UNCOMMITTED: 0}
    assert [o for tp, o in out if tp == CHANGELOG] == [0]  # table recovery reads on while streams wait
    assert [o for tp, o in out if tp == TRAJECTORIES] == list(range(COMMITTED, 708))
    assert [o for tp, o in out if tp == UNCOMMITTED] == [0, 1, 2]
