"""The learner's task pool: arrivals wait for refresh, the latest verdict wins, mixing and recency, state."""
import re
from collections import Counter

import pytest

from coevolve.services.envs.bfcl_data import load_tasks
from coevolve.services.learner.config import SamplerConfig
from coevolve.services.learner.loop.sampler import TaskPool
from coevolve.services.runtime.config import ConfigError

SEEDS = load_tasks(split="train")[:4]


def verdict(task_id: str, verdict: str = "validated", base=SEEDS[0]) -> dict:
    return {**base.to_record(), "task_id": task_id, "verdict": verdict, "source": "synthesized", "run_id": "r",
            "step": 1}


def pool(**kwargs) -> TaskPool:
    return TaskPool(SEEDS, SamplerConfig(**kwargs), rng_seed=7)


def test_an_arrival_joins_only_at_the_next_refresh():
    p = pool()
    p.offer(verdict("syn-1"))
    assert p.size == 4 and p.pending == 1
    assert "syn-1" not in {d.task.task_id for d in p.sample(4)}
    assert p.refresh(2) >= 0.0
    assert p.size == 5 and p.pending == 0 and list(p.synthesized) == ["syn-1"]
    assert p.synthesized["syn-1"][1] == 2


def test_a_later_rejection_removes_the_task_and_the_latest_verdict_wins():
    p = pool()
    p.offer(verdict("syn-1"))
    p.refresh(1)
    p.offer(verdict("syn-1", "rejected"))
    assert "syn-1" in p.synthesized  # not before the refresh
    p.refresh(2)
    assert "syn-1" not in p.synthesized and p.size == 4
    for v in ("validated", "rejected", "validated"):
        p.offer(verdict("syn-2", v))
    p.refresh(3)
    assert list(p.synthesized) == ["syn-2"]


def test_verdicts_on_seed_ids_and_malformed_records_leave_the_seed_split_alone():
    p = pool()
    p.offer(verdict(SEEDS[1].task_id, "rejected"))
    p.offer({**verdict("broken"), "initial_state": "[1, 2]"})
    p.refresh(1)
    assert p.size == 4 and p.invalid == 1 and not p.synthesized


def test_a_batch_holds_distinct_tasks_while_the_pool_has_enough():
    p = pool()
    drawn = p.sample(4)
    assert sorted(d.task.task_id for d in drawn) == sorted(t.task_id for t in SEEDS)
    assert all(d.source == "seed" for d in drawn)
    assert len(p.sample(9)) == 9


@pytest.mark.parametrize("share", [-1.0, 0.5])
def test_a_redraw_leaves_out_the_tasks_named_and_never_draws_one_twice(share):
    p = pool(synthetic_share=share, fresh_first=True)
    p.offer(verdict("syn-0"))
    p.refresh(1)
    first = {d.task.task_id for d in p.draw(2)}
    for _ in range(20):
        again = [d.task.task_id for d in p.draw(2, exclude=frozenset(first))]
        assert len(again) == len(set(again)) and not set(again) & first
    everything = frozenset(t.task_id for t in SEEDS) | {"syn-0"}
    rest = everything - {SEEDS[0].task_id}
    assert [d.task.task_id for d in p.draw(3, exclude=rest)] == [SEEDS[0].task_id]  # one left: one comes back
    assert p.draw(2, exclude=everything) == []


def _shares(p: TaskPool, draws: int = 400) -> float:
    sources = Counter(d.source for _ in range(draws) for d in p.sample(2))
    return sources["synthesized"] / sum(sources.values())


def test_the_default_mixing_is_uniform_over_the_whole_pool():
    p = pool()
    for i in range(4):
        p.offer(verdict(f"syn-{i}"))
    p.refresh(1)
    assert 0.42 < _shares(p) < 0.58  # 4 of 8 tasks are synthesized


def test_a_synthetic_share_sets_the_fraction_of_each_batch():
    p = pool(synthetic_share=0.25)
    p.offer(verdict("syn-0"))
    p.refresh(1)
    assert 0.20 < _shares(p) < 0.30
    only = pool(synthetic_share=1.0)
    assert _shares(only, 20) == 0.0  # no synthesized task yet: seeds only
    only.offer(verdict("syn-0"))
    only.refresh(1)
    assert _shares(only, 20) == 1.0


def test_recency_halves_an_old_task_weight_every_half_life():
    p = pool(recency_half_life=2.0, synthetic_share=1.0)
    p.offer(verdict("old"))
    p.refresh(1)
    p.offer(verdict("new"))
    p.refresh(5)
    assert p.weight("new") == 1.0 and p.weight("old") == pytest.approx(0.5 ** 2)
    counts = Counter(p.sample(1)[0].task.task_id for _ in range(500))
    assert 0.12 < counts["old"] / 500 < 0.28  # 0.25 / 1.25 = 0.2


def test_fresh_first_draws_each_new_task_at_the_next_step_oldest_first():
    p = pool(fresh_first=True)
    p.offer(verdict("syn-b"))
    p.offer(verdict("syn-a"))
    p.refresh(2)
    p.offer(verdict("syn-c"))
    p.refresh(3)
    first = p.sample(2)
    assert [(d.task.task_id, d.source) for d in first] == [("syn-a", "synthesized"), ("syn-b", "synthesized")]
    drawn = p.sample(3)
    assert drawn[0].task.task_id == "syn-c" and len({d.task.task_id for d in drawn}) == 3
    restored = pool(fresh_first=True)
    restored.restore(p.state())
    assert restored.drawn == {"syn-a", "syn-b", "syn-c"} | {d.task.task_id for d in drawn if d.source == "synthesized"}
    assert [d.task.task_id for d in restored.sample(4)] == [d.task.task_id for d in p.sample(4)]


def test_without_fresh_first_the_draws_are_the_mixing_alone():
    plain, fresh = pool(), pool(fresh_first=True)
    for p in (plain, fresh):
        p.offer(verdict("syn-1"))
        p.refresh(2)
    assert "syn-1" in {d.task.task_id for d in fresh.sample(1)}
    counts = Counter(d.task.task_id for _ in range(500) for d in plain.sample(1))
    assert set(counts) == {"syn-1", *(t.task_id for t in SEEDS)} and counts["syn-1"] < 200  # about 1 in 5


def test_a_frozen_pool_ignores_later_arrivals():
    p = pool(sampler="static")
    p.offer(verdict("early"))
    p.refresh(1)
    p.freeze()
    p.offer(verdict("late"))
    p.offer(verdict("early", "rejected"))
    p.refresh(2)
    assert list(p.synthesized) == ["early"]


def test_state_round_trip_continues_the_same_draws():
    p = pool(recency_half_life=3.0)
    p.offer(verdict("syn-0"))
    p.refresh(2)
    p.sample(3)
    restored = pool(recency_half_life=3.0)
    restored.restore(p.state())
    assert restored.step == 2 and restored.synthesized == p.synthesized
    assert [d.task.task_id for d in restored.sample(5)] == [d.task.task_id for d in p.sample(5)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(sampler="fifo"), "sampler='fifo': choose one of streaming, static"),
    (dict(synthetic_share=1.5), "synthetic_share=1.5: use a share in [0, 1]"),
    (dict(synthetic_share=-0.5), "synthetic_share=-0.5: use a share in [0, 1]"),
    (dict(recency_half_life=-1.0), "recency_half_life, static_wait_s and static_tasks must be >= 0"),
    (dict(static_wait_s=-1.0), "recency_half_life, static_wait_s and static_tasks must be >= 0"),
    (dict(static_tasks=-1), "recency_half_life, static_wait_s and static_tasks must be >= 0")])
def test_bad_sampler_settings_fail_with_a_message(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        SamplerConfig(**kwargs)


def test_the_feed_offers_verdicts_and_dead_letters_every_other_event_type():
    import threading

    from coevolve.services.kafka.consumer import Delivered
    from coevolve.services.learner.loop.feed import TaskFeed

    class Consumer:
        dead_lettered, rejected, flushed, closed = 0, [], threading.Event(), []

        def __init__(self):
            self.deadletters = self
            self.batches = [[Delivered("coevolve.tasks", 0, 0, b"k", "ExplorationRecorded", {"event_id": "e"}),
                             Delivered("coevolve.tasks", 0, 1, b"syn-1", "TaskChecked", verdict("syn-1"))]]

        def poll(self, timeout_s):
            return self.batches.pop() if self.batches else []

        def read_to_end(self, timeout_s):  # the feed's first read: what the topic holds
            return self.poll(timeout_s)

        def reject(self, item, error_type, reason):
            self.dead_lettered += 1
            self.rejected.append((item.offset, error_type, reason))

        def flush(self):
            self.flushed.set()

        def close(self):
            self.closed.append(True)

    made = Consumer()
    p = pool()
    feed = TaskFeed(lambda: made, p, poll_s=0.01).start()
    assert made.flushed.wait(5.0)
    feed.stop()
    assert made.rejected == [(0, "invalid", "ExplorationRecorded on coevolve.tasks: the learner takes only "
                                            "TaskChecked events from it")]
    assert feed.received == 1 and p.pending == 1 and feed.error is None
    assert made.closed == [True, True]  # the consumer and its dead-letter producer


def test_a_pool_of_a_run_takes_in_that_runs_tasks_alone_unless_it_inherits():
    own, earlier = {**verdict("syn-own"), "run_id": "run-b"}, {**verdict("syn-earlier"), "run_id": "run-a"}
    for run_id, joined in (("run-b", ["syn-own"]), (None, ["syn-earlier", "syn-own"])):
        p = TaskPool(SEEDS, SamplerConfig(), rng_seed=7, run_id=run_id)
        p.offer(earlier)
        p.offer(own)
        p.refresh(1)
        assert sorted(p.synthesized) == joined


def test_the_static_wait_ends_when_the_static_tasks_of_this_run_have_verdicts():
    import threading
    import time

    from coevolve.services.kafka.consumer import Delivered
    from coevolve.services.learner.loop.feed import TaskFeed

    offsets = iter(range(100))

    def checked(task_id, run_id="r", step=0):
        return Delivered("coevolve.tasks", 0, next(offsets), task_id.encode(), "TaskChecked",
                         {**verdict(task_id), "run_id": run_id, "step": step})

    class Consumer:
        deadletters, dead_lettered = None, 0

        def __init__(self):  # another run's step-0 task and this run's step-2 task do not count
            self.batches = [[checked("b")], [checked("old", run_id="earlier"), checked("a"), checked("late", step=2)]]

        def poll(self, timeout_s):
            time.sleep(0.01)
            return self.batches.pop() if self.batches else []

        def read_to_end(self, timeout_s):  # the feed's first read: what the topic holds
            return self.poll(timeout_s)

        def close(self):
            pass

    feed, stop = TaskFeed(Consumer, pool(), poll_s=0.01).start(), threading.Event()
    started = time.monotonic()
    assert feed.wait_for("r", 0, 2, 30.0, stop) == 2 and time.monotonic() - started < 5
    started = time.monotonic()
    assert feed.wait_for("r", 0, 3, 0.3, stop) == 2 and time.monotonic() - started >= 0.3  # one never came
    stop.set()
    assert feed.wait_for("r", 0, 3, 30.0, stop) == 2  # a stop ends the wait at once
    assert feed.wait_for("r", 0, 0, 0.2, threading.Event()) == 2  # 0: the whole time, whatever came
    feed.stop()


def test_a_feed_whose_reader_fails_makes_the_learner_unhealthy_and_a_stopped_one_does_not(tmp_path, monkeypatch):
    import time

    from coevolve.services.agent.config import BackendConfig
    from coevolve.services.learner.config import LearnerConfig, LearnerSettings
    from coevolve.services.learner.loop import service as learner_service
    from coevolve.services.learner.loop.service import Learner

    class Broken:
        deadletters, dead_lettered = None, 0

        def poll(self, timeout_s):
            raise ConnectionError("broker at 127.0.0.1:9 is gone")

        def read_to_end(self, timeout_s):  # the feed's first read: what the topic holds
            return self.poll(timeout_s)

        def close(self):
            pass

    from coevolve.services.learner.loop import feed

    monkeypatch.setattr(learner_service, "tasks_consumer", lambda bootstrap: Broken)
    monkeypatch.setattr(feed, "OUTAGE_S", 0.5)  # it reads again through a shorter outage (the next test)
    monkeypatch.setattr(feed, "RETRY_S", (0.05, 0.1))
    service = Learner(LearnerSettings(LearnerConfig(workdir=tmp_path),
                                      backend=BackendConfig(model="tiny-random", backend="transformers")))
    service.pool = pool()
    assert service.health()[0]
    service._follow_tasks()
    deadline = time.monotonic() + 5
    while service.feed.failure() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    ok, details = service.health()
    assert not ok and details["failures"] == ["the task feed stopped: ConnectionError: broker at 127.0.0.1:9 is "
                                              "gone; new tasks no longer reach the pool"]
    service.feed.stop()  # a feed stopped on purpose (the static sampler's freeze) is no failure
    ok, details = service.health()
    assert ok and details["failures"] == []


def test_a_broker_error_does_not_end_the_feed_and_nothing_is_offered_or_lost_twice(monkeypatch):
    """A broker restart under the feed, or a dead letter it cannot flush, reads the topic again from the
    beginning with a new consumer: every verdict is offered once, and the letter lost with the broker is
    written again."""
    import threading
    import time

    from coevolve.services.kafka.consumer import Delivered
    from coevolve.services.learner.loop import feed as feed_module
    from coevolve.services.learner.loop.feed import TaskFeed

    monkeypatch.setattr(feed_module, "RETRY_S", (0.01, 0.02))
    topic = [Delivered("coevolve.tasks", 0, 0, b"syn-1", "TaskChecked", verdict("syn-1")),
             Delivered("coevolve.tasks", 0, 1, b"k", "ExplorationRecorded", {"event_id": "e"}),
             Delivered("coevolve.tasks", 0, 2, b"syn-2", "TaskChecked", verdict("syn-2"))]
    letters, made, done = [], [], threading.Event()

    class Consumer:
        """The first reader's letter is not confirmed, the second meets a restarting broker, the third works."""

        def __init__(self):
            self.deadletters, self.dead_lettered, self.queued = self, 0, []
            self.polls = [topic[:2], topic[2:]] if not made else [topic]
            made.append(self)

        def poll(self, timeout_s):
            if len(made) == 2:
                raise ConnectionError("the broker restarted")
            if not self.polls:
                done.set()
            return self.polls.pop(0) if self.polls else []

        def read_to_end(self, timeout_s):  # the feed's first read: what the topic holds
            return self.poll(timeout_s)

        def reject(self, item, error_type, reason):
            self.dead_lettered += 1
            self.queued.append(item.offset)

        def flush(self):
            if len(made) == 1:
                raise ConnectionError("the letter was not confirmed")
            letters.extend(self.queued)
            self.queued.clear()

        def close(self):
            pass

    p = pool()
    feed = TaskFeed(Consumer, p, poll_s=0.01).start()
    assert done.wait(10.0)
    feed.stop()
    assert len(made) == 3 and feed.retries == 2 and feed.failure() is None and feed.error is None
    assert feed.received == 2 and p.pending == 2  # syn-1 and syn-2, each offered once
    assert letters == [1]  # written by the third reader: the first one's was lost with its broker


def test_the_subjects_are_every_seed_and_the_synthesized_tasks_a_signal_named_across_a_restore():
    from coevolve.services.envs import bfcl_data
    from coevolve.services.learner.config import SamplerConfig
    from coevolve.services.learner.loop.sampler import TaskPool

    seeds = bfcl_data.seed_pool(["multi_turn_base"], 3)
    pool = TaskPool(seeds, SamplerConfig(), check=lambda task: None)
    child = {**seeds[0].to_record(), "task_id": "syn-a", "verdict": "validated", "source": "synthesized",
             "signal_ids": ["s1"], "seed_task_id": seeds[1].task_id}
    unguided = {**child, "task_id": "syn-b", "signal_ids": [], "seed_task_id": seeds[2].task_id}
    grandchild = {**child, "task_id": "syn-c", "seed_task_id": "syn-a"}
    for record in (child, unguided, grandchild):
        pool.offer(record)
    every_seed = sorted(t.task_id for t in seeds)
    assert [t.task_id for t in pool.subject_tasks()] == every_seed  # before the refresh: no synthesized task yet
    pool.refresh(1)
    assert [t.task_id for t in pool.subject_tasks()] == every_seed + ["syn-a"]
    again = TaskPool(seeds, SamplerConfig(), check=lambda task: None)
    again.restore(pool.state())
    assert [t.task_id for t in again.subject_tasks()] == every_seed + ["syn-a"]


def test_a_starting_learner_waits_until_its_feed_has_offered_what_the_topic_holds():
    """A (re)started learner's first step draws from every task validated before it (before: its first
    refresh could come before the feed's first read, and a restart at each step boundary never took a task in)."""
    import time

    from coevolve.services.kafka.consumer import Delivered
    from coevolve.services.learner.loop.feed import TaskFeed

    class Consumer:
        deadletters, dead_lettered = None, 0

        def read_to_end(self, timeout_s):
            time.sleep(0.3)  # a first read that takes a while
            return [Delivered("coevolve.tasks", 0, 0, b"syn-1", "TaskChecked", verdict("syn-1"))]

        def poll(self, timeout_s):
            time.sleep(timeout_s)
            return []

        def close(self):
            pass

    p = pool()
    feed = TaskFeed(Consumer, p, poll_s=0.01).start()
    try:
        assert feed.catch_up() and p.pending == 1
    finally:
        feed.stop()
