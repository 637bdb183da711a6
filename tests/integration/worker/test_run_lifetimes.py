"""Run lifetimes on a real broker: a finished run is closed after its grace, an idle one expires.

A worker with a 1 s grace and a 6 s idle retention takes a finished run and an unfinished one.
Closing deletes each run's head, index and state: the changelogs carry their tombstones, and the
worker's own RocksDB state (opened after it stops, as a restarted worker would) holds none of
their keys. A later event of either run, a new one or a copy of one already appended, is refused
with the way its run closed (``run_closed`` / ``run_expired``) and the log is left as it was.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import Counter

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentlog.core.runstate import TERMINAL_TYPES
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_topic
from agentlog.streams.security import client_kwargs
from agentlog.worker import txruntime
from agentlog.worker.sequencer import INDEX_SEP
from agentlog.worker.tables import RocksBudget
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


async def _changelog(settings, table: str) -> list[tuple[str, bytes | None]]:
    """Every (key, value) of a table's changelog, in offset order per partition."""
    topic = f"{settings.topic_prefix}-worker-{table}-changelog"
    consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        out: list[tuple[str, bytes | None]] = []
        for _ in range(60):
            # The position, not the last record's offset: a changelog written in transactions ends in a commit
            # marker, which takes an offset and is never a record.
            if all([await consumer.position(tp) >= ends[tp] for tp in parts]):
                break
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out.extend((m.key.decode(), m.value) for m in messages)
        return out
    finally:
        await consumer.stop()


async def _rejections(settings) -> list[dict]:
    return [record async for _, _, _, record in read_topic(settings, "rejections")]


async def _logged(settings) -> list[tuple[str, int]]:
    return [(r["doc"]["runId"], r["doc"]["sequence"]) async for _, _, _, r in read_topic(settings, "log")]


def test_a_finished_run_closes_after_its_grace_an_idle_one_expires_and_later_events_are_refused(settings):
    settings = settings.replace(run_grace_s=1.0, run_idle_s=6.0)
    tag = uuid.uuid4().hex[:6]
    finished = realistic_run(f"done-{tag}")
    assert finished[-1]["type"] in TERMINAL_TYPES
    unfinished = [d for d in realistic_run(f"open-{tag}") if d["type"] not in TERMINAL_TYPES][:6]
    done_id, open_id = finished[0]["runId"], unfinished[0]["runId"]
    worker = WorkerProcess(settings, log_name="lifetimes")

    def late(run: list[dict], tail: str) -> dict:
        doc = copy.deepcopy(run[1])
        doc.update(eventId=f"{doc['runId']}:late-{tail}", sequence=len(run))
        doc.pop("causationId", None)
        return doc

    async def scenario() -> None:
        await ensure_topics(settings)
        assert (await publish_docs(settings, finished + unfinished)).accepted == len(finished) + len(unfinished)
        worker.start()

        async def tombstoned(run_id: str) -> list | None:
            records = await _changelog(settings, "run-state")
            last = {}
            for key, value in records:
                last[key] = value
            return records if f'"{run_id}"' in last and last[f'"{run_id}"'] is None else None

        expected = sorted([(d["runId"], d["sequence"]) for d in finished + unfinished])

        async def all_logged() -> bool | None:
            return sorted(await _logged(settings)) == expected or None

        await wait_until(all_logged, what="both runs in the log", worker=worker, timeout=90)
        await wait_until(lambda: tombstoned(done_id), what="the finished run's record tombstone", worker=worker,
                         timeout=90)
        # Still open: the unfinished run's record has no tombstone yet (its idle retention is 6 s).
        assert await tombstoned(open_id) is None
        await wait_until(lambda: tombstoned(open_id), what="the idle run's record tombstone", worker=worker,
                         timeout=90)

        # Every index entry and the record of both runs: written, then deleted.
        for table, keys in (("seq-index", [f'"{d["runId"]}{INDEX_SEP}{d["eventId"]}"'.replace(INDEX_SEP, "\\u001f")
                                           for d in finished + unfinished]),
                            ("run-state", [f'"{done_id}"', f'"{open_id}"'])):
            last: dict[str, bytes | None] = {}
            for key, value in await _changelog(settings, table):
                last[key] = value
            assert all(key in last and last[key] is None for key in keys), (
                table, [k for k in keys if last.get(k, b"") is not None], sorted(last)[:5])
        markers = {k: v for k, v in await _changelog(settings, "run-closed")}
        assert b'"reason":"completed"' in markers[f'"{done_id}"'] and b'"reason":"expired"' in markers[f'"{open_id}"']

        # Later events: a new one, and a copy of one already appended.
        later = [late(finished, "a"), finished[3], late(unfinished, "b"), unfinished[2]]
        assert (await publish_docs(settings, later)).accepted == len(later)

        async def refused() -> list | None:
            found = [(r["runId"], r["eventId"], r["reason"]) for r in await _rejections(settings)]
            return found if len(found) >= 4 else None

        found = await wait_until(refused, what="the late events refused", worker=worker, timeout=60)
        assert sorted(found) == sorted([(done_id, later[0]["eventId"], "run_closed"),
                                        (done_id, later[1]["eventId"], "run_closed"),
                                        (open_id, later[2]["eventId"], "run_expired"),
                                        (open_id, later[3]["eventId"], "run_expired")])
        assert len(await _logged(settings)) == len(finished) + len(unfinished)  # nothing re-opened

    try:
        asyncio.run(scenario())
    finally:
        worker.stop()

    # The worker's own state on disk, opened as a restarted worker would: none of the two runs' keys.
    tables = _state_tables(settings, worker.state_dir)
    for p in range(settings.partitions):
        for run_id in (done_id, open_id):
            assert tables["runs"].get(p, run_id) is None
            assert list(tables["index"].keys_from(p, run_id + INDEX_SEP)) == []
    assert sum(tables["closed"].get(p, done_id) is not None for p in range(settings.partitions)) == 1


def _state_tables(settings, state_dir) -> dict:
    """The sequencer's tables on disk, read by partition."""
    budget = RocksBudget(8)
    return txruntime.sequencer_tables(settings.replace(state_dir=str(state_dir)), budget.open)


def test_runs_closing_while_the_worker_is_killed_again_and_again_lose_and_duplicate_nothing(settings):
    """SIGKILL the worker while runs finish and close (a 0.5 s grace, 60 s idle) under a stream of realistic runs.

    Every event precedes its run's close request in the run's partition (the worker asks only after
    it handled the terminal event), so whatever the kills interrupt — a close half made durable, a
    request lost before it was sent — every event is in the log, nothing is refused, and in
    the end every run is closed: its head, state and index entries tombstoned, its marker written.
    """
    import random

    from tests.bench.workload import TREE_EVENTS, events

    # The stream ends in the middle of the trees still in flight: those runs never finish, and expire.
    settings = settings.replace(run_grace_s=0.5, run_idle_s=60.0)  # longer than a kill and restart
    tag = uuid.uuid4().hex[:6]
    trees = 120
    stream = list(events(f"kill-{tag}", trees * TREE_EVENTS, concurrent=20))
    runs = {run_id for run_id, _ in stream}
    rng = random.Random(5)
    worker = WorkerProcess(settings, log_name="lifetimes-kills")

    async def publish_chunk(chunk: list[tuple[str, bytes]]) -> None:
        from aiokafka import AIOKafkaProducer

        from agentlog.streams.topics import topic_name

        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True)
        await producer.start()
        try:
            for run_id, value in chunk:
                await producer.send(topic_name(settings, "ingest"), value, key=run_id.encode())
        finally:
            await producer.stop()

    async def logged_at_least(n: int) -> bool | None:
        return len(await _logged(settings)) >= n or None

    async def scenario() -> None:
        await ensure_topics(settings)
        worker.start()
        chunks = [stream[i:i + 400] for i in range(0, len(stream), 400)]
        sent = 0
        for i, chunk in enumerate(chunks):
            await publish_chunk(chunk)
            sent += len(chunk)
            if i % 2 == 1:  # a kill once part of what was sent is handled, at a random point
                await wait_until(lambda s=sent: logged_at_least(s - rng.randrange(50, 350)), what="progress",
                                 worker=worker, timeout=120)
                worker.kill()
                worker.start()

        async def all_closed() -> bool | None:
            last: dict[str, bytes | None] = {}
            for key, value in await _changelog(settings, "run-state"):
                last[key] = value
            open_runs = sorted(r for r in runs if last.get(f'"{r}"', b"") is not None)
            return not open_runs or None

        await wait_until(all_closed, what="every run closed", worker=worker, timeout=180)
        copies = Counter(await _logged(settings))
        assert set(copies) == {(json_doc["runId"], json_doc["sequence"]) for json_doc in
                               (orjson.loads(v) for _, v in stream)}
        assert await _rejections(settings) == []
        markers = {k for k, v in await _changelog(settings, "run-closed") if v is not None}
        assert markers == {f'"{r}"' for r in runs}
        for table in ("run-state", "seq-index"):
            last: dict[str, bytes | None] = {}
            for key, value in await _changelog(settings, table):
                last[key] = value
            assert all(v is None for k, v in last.items() if not k.startswith('"\\u0000')), table

    try:
        asyncio.run(scenario())
    finally:
        worker.stop()
    assert worker.starts > 3
