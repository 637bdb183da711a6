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
