"""Kafka record shapes for sink tests without a broker: what the sink reads of aiokafka's
``ConsumerRecord`` and ``TopicPartition`` (frozen, so a partition can key the sink's dicts)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int
    value: bytes | None
    key: bytes | None = None


@dataclass(frozen=True)
class Partition:
    topic: str
    partition: int
