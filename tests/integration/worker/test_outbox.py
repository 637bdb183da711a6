"""``Outbox``: a batch's records go out as whole producer batches and land where ``Delivered`` says.

Snapshots name their log record's offset from :class:`agentlog.worker.batch.Delivered`, so the
offset (base offset + index in the batch) must be the record's real one, also when a batch fills
up and a second one is started; and a keyed record must land on the partition ``producer.send``
would have chosen, or a run's outputs would leave its partition.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agentlog.streams.admin import ensure_topics
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import topic_name
from agentlog.worker.batch import Outbox

pytestmark = [pytest.mark.kafka]


def test_records_land_at_the_offsets_and_partitions_reported(settings):
    settings = settings.replace(partitions=3)

    async def scenario():
        await ensure_topics(settings)
        topic = topic_name(settings, "log")
        # Small batches: 200 records of ~100 bytes need several, so the "batch full" path runs too.
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True,
                                    max_batch_size=4096, linger_ms=1000)
        await producer.start()
        try:
            # One record through the ordinary per-record path first: the partitioner's reference.
            reference = await (await producer.send(topic, b"r", key=b"run-7"))
            outbox = Outbox(producer, {})
            sent = []
            acked: dict[tuple[int, int], bytes] = {}
            unasked = []
            for i in range(200):
                key = f"run-{i % 11}".encode()
                value = f"value-{i:04d}-".encode() + b"x" * 80
                partition = await outbox.partition_for(topic, key)
                if i % 3 == 2:  # a record nobody asks about: no future, no callback
                    assert await outbox.add(topic, partition, key, value) is None
                    unasked.append((key, value, partition))
                    continue
                on_acked = (lambda p, o, v: acked.__setitem__((p, o), v)) if i % 2 else None
                fut = await outbox.add(topic, partition, key, value, want=True, on_acked=on_acked)
                sent.append((key, value, partition, fut, on_acked is not None))
            assert await outbox.partition_for(topic, b"run-7") == reference.partition
            started = asyncio.get_running_loop().time()
            await outbox.flush()
            await outbox.wait()
            # Closed batches do not wait out the producer's linger (1 s here).
            assert asyncio.get_running_loop().time() - started < 0.9
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False)
        await consumer.start()
        try:
            parts = [TopicPartition(topic, p) for p in range(3)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            found = {}
            while len(found) < 201:
                for tp, messages in (await consumer.getmany(timeout_ms=1000)).items():
                    for m in messages:
                        found[(tp.partition, m.offset)] = (m.key, m.value)
        finally:
            await consumer.stop()
        for key, value, partition, fut, noted in sent:
            delivered = fut.result()
            assert (delivered.topic, delivered.partition) == (topic, partition)
            assert found[(delivered.partition, delivered.offset)] == (key, value)
            if noted:  # on_acked saw the same place and value
                assert acked.pop((delivered.partition, delivered.offset)) == value
        assert not acked
        landed = sorted((p, k, v) for (p, _), (k, v) in found.items())
        for key, value, partition in unasked:  # the unasked records landed too, on their key's partition
            assert (partition, key, value) in landed

    asyncio.run(scenario())
