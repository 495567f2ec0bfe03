"""Heal the run's services as Kubernetes heals a pod's containers: restart what exits, with a backoff, and
kill and restart what stops answering its health probe.

Two decisions, pure functions of plain data and a clock:

- `backoff(policy, history, now)`: a service that exited (or was killed) is started again after a wait
  that doubles with each of its restarts in the last `window_s` (`backoff_s`, 2 `backoff_s`, 4 ...,
  at most `backoff_max_s`), unless it was restarted `budget` times in that window already: then the run
  ends with its log. Restarts older than the window are forgotten, so a service that crashes once a day
  waits `backoff_s` each time, and one in a crash loop waits ever longer and then fails the run.
- `observe(watch, answer, now)` and `alive(watch, now, start_timeout_s, allowance_s)`: a service counts
  as up once its `/healthz` says `"ready"`; until then it has `start_timeout_s` from its start (a model
  loads before the first ready answer). Once up, `/healthz` may fail (no answer, or 503 when its loop
  has not beaten for its `stale_s`) for at most `allowance_s` in a row; past that it is killed.

A restarted service continues from what it stored: the workers from their committed offsets (and the
signal worker from its changelogs), the learner from its last checkpoint (`Child.rerun_args` gives it
`--resume`). A learner that exits with code 0 has finished (`Child.finishes`), and is left alone.
`Supervisor.tend(names)` applies both decisions to the named children once; the run calls it in each
of its loops (training, drain, the archiver's catch-up).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from coevolve.services.run.children import Child, ChildFailed
from coevolve.services.run.plan import RunSettings
from coevolve.services.runtime.log import get_logger

log = get_logger("run")


@dataclass(frozen=True)
class RestartPolicy:
    """How often one service may be restarted, and how long each restart waits."""

    budget: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0

    @classmethod
    def of(cls, run: RunSettings) -> "RestartPolicy":
        return cls(run.restart_budget, run.restart_window_s, run.restart_backoff_s, run.restart_backoff_max_s)


def backoff(policy: RestartPolicy, history: Iterable[float], now: float) -> float | None:
    """Seconds to wait before restarting a service restarted at the times in `history`; None when it was
    restarted `budget` times within the last `window_s` (its budget is spent)."""
    recent = sum(1 for at in history if now - at < policy.window_s)
    if recent >= policy.budget:
        return None
    return min(policy.backoff_s * 2 ** recent, policy.backoff_max_s)


@dataclass(frozen=True)
class Watch:
    """What the supervisor knows of one process since it started."""

    since: float
    up: bool = False
    failing_since: float | None = None
    probed: float | None = None


def observe(watch: Watch, answer: dict | None, now: float) -> Watch:
    """The watch after a probe: `answer` is the /healthz JSON of a healthy process, None for no answer
    or an unhealthy one."""
    if answer is None:
        failing = watch.failing_since if watch.failing_since is not None else now
        return dataclasses.replace(watch, failing_since=failing, probed=now)
    return dataclasses.replace(watch, up=watch.up or bool(answer.get("ready", True)), failing_since=None,
                               probed=now)


def alive(watch: Watch, now: float, start_timeout_s: float, allowance_s: float) -> bool:
    """Whether the process may live on: within its start-up time until it first answers ready, then as
    long as /healthz has not failed for more than `allowance_s` in a row."""
    if not watch.up:
        return now - watch.since <= start_timeout_s
    return watch.failing_since is None or now - watch.failing_since <= allowance_s


@dataclass(frozen=True)
class Restart:
    """One restart, as summary.json lists it."""

    service: str
    time: str  # UTC, ISO 8601
    cause: str  # "exit" or "liveness"
    exit_code: int | None  # the process's code; -9 after a liveness kill
    number: int  # the service's restarts in this session so far, this one included
    backoff_s: float
    last_log: str


@dataclass
class Supervisor:
    """Restart the run's children that exit or fail their liveness, within the restart policy."""

    children: dict[str, Child]
    policy: RestartPolicy
    liveness_s: dict[str, float]
    start_timeout_s: float
    probe_every_s: float = 5.0
    probe_timeout_s: float = 3.0
    clock: Callable[[], float] = time.monotonic
    restarts: list[Restart] = field(default_factory=list)
    history: dict[str, list[float]] = field(default_factory=dict)
    watches: dict[str, Watch] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, children: dict[str, Child], run: RunSettings) -> "Supervisor":
        return cls(children, RestartPolicy.of(run), dict(run.liveness_s), run.start_timeout_s)

    def tend(self, names: Iterable[str]) -> None:
        """Once for each named child: bound its log, start it if its backoff is over, probe it if it is due,
        kill it if it failed its liveness, and schedule the restart of one that exited; raise ChildFailed
        for a child past its restart budget."""
        now = self.clock()
        for name in names:
            child = self.children[name]
            child.bound_log()
            if name in self.due:
                if now >= self.due[name]:
                    del self.due[name]
                    child.restart()
                    self.watches[name] = Watch(since=self.clock())
                continue
            code = child.exit_code
            if code is None:
                if self._live(name, child, now):
                    continue
                why = self._kill(name, child, now)
            elif code == 0 and child.finishes:
                continue
            else:
                why = ""
            self._schedule(name, child, now, why)

    def _live(self, name: str, child: Child, now: float) -> bool:
        watch = self.watches.setdefault(name, Watch(since=now))
        if watch.probed is not None and now - watch.probed < self.probe_every_s:
            return True  # judged at a probe only, on a fresh answer
        watch = self.watches[name] = observe(watch, child.health(self.probe_timeout_s), now)
        return alive(watch, now, self.start_timeout_s, self.liveness_s[name])

    def _kill(self, name: str, child: Child, now: float) -> str:
        """SIGKILL a child that failed its liveness; return why, for the terminal and its failure."""
        watch = self.watches[name]
        if watch.up:
            why = (f"its /healthz failed for {now - watch.failing_since:.0f} s in a row, over "
                   f"run.liveness_s.{name}={self.liveness_s[name]:g} s")
        else:
            why = f"it did not answer /healthz ready within run.start_timeout_s={self.start_timeout_s:g} s"
        child.kill()
        return why

    def _schedule(self, name: str, child: Child, now: float, why: str) -> None:
        """Restart after the backoff a child that exited (`why` empty) or was killed (`why` says why)."""
        history = self.history.setdefault(name, [])
        wait = backoff(self.policy, history, now)
        ended = f"was killed ({why})" if why else f"exited with code {child.exit_code}"
        if wait is None:
            killed = f" (killed: {why})" if why else ""
            raise child.failure(f"{killed}; its restarts are spent (run.restart_budget={self.policy.budget} "
                                f"within run.restart_window_s={self.policy.window_s:g} s)")
        history.append(now)
        self.due[name] = now + wait
        self.watches.pop(name, None)
        last = child.last_line()
        record = Restart(name, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "liveness" if why else "exit",
                         child.exit_code, len(history), wait, last)
        self.restarts.append(record)
        recent = sum(1 for at in history if now - at < self.policy.window_s)
        resume = f" with {' '.join(child.rerun_args)}" if child.rerun_args else ""
        print(f"{name} {ended}; restarting it{resume} in {wait:g} s (restart {record.number}; {recent} of "
              f"{self.policy.budget} within run.restart_window_s={self.policy.window_s:g} s); "
              f"last log line: {last}", flush=True)
        log.warning("run.restart", service=name, cause=record.cause, exit_code=child.exit_code, restart=record.number,
                    backoff_s=wait, reason=why or None, log=str(child.log_path))

    def report(self) -> list[dict]:
        """Every restart so far, for summary.json."""
        return [dataclasses.asdict(r) for r in self.restarts]
