"""The real broker behaves like Kafka: idempotent produce, compaction, time index.

These are the guarantees the rest of agentlog leans on (the sequencer's idempotent producer,
the compacted snapshot topic, replay's offset-for-time lookup); if the local broker got one of
them wrong, every higher test would fail for the wrong reason.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

pytestmark = pytest.mark.kafka


async def _create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config or {})])
    finally:
        await admin.close()


async def _read_all(bootstrap: str, topic: str, partition: int = 0) -> list:
    """Every record currently in the partition, from the log start to the end offset."""
    tp = TopicPartition(topic, partition)
    # auto_offset_reset="earliest": with aiokafka's default ("latest") the reset that assign()
    # schedules can land after an explicit seek_to_beginning and silently skip the records.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False,
        isolation_level="read_committed", auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        records = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=2000)
            records.extend(batch.get(tp, []))
        return records
    finally:
        await consumer.stop()


def test_idempotent_produce_then_consume(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.smoke"

    async def scenario() -> list:
        await _create_topic(kafka_bootstrap, topic)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
        await producer.start()
        try:
            for i in range(50):
                await producer.send(topic, key=b"run-1", value=f"event-{i}".encode())
            await producer.flush()
        finally:
            await producer.stop()
        return await _read_all(kafka_bootstrap, topic)

    records = asyncio.run(scenario())
    assert [r.value for r in records] == [f"event-{i}".encode() for i in range(50)]
    assert [r.offset for r in records] == list(range(50))
    assert {r.key for r in records} == {b"run-1"}


def test_compacted_topic_keeps_only_the_latest_value_per_key(kafka_bootstrap: str, topic_prefix: str) -> None:
    """The snapshot topic relies on the log cleaner really running, not just on the config being accepted."""
    topic = f"{topic_prefix}.compacted"
    keys = [f"run-{k}".encode() for k in range(5)]
    versions = 20

    async def scenario() -> dict[bytes, list[bytes]]:
        await _create_topic(kafka_bootstrap, topic, config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
            "min.compaction.lag.ms": "0",
        })
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
        await producer.start()
        try:
            for v in range(versions):
                for key in keys:
                    await producer.send(topic, key=key, value=f"v{v}".encode())
            await producer.flush()
            # The cleaner never touches the active segment: keep appending a filler record so the
            # segment holding our versions rolls (segment.ms=100) and becomes cleanable.
            deadline = time.monotonic() + 90
            while True:
                await producer.send_and_wait(topic, key=b"filler", value=b"x")
                seen: dict[bytes, list[bytes]] = {}
                for r in await _read_all(kafka_bootstrap, topic):
                    seen.setdefault(r.key, []).append(r.value)
                if all(len(seen.get(k, [])) == 1 for k in keys) or time.monotonic() > deadline:
                    return seen
                await asyncio.sleep(1)
        finally:
            await producer.stop()

    seen = asyncio.run(scenario())
    assert {k: seen.get(k) for k in keys} == {k: [f"v{versions - 1}".encode()] for k in keys}, (
        "the log cleaner did not compact the topic within 90 s"
    )


def test_offsets_for_times_finds_the_first_offset_at_or_after_a_timestamp(kafka_bootstrap: str, topic_prefix: str) -> None:
    """Replay's ``--from-time`` resolves to an offset through the broker's time index."""
    topic = f"{topic_prefix}.times"
    t0 = 1_700_000_000_000
    stamps = [t0 + 10 * i for i in range(10)]  # t0, t0+10, ..., t0+90 (ms)

    async def scenario() -> dict[int, int | None]:
        # Infinite retention, as our log topics have: records stamped in 2023 are past the broker's
        # default 7 days, so its retention check (every few minutes) could delete them mid-test.
        await _create_topic(kafka_bootstrap, topic, config={"retention.ms": "-1"})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
        await producer.start()
        try:
            for i, ts in enumerate(stamps):
                await producer.send_and_wait(topic, key=b"r", value=str(i).encode(), timestamp_ms=ts)
        finally:
            await producer.stop()
        tp = TopicPartition(topic, 0)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
        await consumer.start()
        try:
            answers = {}
            for query in (t0 - 1_000, t0, t0 + 15, t0 + 20, t0 + 90, t0 + 91):
                found = (await consumer.offsets_for_times({tp: query}))[tp]
                answers[query] = None if found is None else found.offset
            return answers
        finally:
            await consumer.stop()

    answers = asyncio.run(scenario())
    assert answers == {
        t0 - 1_000: 0,  # before everything: the first record
        t0: 0,  # exact hit
        t0 + 15: 2,  # between records: the next one (t0+20 is offset 2)
        t0 + 20: 2,
        t0 + 90: 9,  # the last record
        t0 + 91: None,  # after everything: nothing
    }
