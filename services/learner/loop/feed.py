"""The learner's task feed: `coevolve.tasks` read from its beginning into the pool's buffer.

It follows the compacted topic in a background thread, with no consumer group (the catalog is rebuilt at
every start), and only buffers what arrives (`TaskPool.offer`); the pool takes it in between steps
(`TaskPool.refresh`, sampler.py). A starting learner waits until the feed has read what the topic held
(`caught_up`, at most `CATCH_UP_S`; not for a read that failed), so its first step after a (re)start
draws from every task validated before it, not only from those its checkpoint had taken in. A broker
error (a restart, a failed dead-letter flush) does not end it: it reads again from the beginning with a
new consumer, skipping what it already offered, until the broker has been unreachable for `OUTAGE_S`;
only then does the learner's /healthz report it.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from coevolve.services.kafka.topics import TASKS
from coevolve.services.learner.loop.sampler import Origin, TaskPool
from coevolve.services.runtime.log import get_logger

log = get_logger("learner.sampler")


def tasks_consumer(bootstrap: str) -> Callable[[], Any]:
    """What makes the feed's consumer: `coevolve.tasks` for the learner, with a producer of its own for the
    dead letters."""

    def consumer() -> Any:
        from coevolve.services.kafka.consumer import EventConsumer
        from coevolve.services.kafka.producer import EventProducer

        deadletters = EventProducer(bootstrap, client_id="coevolve-learner-feed", service="learner")
        return EventConsumer(bootstrap, [TASKS.name], service="learner", deadletters=deadletters)

    return consumer

OUTAGE_S = 120.0  # how long the feed reads again through broker errors before it reports itself stopped
RETRY_S = (0.5, 10.0)  # the first wait before reading again, and the longest (doubling in between)
CATCH_UP_S = 30.0  # the longest a starting learner waits for the feed to read what the topic holds


class TaskFeed:
    """A daemon thread reading `coevolve.tasks` from the beginning into `pool.offer`; what is not a
    `TaskChecked` (or does not decode) goes to the consumer's dead letters, sent by a producer of its own."""

    def __init__(self, make_consumer: Callable[[], Any], pool: TaskPool, poll_s: float = 0.2,
                 outage_s: float | None = None):
        self.make_consumer, self.pool, self.poll_s = make_consumer, pool, poll_s
        self.outage_s = OUTAGE_S if outage_s is None else outage_s
        self.received = 0
        self.retries = 0
        self.verdicts: Counter = Counter()  # (run id, step proposed at) -> verdicts read
        self.error: str | None = None
        self._handled: set[tuple[str, int, int]] = set()  # (topic, partition, offset) offered or dead-lettered
        self.caught_up = threading.Event()  # set once what the topic held at the start was offered, or that read failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="learner-task-feed", daemon=True)

    def start(self) -> "TaskFeed":
        self._thread.start()
        return self

    def _run(self) -> None:
        failing_since, wait_s = None, RETRY_S[0]
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = self.make_consumer()
                for _ in self._follow(consumer):
                    failing_since, wait_s = None, RETRY_S[0]
                return
            except Exception as exc:  # past the outage, /healthz turns unhealthy (`failure`): a restart
                self.caught_up.set()  # a starting learner waits for no read that failed; the next read comes later
                error = f"{type(exc).__name__}: {exc}"
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since >= self.outage_s:
                    self.error = error
                    log.error("sampler.feed_failed", error=error, outage_s=self.outage_s)
                    return
                self.retries += 1
                log.warning("sampler.feed_retry", error=error, retry_in_s=wait_s)
            finally:
                if consumer is not None:
                    _close(consumer)
            self._stop.wait(wait_s)
            wait_s = min(2 * wait_s, RETRY_S[1])

    def _follow(self, consumer: Any) -> Iterator[None]:
        """Read what the topic holds now (then `caught_up` is set), then follow it until stopped, yielding
        after each read that worked. What was offered before is skipped; a dead-lettered event counts as
        handled only once its letter is confirmed, so a letter lost with the broker is written again when
        its event is read again."""
        self._take(consumer, consumer.read_to_end(CATCH_UP_S))
        self.caught_up.set()
        yield
        while not self._stop.is_set():
            self._take(consumer, consumer.poll(self.poll_s))
            yield

    def _take(self, consumer: Any, items: list) -> None:
        lettered = []
        for item in items:
            where = (item.topic, item.partition, item.offset)
            if where in self._handled:
                continue  # read again after a broker error
            if item.name == "TaskChecked":
                self.pool.offer(item.event, Origin(*where, item.key))
                self.received += 1
                self.verdicts[(str(item.event["run_id"]), int(item.event["step"]))] += 1
                self._handled.add(where)
            else:
                consumer.reject(item, "invalid", f"{item.name} on {item.topic}: the learner takes only "
                                                 "TaskChecked events from it")
                lettered.append(where)
        if lettered and consumer.deadletters is not None:
            consumer.deadletters.flush()  # undecodable or foreign events, dead-lettered as read
        self._handled.update(lettered)

    def catch_up(self) -> bool:
        """Wait until what the topic held at the start was offered, or that read failed (at most
        `CATCH_UP_S`); False, with a warning, when neither came in time."""
        if self.caught_up.wait(CATCH_UP_S):
            return True
        log.warning("sampler.feed_behind", waited_s=CATCH_UP_S, then="the tasks not yet read join a later step")
        return False

    def wait_for(self, run_id: str, step: int, count: int, timeout_s: float, stop: threading.Event) -> int:
        """Wait until `count` verdicts of `run_id`'s tasks proposed at `step` were read (0: the whole
        `timeout_s`), `timeout_s` passed or `stop` was set; the verdicts read."""
        deadline = time.monotonic() + timeout_s
        while not (count and self.verdicts[(run_id, step)] >= count):
            left = deadline - time.monotonic()
            if left <= 0 or stop.wait(min(left, 0.2)):
                break
        return self.verdicts[(run_id, step)]

    def failure(self) -> str | None:
        """Why the feed no longer reads (its thread ended with an error, or ended unasked); None while it reads
        or after `stop()`. The learner's /healthz reports it (`Service.watch`)."""
        if self._stop.is_set() or self._thread.is_alive() or not self._thread.ident:
            return None
        return f"the task feed stopped: {self.error or 'its thread ended'}; new tasks no longer reach the pool"

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


def _close(consumer: Any) -> None:
    """Close the consumer and its dead-letter producer; a letter that cannot be flushed now is written again
    when its event is read again."""
    for closing in (consumer, consumer.deadletters):
        if closing is None:
            continue
        try:
            closing.close()
        except Exception as exc:
            log.warning("sampler.feed_close_failed", error=f"{type(exc).__name__}: {exc}")
