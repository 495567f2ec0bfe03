"""What a replay hands back: JSON-lines files, published SignalRaised events, the summary and the
`--compare` diff against a file or a topic."""
from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coevolve.streams.replay.sources import read_topic
from coevolve.streams.rules import KINDS, Signal


@dataclass
class ReplayResult:
    """A replay's signals, the trajectory events it read, its time and the rollouts' outcomes."""

    signals: list[Signal]
    events: int = 0
    seconds: float = 0.0
    outcomes: dict = field(default_factory=dict)
    invalid: list = field(default_factory=list)


def summarize(signals: Iterable[Signal]) -> dict[str, int]:
    counts = {k: 0 for k in KINDS}
    for s in signals:
        counts[s.kind] += 1
    return counts


def diff(new: Iterable[dict], old: Iterable[dict]) -> dict:
    """Compare two signal sets (JSON forms) by kind, run, step and subject, ignoring thresholds."""
    def index(items: Iterable[dict]) -> dict:
        return {(s["type"], s["run_id"], s["step"], s["subject"]): s for s in items}

    a, b = index(new), index(old)
    added = sorted(a.keys() - b.keys())
    removed = sorted(b.keys() - a.keys())
    by_kind = {k: {"added": 0, "removed": 0, "kept": 0} for k in KINDS}
    for key in added:
        by_kind[key[0]]["added"] += 1
    for key in removed:
        by_kind[key[0]]["removed"] += 1
    for key in a.keys() & b.keys():
        by_kind[key[0]]["kept"] += 1
    return {"added": added, "removed": removed, "by_kind": by_kind}


def iter_json_lines(lines: Iterable[str]) -> Iterator[dict]:
    for line in lines:
        line = line.strip()
        if line:
            yield json.loads(line)
@contextlib.contextmanager
def whole_file(output: Path) -> Iterator[Path]:
    """A partial file beside `output` to write in the block; it replaces `output` when the block ends
    without an error, and no partial file is left either way."""
    partial = output.with_name(f".{output.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        yield partial
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)


def signal_line(signal: Signal, evidence: bool = True) -> str:
    """A signal's JSON line, as every signal file holds it."""
    return json.dumps(signal.to_json(evidence), separators=(",", ":")) + "\n"


def write_jsonl(signals: Iterable[Signal], path: Path | str, evidence: bool = True) -> int:
    n = 0
    with open(path, "w") as fh:
        for s in signals:
            fh.write(signal_line(s, evidence))
            n += 1
    return n


def publish_signals(signals: Iterable[Signal], bootstrap: str, topic: str) -> int:
    """Send each signal as a SignalRaised event keyed by task_id, or by its pattern for rare."""
    from coevolve.services.kafka.producer import EventProducer

    now = int(time.time() * 1000)
    n = 0
    with EventProducer(bootstrap, client_id="coevolve-replay") as producer:
        for s in signals:
            producer.send(topic, s.to_record(now), key=s.task_id or s.subject, record_name="SignalRaised")
            n += 1
    return n


def read_signal_file(path: Path | str) -> list[dict]:
    with open(path) as fh:
        return list(iter_json_lines(fh))


def read_signal_topic(bootstrap: str, topic: str, idle_s: float = 2.0) -> list[dict]:
    """Every distinct signal on a topic, in JSON form (redeliveries of one id count once)."""
    seen: dict[str, dict] = {}
    for item in read_topic(bootstrap, topic, idle_s):
        if item.name == "SignalRaised":
            seen.setdefault(item.event["event_id"], Signal.from_record(item.event).to_json())
    return list(seen.values())


def summary_lines(events: int, seconds: float, outcomes: dict, counts: dict[str, int]) -> list[str]:
    """The report's first two lines: events, rate and outcomes; signal counts by kind."""
    rate = events / seconds if seconds else 0.0
    return [f"replayed {events} trajectory events in {seconds:.2f} s ({rate:,.0f}/s); "
            + " ".join(f"{k}={v}" for k, v in outcomes.items()),
            "signals: " + " ".join(f"{k}={v}" for k, v in counts.items()) + f" total={sum(counts.values())}"]


def report(result: ReplayResult, compare: list[dict] | None = None) -> str:
    """The summary a user reads: counts by kind, and the diff against `compare` if given."""
    lines = summary_lines(result.events, result.seconds, result.outcomes, summarize(result.signals))
    if compare is not None:
        d = diff((s.to_json() for s in result.signals), compare)
        lines.append(f"compared with {len(compare)} signals: +{len(d['added'])} -{len(d['removed'])}")
        for kind, c in d["by_kind"].items():
            lines.append(f"  {kind:10s} added={c['added']} removed={c['removed']} kept={c['kept']}")
        for sign, keys in (("+", d["added"]), ("-", d["removed"])):
            for kind, run, step, subject in keys[:20]:
                lines.append(f"  {sign} {kind} run={run} step={step} {subject}")
            if len(keys) > 20:
                lines.append(f"  {sign} ... {len(keys) - 20} more")
    return "\n".join(lines)


def load_reference(compare: str | None, bootstrap: str | None, publish: str | None) -> list[dict] | None:
    """Check the output flags and read the `--compare` signals (a JSON-lines file, or a topic)."""
    if publish and not bootstrap:
        raise ValueError("--publish needs --bootstrap HOST:PORT")
    if compare is None:
        return None
    if Path(compare).exists():
        return read_signal_file(compare)
    if bootstrap:
        return read_signal_topic(bootstrap, compare)
    raise ValueError(f"--compare {compare}: no such file (for a topic, give --bootstrap)")


def deliver(result: ReplayResult, output: Path | None, publish: str | None, bootstrap: str | None,
            reference: list[dict] | None, evidence: bool = True) -> str:
    """Write and publish a replay's signals as asked; return the report."""
    if output is not None:
        write_jsonl(result.signals, output, evidence)
    if publish:
        publish_signals(result.signals, bootstrap, publish)
    return report(result, reference)
