"""After downtime a service meets a backlog: several periods close at once. It polls a bounded batch and
beats after each period it explores (each group batch it checks), so a slow model does not outlast the
liveness allowance while it works the backlog off; and it commits what it finished while a period or
group is still open, up to the oldest record that one holds."""
import threading
import time
from contextlib import contextmanager

from coevolve.services.explorer.config import ExplorerConfig, ExplorerServiceConfig, ExplorerSettings
from coevolve.services.explorer.exploring import Outcome
from coevolve.services.explorer.service import Explorer
from coevolve.services.kafka.consumer import Delivered
from tests.events import sample_events

STEPS = 4  # closed periods waiting at the start
EXPLORE_S = 0.3  # each period's exploration, on a slow model


class Backlog:
    """A consumer holding one completed step per period, handed out `max_records` at a time."""

    def __init__(self):
        step = sample_events()["StepCompleted"]
        self.items = [Delivered("coevolve.steps", 0, i, b"r1", "StepCompleted", {**step, "step": i})
                      for i in range(STEPS)]
        self.limits, self.commits, self.below = [], 0, []

    def poll(self, timeout_s, max_records=None):
        self.limits.append(max_records)
        taken, self.items = self.items[:max_records], self.items[max_records:]
        return taken

    @contextmanager
    def working(self):
        yield

    def assigned(self):
        return True

    def commit(self, below=None):
        self.commits += 1
        self.below.append(below)
        return True


class Producer:
    def flush(self):
        pass


def unhealthy_while(service) -> list[float]:
    """Run one `step()` of the service while a probe reads its /healthz; when it answered unhealthy."""
    unhealthy, done = [], threading.Event()

    def probe():
        while not done.is_set():
            if not service.health()[0]:
                unhealthy.append(time.monotonic())
            time.sleep(0.02)

    watcher = threading.Thread(target=probe)
    watcher.start()
    try:
        service.poll()
    finally:
        done.set()
        watcher.join()
    return unhealthy


def test_an_explorer_working_off_a_backlog_stays_healthy_and_commits_each_bounded_batch():
    explorer = Explorer(ExplorerSettings(explorer=ExplorerConfig(strategy="random-calls", fallback_tasks=1,
                                                                 step_grace_s=0.0),
                                         service=ExplorerServiceConfig(poll_records=STEPS)))
    explorer.consumer, explorer.producer, explorer.stale_s = Backlog(), Producer(), 2 * EXPLORE_S
    explored = []

    def slow(plan):
        time.sleep(EXPLORE_S)
        explored.append(plan.first_step)
        return Outcome()

    explorer._explore = slow
    assert not unhealthy_while(explorer)  # four periods, 1.2 s of exploring, against an allowance of 0.6 s
    assert explored == list(range(STEPS))
    assert explorer.consumer.limits == [STEPS] and explorer.consumer.commits == 1


def test_a_validator_checking_a_backlog_of_groups_beats_between_batches(monkeypatch):
    from coevolve.services.validator import service as validator_service
    from coevolve.services.validator.config import ValidatorConfig, ValidatorServiceConfig, ValidatorSettings
    from coevolve.services.validator.novelty import RunIndexes
    from coevolve.services.validator.proposing import Checked

    explored = sample_events()["ExplorationRecorded"]
    groups = 3 * validator_service.CHECK_BATCH - 1  # three batches
    consumer = Backlog()
    consumer.items = [Delivered("coevolve.explorations", 0, i, b"t", "ExplorationRecorded",
                                {**explored, "event_id": f"e{i}", "task_id": f"task-{i}", "round": 0})
                      for i in range(groups)]
    consumer.reject = lambda item, error_type, reason: None
    validator = validator_service.Validator(ValidatorSettings(validator=ValidatorConfig(rounds_per_group=1),
                                                              service=ValidatorServiceConfig(poll_records=groups)))
    validator.consumer, validator.producer, validator.stale_s = consumer, Producer(), 2 * EXPLORE_S
    validator.indexes = RunIndexes([], 90.0, inherit=False)
    batches = []

    def slow(ready, *args):
        time.sleep(EXPLORE_S)
        batches.append(len(ready))
        return [Checked(None, None, "nothing_to_abstract", "no call succeeded") for _ in ready]

    monkeypatch.setattr(validator_service, "check_groups", slow)
    assert not unhealthy_while(validator)
    size = validator_service.CHECK_BATCH
    assert batches == [size, size, size - 1] and consumer.commits == 1


def test_an_explorer_commits_a_closed_period_while_a_later_one_waits():
    signal, step = sample_events()["SignalRaised"], sample_events()["StepCompleted"]
    run = step["run_id"]
    explorer = Explorer(ExplorerSettings(explorer=ExplorerConfig(strategy="random-calls", step_grace_s=0.3,
                                                                 every_steps=1)))
    backlog = Backlog()
    backlog.items = [Delivered("coevolve.signals", 0, 0, b"t", "SignalRaised", {**signal, "event_id": "s0",
                                                                                  "run_id": run, "step": 0}),
                     Delivered("coevolve.signals", 0, 1, b"t", "SignalRaised", {**signal, "event_id": "s1",
                                                                                  "run_id": run, "step": 1}),
                     Delivered("coevolve.steps", 0, 7, b"r", "StepCompleted", {**step, "step": 0})]
    explorer.consumer, explorer.producer = backlog, Producer()
    explored = []
    explorer._explore = lambda plan: explored.append(plan.first_step) or Outcome()
    explorer.poll()  # step 0's period waits for its grace; step 1's for its StepCompleted
    assert explored == [] and backlog.below == [{("coevolve.signals", 0): 0, ("coevolve.steps", 0): 7}]
    time.sleep(0.35)
    explorer.poll()  # step 0's period closes: its signal and StepCompleted are released, step 1's signal held
    assert explored == [0] and backlog.below[-1] == {("coevolve.signals", 0): 1}
    assert set(explorer.delivered) == {"s1"}


def test_a_validator_commits_a_judged_group_while_a_later_one_waits(monkeypatch):
    from coevolve.services.validator import service as validator_service
    from coevolve.services.validator.config import ValidatorConfig, ValidatorSettings
    from coevolve.services.validator.novelty import RunIndexes
    from coevolve.services.validator.proposing import Checked

    explored = sample_events()["ExplorationRecorded"]
    consumer = Backlog()
    consumer.items = [Delivered("coevolve.explorations", 1, 10 + i, b"t", "ExplorationRecorded",
                                {**explored, "event_id": f"e{i}", "task_id": task, "round": r})
                      for i, (task, r) in enumerate([("task-a", 0), ("task-a", 1), ("task-b", 0)])]
    consumer.reject = lambda item, error_type, reason: None
    validator = validator_service.Validator(ValidatorSettings(validator=ValidatorConfig(rounds_per_group=2)))
    validator.consumer, validator.producer = consumer, Producer()
    validator.indexes = RunIndexes([], 90.0, inherit=False)
    judged = []

    def check(ready, *args):
        judged.extend(g[0]["task_id"] for g in ready)
        return [Checked(None, None, "nothing_to_abstract", "no call succeeded") for _ in ready]

    monkeypatch.setattr(validator_service, "check_groups", check)
    validator.poll()
    assert judged == ["task-a"] and consumer.below == [{("coevolve.explorations", 1): 12}]
    assert set(validator.delivered) == {"e2"}
