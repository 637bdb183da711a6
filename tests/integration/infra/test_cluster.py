"""Three KRaft nodes on loopback: writes with acks=all survive the loss of one broker.

This is the substrate of the fault suite: ``stop_node``/``start_node`` must really take a broker
away and bring it back, and the cluster must be configured so that losing one of three is
survivable (replication 3, min.insync.replicas 2) while losing two is not silently accepted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentlog.infra.kafka import local
from agentlog.streams.settings import load_settings
from tests.tools import free_port_range

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow]




async def _topic_replication(bootstrap: str, topic: str) -> tuple[int, str]:
    """(replica count, min.insync.replicas) of a topic the broker created with its own defaults."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = (await admin.describe_topics([topic]))[0]
        response = (await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)]))[0]
        entries = {entry[0]: entry[1] for entry in response.resources[0][4]}
        return len(described["partitions"][0]["replicas"]), entries["min.insync.replicas"]
    finally:
        await admin.close()


async def _send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                request_timeout_ms=30_000)
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(topic, key=b"k", value=v)
    finally:
        await producer.stop()


async def _values(bootstrap: str, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[bytes] = []
        while await consumer.position(tp) < end:
            out.extend(r.value for r in (await consumer.getmany(tp, timeout_ms=2000)).get(tp, []))
        return out
    finally:
        await consumer.stop()


def test_three_nodes_survive_one_broker_down(tmp_path: Path) -> None:
    base = free_port_range(6)
    settings = load_settings(home=tmp_path, kafka_bootstrap=f"127.0.0.1:{base}")
    try:
        nodes = local.start(settings, nodes=3)
        assert [(n.port, n.controller_port) for n in nodes] == [(base + i, base + 3 + i) for i in range(3)]
        assert all(n.alive and n.started for n in nodes)
        bootstrap = local.bootstrap_servers(nodes)

        # The first send auto-creates the topic with the cluster defaults under test.
        asyncio.run(_send(bootstrap, "replicated", [b"before"]))
        assert asyncio.run(_topic_replication(bootstrap, "replicated")) == (3, "2")

        down = local.stop_node(settings, 2)
        assert not down.alive
        assert [n.alive for n in local.status(settings)] == [True, True, False]
        asyncio.run(_send(bootstrap, "replicated", [b"during"]))  # ISR 2 of 3 >= min.insync 2

        back = local.start_node(settings, 2)
        assert back.alive and back.started
        asyncio.run(_send(bootstrap, "replicated", [b"after"]))
        assert asyncio.run(_values(f"127.0.0.1:{base + 2}", "replicated")) == [b"before", b"during", b"after"]
    finally:
        local.stop(settings, purge=True)
    assert not any(n.alive for n in local.status(settings))
