"""``in_order``: a record beyond the expected offset makes the agent read the skipped hole first.

The hole is read from a real broker (:class:`agentlog.worker.positions.BrokerBackfill`); the
consumer's view and the rest of the wiring are the in-memory ports (a consumer that has committed nothing).
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from agentlog.streams.admin import ensure_topics
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import topic_name
from agentlog.worker.batch import in_order
from agentlog.worker.memory import MemoryMessage, memory_wiring
from agentlog.worker.positions import BrokerBackfill, PartitionStarts

pytestmark = [pytest.mark.kafka]


class _Batch:
    """What ``in_order`` uses of a batch: its wiring and positions (none in its tables yet)."""

    def __init__(self, settings, partition_starts=None) -> None:
        self.wiring = memory_wiring(settings)
        self.wiring.backfill = BrokerBackfill(settings, partition_starts)
        self.advanced_to: dict[tuple[str, str, int], int] = {}

    def advanced(self, table, topic, partition, position):
        self.advanced_to[(table, topic, partition)] = position

    def position(self, table, topic, partition):
        return self.advanced_to.get((table, topic, partition))


async def _ingest_with(settings, n: int) -> str:
    """The ingest topic holding records ``v0``..``v{n-1}`` at offsets 0..n-1 of partition 0."""
    await ensure_topics(settings)
    topic = topic_name(settings, "ingest")
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for i in range(n):
            await (await producer.send(topic, f"v{i}".encode(), partition=0))
    finally:
        await producer.stop()
    return topic


def test_skipped_offsets_are_read_and_handled_first(settings):
    settings = settings.replace(partitions=1)

    async def scenario():
        topic = await _ingest_with(settings, 10)
        batch = _Batch(settings)
        seen: list[tuple[int, bytes]] = []

        async def handle(_batch, record):
            seen.append((record.offset, record.value))

        def msg(offset):
            return MemoryMessage(topic, 0, offset, 1.0)

        await in_order(batch, "heads", msg(0), b"v0", handle)
        await in_order(batch, "heads", msg(1), b"v1", handle)
        await in_order(batch, "heads", msg(6), b"v6", handle)  # the consumer skipped 2..5
        await in_order(batch, "heads", msg(3), b"v3", handle)  # a redelivery: handled, position kept
        assert seen == [(0, b"v0"), (1, b"v1"), (2, b"v2"), (3, b"v3"), (4, b"v4"), (5, b"v5"), (6, b"v6"), (3, b"v3")]
        assert batch.position("heads", topic, 0) == 7
        # What the group may commit once the batch is durable: everything below 7 (the redelivery moves nothing back).
        assert batch.advanced_to == {("heads", topic, 0): 7}

    asyncio.run(scenario())


@pytest.mark.parametrize("long_lived", [False, True], ids=["reader-per-lookup", "worker-partition-starts"])
def test_a_first_record_beyond_the_partition_start_is_a_hole_too(settings, long_lived):
    """No position yet: the consumer skipped even the first records (seen: offset 0 of a fresh partition).

    Where the partition starts comes from a reader's own consumer, or (the worker) from its one
    long-lived :class:`PartitionStarts` consumer.
    """
    settings = settings.replace(partitions=1)

    async def scenario():
        topic = await _ingest_with(settings, 5)
        starts = PartitionStarts(settings) if long_lived else None
        batch = _Batch(settings, starts)
        seen: list[int] = []

        async def handle(_batch, record):
            seen.append(record.offset)

        await in_order(batch, "heads", MemoryMessage(topic, 0, 3, 1.0), b"v3", handle)
        assert seen == [0, 1, 2, 3]
        assert batch.position("heads", topic, 0) == 4
        assert batch.advanced_to == {("heads", topic, 0): 4}
        if starts is not None:
            assert await starts.first_offset(topic, 0) == 0  # asked again: the same started consumer answers
            await starts.stop()

    asyncio.run(scenario())
