"""Where a replay reads the log: Avro container files (decoded by chDB or fastavro) and Kafka topics.

Every source yields trajectories in log order, as (rollout, pattern keys) or ('invalid', event id,
reason); completed-step events are read first (see streams/rules.py: they take effect by position).
`evidence_of` fetches the evidence of the trajectories the signals carry, from files or the archive.
"""
from __future__ import annotations

import io
import multiprocessing
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import fastavro

from coevolve.schemas.container import log_paths, record_name
from coevolve.services.clickhouse.sql import insert_rows, quote_path
from coevolve.streams.rules import EvidenceLimits, InvalidEvent, make_rollout, pattern_keys, rollout_of

CHUNK_BYTES = 512 * 1024  # trajectory bytes one fastavro decode task covers


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
        out.append((r, pattern_keys(r.names, pattern_length)))
    return out


def chdb_rollouts(client, paths: list[Path], pattern_length: int) -> Iterator[tuple]:
    """Each trajectory in file order, read by ClickHouse: (rollout, pattern keys), its event id standing
    in for its evidence; or ('invalid', id, reason)."""
    for path in paths:
        with client.query_rows_stream(f"""SELECT event_id, run_id, step, task_id, rollout_index, group_size,
                score, actions.name FROM file({quote_path(path)}, 'Avro') ORDER BY _row_number""") as rows:
            for row in rows:
                try:
                    r = make_rollout(*row, row[0])
                except InvalidEvent as exc:
                    yield "invalid", row[0], str(exc)
                    continue
                yield r, pattern_keys(r.names, pattern_length)


def fastavro_rollouts(paths: list[Path], limits: EvidenceLimits, pattern_length: int, workers: int) -> Iterator[tuple]:
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
    from coevolve.services.kafka.consumer import EventConsumer

    consumer = EventConsumer(bootstrap, [topic], service="replay")
    try:
        return consumer.drain(idle_s=idle_s)
    finally:
        consumer.close()


def read_topics(bootstrap: str, idle_s: float = 2.0) -> Iterator[tuple[str, dict]]:
    """Every completed-step event, then every trajectory, from offset zero; stop when idle."""
    from coevolve.services.kafka.topics import STEPS, TRAJECTORIES

    for topic in (STEPS.name, TRAJECTORIES.name):
        items = read_topic(bootstrap, topic, idle_s)
        items.sort(key=lambda d: (d.partition, d.offset))
        for item in items:
            yield item.name, item.event


def topic_files(bootstrap: str, directory: Path) -> list[Path]:
    """The topics' trajectories and completed steps, from offset zero, as Avro log files in `directory`
    (in the order `read_topics` yields them): what the SQL engine reads when the source is the broker."""
    from coevolve.schemas.container import LogWriter

    writer = LogWriter(directory / "topics.avro")
    for name, event in read_topics(bootstrap):
        writer.write(name, event)
    return writer.close()


def split_inputs(paths: Iterable[Path | str]) -> tuple[list[Path], list[Path]]:
    """(trajectory files, completed-step files) among the inputs and the step files beside them."""
    named = [(p, record_name(p)) for p in expand_inputs(paths)]
    return ([p for p, n in named if n == "TrajectoryRecorded"], [p for p, n in named if n == "StepCompleted"])


def file_steps(paths: Iterable[Path]) -> Iterator[dict]:
    """Every completed-step event of the given step files."""
    for path in paths:
        with open(path, "rb") as fh:
            yield from fastavro.reader(fh)


def evidence_of(client, event_ids, source: tuple[str, object], limits: EvidenceLimits) -> dict[str, dict]:
    """Each listed trajectory's evidence, from the archive or the files of `source` (a Source's
    `evidence`); the ids go in a temporary table for the query."""
    ids_table = f"replay_ids_{uuid.uuid4().hex[:8]}"
    client.command(f"CREATE TEMPORARY TABLE {ids_table} (event_id String) ENGINE = Memory")
    try:
        insert_rows(client, ids_table, ([i] for i in sorted(event_ids)))
        return _evidence(client, ids_table, source, limits)
    finally:
        client.command(f"DROP TEMPORARY TABLE IF EXISTS {ids_table}")


def _evidence(client, ids_table: str, source: tuple[str, object], limits: EvidenceLimits) -> dict[str, dict]:
    """Each trajectory in `ids_table`, shaped and truncated as streams.rules.rollout_of does."""
    kind, where = source
    oc, ac, na = limits.observation_chars, limits.arguments_chars, limits.max_actions
    wanted = f"event_id IN (SELECT event_id FROM {ids_table})"
    out: dict[str, dict] = {}
    if kind == "archive":
        db = where
        for eid, task, idx, score in client.query(f"""SELECT event_id, task_id, rollout_index, score
                FROM {db}.trajectories FINAL WHERE {wanted}""").result_rows:
            out[eid] = {"event_id": eid, "task_id": task, "rollout_index": idx, "score": float(score), "actions": []}
        for eid, name, args, obs in client.query(f"""SELECT event_id, name, substringUTF8(arguments, 1, {ac}),
                substringUTF8(observation, 1, {oc}) FROM {db}.actions FINAL
                WHERE {wanted} AND position < {na} ORDER BY event_id, position""").result_rows:
            out[eid]["actions"].append({"name": name, "arguments": args, "observation": obs})
        return out
    for path in where:
        rows = client.query(f"""SELECT event_id, task_id, rollout_index, score, arrayMap(a -> (a.name,
                substringUTF8(a.arguments, 1, {ac}), substringUTF8(a.observation, 1, {oc})), arraySlice(actions, 1, {na}))
                FROM file({quote_path(path)}, 'Avro') WHERE {wanted} AND isFinite(score) AND group_size >= 1
                ORDER BY _row_number""").result_rows
        for eid, task, idx, score, acts in rows:
            out.setdefault(eid, {"event_id": eid, "task_id": task, "rollout_index": idx, "score": float(score),
                                 "actions": [{"name": a[0], "arguments": a[1], "observation": a[2]} for a in acts]})
    return out
