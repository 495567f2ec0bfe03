"""`coevolve validator`: `ExplorationRecorded` in, one `TaskChecked` per proposed task out (a runtime.Service).

Explorations gather in `ExplorationGroups` (the rounds of one source on one task). A complete group,
or one that waited `group_wait_s`, is abstracted by the model into a proposed task, which goes through
the validation stages (`proposing.check_groups`, one batched abstraction for every ready group). Every verdict is published to `coevolve.tasks`, keyed
by the task id; a group whose abstraction never parsed goes to the dead-letter topic with the reason.
Offsets are committed after publishing, each partition up to the oldest exploration an open group still
holds (`Holds`), so a long backlog commits as it is worked off. An event
that is not an `ExplorationRecorded` is dead-lettered (`invalid`).

A task is judged once. Its id derives from the group's exploration ids, and at start the validator
reads every verdict on `coevolve.tasks`: a group redelivered after a crash between publishing and
committing (or re-emitted upstream) has a verdict already, so it is skipped, not judged again, and no
second verdict can replace the first under the compacted key. The tasks validated before join their
run's novelty index (every run's with `inherit_tasks`, as the learner's pool takes them in), so a restart
keeps rejecting their duplicates, and the task catalog, so an exploration of a task the loop made (a
signal on a synthesized task) builds a second-generation task from it.
"""
from __future__ import annotations

import itertools
import time

from prometheus_client import Counter, Gauge

from coevolve.services.agent.config import SamplingConfig
from coevolve.services.envs.catalog import TaskCatalog
from coevolve.services.envs.hosts import bounded_tool_calls, register_tool_host
from coevolve.services.kafka.consumer import EventConsumer
from coevolve.services.kafka.holds import Holds
from coevolve.services.kafka.producer import EventProducer
from coevolve.services.kafka.topics import EXPLORATIONS, TASKS
from coevolve.services.runtime.service import Service
from coevolve.services.validator.abstraction import synthesized_task_id
from coevolve.services.validator.config import ValidatorServiceConfig, ValidatorSettings
from coevolve.services.validator.groups import ExplorationGroups, group_key
from coevolve.services.validator.novelty import RunIndexes
from coevolve.services.validator.proposing import Checked, check_groups

CHECK_BATCH = 8  # ready groups abstracted and checked in one batch; the loop beats between batches


def _run(group: list) -> str:
    return str(group[0]["run_id"])


class Validator(Service):
    """Group explorations, abstract and validate each group, publish every verdict, then commit."""

    name = "validator"

    def __init__(self, settings: ValidatorSettings):
        super().__init__(settings.service, scope=bounded_tool_calls(settings.limits))
        register_tool_host(self.registry)
        cfg, gen, backend_cfg = settings.service, settings.generation, settings.backend
        self.cfg: ValidatorServiceConfig = cfg
        self.core, self.backend_cfg = settings.validator, backend_cfg
        self.groups = ExplorationGroups(self.core.rounds_per_group)
        self.holds = Holds()
        self.sampling = SamplingConfig(temperature=gen.temperature, max_new_tokens=gen.json_max_new_tokens,
                                       seed=backend_cfg.seed)
        self.attempt_sampling = SamplingConfig(temperature=cfg.attempt_temperature, max_new_tokens=gen.max_new_tokens,
                                               seed=backend_cfg.seed)
        self.limits = settings.limits
        self.indexes: RunIndexes | None = None
        self.judged: dict[str, str] = {}  # task id -> its verdict, from coevolve.tasks and this process
        self.delivered: dict = {}
        self.backend = self.consumer = self.producer = self.catalog_reader = None
        self.catalog = TaskCatalog()
        self.uncommitted = 0
        self.last_event = time.monotonic()
        self.checked = self.validated = 0
        reg = self.registry
        self.m_explorations = Counter("validator_explorations_consumed", "ExplorationRecorded events taken "
                                      "(redeliveries excluded).", registry=reg)
        self.m_proposed = Counter("validator_tasks_proposed", "Groups the model abstracted into a task.",
                                  registry=reg)
        self.m_verdicts = Counter("validator_verdicts", "Verdicts published, by verdict and deciding stage "
                                  "(the rejecting one; the last one run for a validated task).",
                                  ["verdict", "stage"], registry=reg)
        self.m_dead = Counter("validator_dead_letters", "Groups dead-lettered (abstraction unparseable or "
                              "no seed task).", ["error_type"], registry=reg)
        self.m_judged = Counter("validator_groups_already_judged", "Ready groups skipped because their task "
                                "has a verdict (a redelivery or a re-emitted exploration).", registry=reg)
        self.m_pass_rate = Gauge("validator_pass_rate", "Validated share of the verdicts published so far.",
                                 registry=reg)

    def details(self) -> dict:
        return {"pending_explorations": self.groups.pending, "verdicts": self.checked}

    def start(self) -> None:
        from coevolve.services.agent.backends import make_backend
        from coevolve.services.envs.bfcl_data import load_tasks

        cfg = self.cfg
        seeds = load_tasks(split="all")
        self.indexes = RunIndexes(seeds, self.core.similarity_threshold, self.core.inherit_tasks)
        known = self._load_catalog()
        self.backend = make_backend(self.backend_cfg)
        self.producer = EventProducer(cfg.kafka_bootstrap, client_id="coevolve-validator", service="validator")
        self.consumer = EventConsumer(cfg.kafka_bootstrap, [EXPLORATIONS.name], group_id=cfg.group(self.name),
                                      service="validator", deadletters=self.producer)
        self.log.info("validator.started", bootstrap=cfg.kafka_bootstrap, validation=self.core.validation,
                      model=self.backend_cfg.model, backend=self.backend_cfg.backend,
                      seeds=len(seeds), validated_before=known)
        self.last_event = time.monotonic()

    def _load_catalog(self) -> int:
        """Add the tasks validated before this start (the compacted coevolve.tasks, read from the
        beginning without a group, by a reader kept open for the catalog, to its end or not at all) to the
        novelty index and the catalog; their count."""
        self.catalog_reader = EventConsumer(self.cfg.kafka_bootstrap, [TASKS.name], service="validator-catalog")
        self.catalog = TaskCatalog(self.catalog_reader)
        read = self.catalog_reader.read_to_end(self.cfg.catalog_read_s, complete=True)  # else ReadShort: no start
        latest = {str(i.event["task_id"]): i.event for i in read if i.name == "TaskChecked"}
        known = 0
        for record in latest.values():  # the last verdict per task, as compaction keeps it
            self.judged[str(record["task_id"])] = str(record["verdict"])
            if not self.catalog.add(record):
                if record["verdict"] == "validated":
                    self.log.warning("validator.catalog_task_skipped", task_id=record["task_id"],
                                     error=self.catalog.skipped.get(str(record["task_id"]), ""))
                continue
            self.indexes.get(str(record["run_id"])).add(self.catalog.get(str(record["task_id"])))
            known += 1
        return known

    def poll(self) -> None:
        """Poll once, group, check the groups that are ready, publish, commit up to what open groups hold."""
        items = self.consumer.poll(0.5, self.cfg.poll_records)  # bounded: a backlog is worked off in batches
        self.beat()
        ready: list = []
        for item in items:
            if item.name != "ExplorationRecorded":
                self.consumer.reject(item, "invalid", f"expected ExplorationRecorded, got {item.name}")
                continue
            self.delivered[str(item.event["event_id"])] = item
            group = self.groups.add(item.event, time.monotonic())
            if group is not None:
                ready.append(group)
            elif self.groups.is_open(group_key(item.event)):
                self.holds.hold(group_key(item.event), item)
        self.m_explorations.inc(len(items))
        ready = ready + self.groups.expire(time.monotonic(), self.cfg.group_wait_s)
        for group in ready:
            self.holds.release(group_key(group[0]))
        ready = self._unjudged(ready)
        if items or ready or not self.consumer.assigned():
            self.last_event = self.last_beat
        results: list[Checked] = []
        if ready:
            with self.consumer.working():  # model work outlasts the poll interval; keep the group
                ready.sort(key=_run)  # each run's groups against its own novelty index (`RunIndexes`)
                for run_id, groups in itertools.groupby(ready, key=_run):
                    groups = list(groups)
                    for start in range(0, len(groups), CHECK_BATCH):  # a beat after each batch of groups
                        results += check_groups(groups[start:start + CHECK_BATCH], self.backend,
                                                self.indexes.get(run_id), self.core, self.sampling, self.limits,
                                                self.attempt_sampling, self.cfg.attempts, self.catalog.get)
                        self.beat()
        self.uncommitted += len(items)
        if self.uncommitted or results:
            self.settle(lambda: self._publish(ready, results), self._commit, self.uncommitted)
            self.uncommitted = 0
        idle = time.monotonic() - self.last_event
        if self.cfg.idle_exit_seconds and not self.groups.pending and idle >= self.cfg.idle_exit_seconds:
            self.stop()

    def _unjudged(self, groups: list) -> list:
        """The groups whose task has no verdict yet; the others are logged and skipped."""
        out = []
        for group in groups:
            task_id = synthesized_task_id(str(e["event_id"]) for e in group)
            if task_id not in self.judged:
                out.append(group)
                continue
            self.m_judged.inc()
            self.log.info("validator.already_judged", task_id=task_id, verdict=self.judged[task_id],
                          explorations=len(group))
        return out

    def _publish(self, groups: list, results: list[Checked]) -> None:
        """Send every verdict and dead letter, and wait until the broker has them all."""
        for group, result in zip(groups, results):
            if result.record is None:
                item = self.delivered.get(str(group[0]["event_id"]))
                if item is not None:
                    self.consumer.reject(item, result.error_type, result.reason)
                self.m_dead.labels(result.error_type).inc()
                continue
            self.m_proposed.inc()
            self.producer.send(TASKS.name, result.record, key=result.record["task_id"])
            self.judged[str(result.record["task_id"])] = str(result.record["verdict"])
            self.catalog.add(result.record)
            verdict = result.verdict
            self.log.info("validator.verdict", task_id=result.record["task_id"], verdict=result.record["verdict"],
                          stage=verdict.stages[-1].stage, reason=verdict.reason, score=verdict.score,
                          seed_task_id=result.record["seed_task_id"])
            self.m_verdicts.labels(result.record["verdict"], verdict.stages[-1].stage).inc()
            self.checked += 1
            self.validated += verdict.validated
            self.m_pass_rate.set(self.validated / self.checked)
        self.producer.flush()

    def _commit(self) -> bool:
        """Commit everything polled but what an open group holds."""
        committed, self.delivered = self.holds.commit(self.consumer, self.delivered)  # an open group's may fail
        return committed

    def finish(self) -> None:
        for closable in (self.consumer, self.catalog_reader, self.producer, self.backend):
            if closable is not None:
                closable.close()
