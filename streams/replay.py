"""`coevolve replay`: recompute signals from the event log with any thresholds.

Sources: Avro container files (`read_files`) or the Kafka topics from offset zero (`read_topics`).
Completed-step records are read first and take effect just before the first trajectory of their run
with a higher step (see streams/signals.py); the end of the input closes every open group and step.
Trajectory files are decoded by ClickHouse (embedded chDB) by default, and the evidence of the
trajectories that signals carry is read from the files once the signals are known. With the fastavro
decoder and `workers > 1`, they are decoded by that many processes, block ranges each. Either way the
main process feeds the rollouts, in file order, to the same pure functions.
"""
from __future__ import annotations

import io
import json
import multiprocessing
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import fastavro

from coevolve.schemas.container import LogFileError, log_paths
from coevolve.streams.signals import (EvidenceLimits, InvalidEvent, Replayer, Signal, Thresholds, diff,
                                      iter_json_lines, make_rollout, pattern_keys, rollout_of, summarize)

CHUNK_BYTES = 512 * 1024  # trajectory bytes one decode task covers
DECODERS = ("chdb", "fastavro")


@dataclass
class ReplayResult:
    signals: list[Signal]
    events: int = 0
    seconds: float = 0.0
    outcomes: dict = field(default_factory=dict)
    invalid: list = field(default_factory=list)


def expand_inputs(paths: Iterable[Path | str]) -> list[Path]:
    """The given files, plus the completed-step file written beside a trajectory log, if present."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p not in out:
            out.append(p)
        sibling = log_paths(p)["StepCompleted"]
        if p.name.endswith(".avro") and sibling != p and sibling.exists() and sibling not in out:
            out.append(sibling)
    return out


def _root_name(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            reader = fastavro.reader(fh)
            root = reader.writer_schema
    except OSError as exc:
        raise LogFileError(f"{path}: cannot open: {exc.strerror}") from exc
    except (ValueError, EOFError) as exc:
        raise LogFileError(f"{path}: not an Avro container file ({exc})") from exc
    if not isinstance(root, dict) or root.get("type") != "record":
        raise LogFileError(f"{path}: root schema must be one event record, one type per file")
    return root["name"].rsplit(".", 1)[-1]


def _chunks(path: Path) -> tuple[bytes, list[tuple[int, int]]]:
    """The file's header bytes and (offset, length) ranges of whole blocks, about CHUNK_BYTES each."""
    with open(path, "rb") as fh:
        blocks = [(b.offset, b.size) for b in fastavro.block_reader(fh)]
        if not blocks:
            return b"", []
        fh.seek(0)
        header = fh.read(blocks[0][0])
    ranges, start, end = [], None, None
    for off, size in blocks:
        if start is None:
            start = off
        end = off + size
        if end - start >= CHUNK_BYTES:
            ranges.append((start, end - start))
            start = None
    if start is not None:
        ranges.append((start, end - start))
    return header, ranges


def _decode_chunk(task: tuple[str, bytes, int, int, EvidenceLimits, int]) -> list:
    """Decode one block range to (rollout, pattern keys); an invalid one to ('invalid', id, reason)."""
    path, header, offset, length, limits, pattern_length = task
    with open(path, "rb") as fh:
        fh.seek(offset)
        body = fh.read(length)
    out = []
    for event in fastavro.reader(io.BytesIO(header + body)):
        try:
            r = rollout_of(event, limits)
        except (InvalidEvent, KeyError, TypeError) as exc:
            out.append(("invalid", str(event.get("event_id")), str(exc)))
            continue
        out.append((r, pattern_keys(r[7], pattern_length)))
    return out


def replay_files(paths: Iterable[Path | str], thresholds: Thresholds = Thresholds(),
                 limits: EvidenceLimits = EvidenceLimits(), workers: int = 1, decoder: str = "chdb",
                 evidence: bool = True) -> ReplayResult:
    """Replay Avro container files (trajectory and completed-step files, any order). `decoder`: chdb
    (ClickHouse reads the files; evidence is fetched at the end for the trajectories signals carry) or
    fastavro (in `workers` processes); the same pure functions decide every signal either way.
    `evidence=False` (chdb): skip that fetch; the signals then carry no trajectories."""
    if decoder not in DECODERS:
        raise ValueError(f"--decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    started = time.perf_counter()
    replayer = Replayer(thresholds, limits)
    named = [(p, _root_name(p)) for p in expand_inputs(paths)]
    for path, name in named:
        if name == "StepCompleted":
            for event in fastavro.reader(open(path, "rb")):
                replayer.add_step(event)
    trajectory_files = [p for p, n in named if n == "TrajectoryRecorded"]
    if decoder == "fastavro":
        events = _feed(replayer, _rollouts(trajectory_files, limits, thresholds.pattern_length, workers))
        signals = replayer.finish()
    else:
        import clickhouse_connect

        client = clickhouse_connect.get_client(dsn="chdb://memory")
        try:
            events = _feed(replayer, _rollouts_chdb(client, trajectory_files, thresholds.pattern_length))
            signals = replayer.finish()
            if evidence:
                _fill_evidence(client, signals, trajectory_files, limits)
            else:
                for s in signals:
                    if s.evidence.get("trajectories"):
                        s.evidence["trajectories"] = []
        finally:
            client.close()
    return ReplayResult(signals, events, time.perf_counter() - started, dict(replayer.outcomes),
                        replayer.invalid)


def _feed(replayer: Replayer, items: Iterable[tuple]) -> int:
    events = 0
    for item in items:
        events += 1
        if item[0] == "invalid":
            replayer.outcomes["invalid"] += 1
            replayer.invalid.append((item[1], item[2]))
        else:
            replayer.add_rollout(*item)
    return events


def _rollouts_chdb(client, paths: list[Path], pattern_length: int) -> Iterator[tuple]:
    """Each trajectory in file order, read by ClickHouse: (rollout, pattern keys), its event id standing
    in for its evidence; or ('invalid', id, reason)."""
    from coevolve.services.archive.sqlreplay import _quote

    for path in paths:
        with client.query_rows_stream(f"""SELECT event_id, run_id, step, task_id, rollout_index, group_size,
                score, actions.name FROM file({_quote(path)}, 'Avro') ORDER BY _row_number""") as rows:
            for row in rows:
                try:
                    r = make_rollout(*row, row[0])
                except InvalidEvent as exc:
                    yield "invalid", row[0], str(exc)
                    continue
                yield r, pattern_keys(r[7], pattern_length)


def _fill_evidence(client, signals: list[Signal], paths: list[Path], limits: EvidenceLimits) -> None:
    """Replace the event ids standing in for trajectories in the signals' evidence with the evidence
    itself, read from the files (the first valid occurrence of each id, shaped as `rollout_of` does)."""
    from coevolve.services.archive.sqlreplay import evidence_of

    lists = [s.evidence["trajectories"] for s in signals if s.evidence.get("trajectories")]
    wanted = {e for lst in lists for e in lst if isinstance(e, str)}
    if not wanted:
        return
    found = evidence_of(client, wanted, ("files", paths), limits)
    for lst in lists:
        lst[:] = [found[e] if isinstance(e, str) else e for e in lst]


def _rollouts(paths: list[Path], limits: EvidenceLimits, pattern_length: int, workers: int) -> Iterator[tuple]:
    tasks = []
    for path in paths:
        header, ranges = _chunks(path)
        tasks += [(str(path), header, off, length, limits, pattern_length) for off, length in ranges]
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield from _decode_chunk(task)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        for chunk in pool.imap(_decode_chunk, tasks):
            yield from chunk


def read_topic(bootstrap: str, topic: str, idle_s: float = 2.0) -> list:
    """Every decodable event on `topic` from offset zero, until it is idle for `idle_s`."""
    from coevolve.services.broker.consumer import EventConsumer

    consumer = EventConsumer(bootstrap, [topic], service="replay")
    try:
        return consumer.drain(idle_s=idle_s)
    finally:
        consumer.close()


def read_topics(bootstrap: str, idle_s: float = 2.0) -> Iterator[tuple[str, dict]]:
    """Every completed-step event, then every trajectory, from offset zero; stop when idle."""
    from coevolve.services.broker.topics import STEPS, TRAJECTORIES

    for topic in (STEPS.name, TRAJECTORIES.name):
        items = read_topic(bootstrap, topic, idle_s)
        items.sort(key=lambda d: (d.partition, d.offset))
        for item in items:
            yield item.name, item.event


def replay_topics(bootstrap: str, thresholds: Thresholds = Thresholds(),
                  limits: EvidenceLimits = EvidenceLimits()) -> ReplayResult:
    started = time.perf_counter()
    replayer = Replayer(thresholds, limits)
    events = 0
    for name, event in read_topics(bootstrap):
        events += name == "TrajectoryRecorded"
        replayer.add_event(name, event)
    signals = replayer.finish()
    return ReplayResult(signals, events, time.perf_counter() - started, dict(replayer.outcomes),
                        replayer.invalid)


def write_jsonl(signals: Iterable[Signal], path: Path | str, evidence: bool = True) -> int:
    n = 0
    with open(path, "w") as fh:
        for s in signals:
            fh.write(json.dumps(s.to_json(evidence), separators=(",", ":")) + "\n")
            n += 1
    return n


def publish_signals(signals: Iterable[Signal], bootstrap: str, topic: str) -> int:
    """Send each signal as a SignalRaised event keyed by task_id, or by its pattern for rare."""
    from coevolve.services.broker.producer import EventProducer

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


def run_replay(inputs: list[Path] | None, bootstrap: str | None, window: int, success_threshold: float,
               rare_threshold: float, pattern_length: int, output: Path | None, publish: str | None,
               compare: str | None, workers: int = 1, evidence: bool = True, decoder: str = "chdb") -> str:
    """The `coevolve replay` command: replay, write or publish, and return the report."""
    thresholds = Thresholds(success_threshold, window, rare_threshold, pattern_length)
    reference = load_reference(compare, bootstrap, publish)
    if inputs:  # published signals carry their evidence whatever the output file holds
        result = replay_files(inputs, thresholds, workers=workers, decoder=decoder, evidence=evidence or bool(publish))
    else:
        result = replay_topics(bootstrap, thresholds)
    return deliver(result, output, publish, bootstrap, reference, evidence)
