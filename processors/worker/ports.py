"""The ports the worker's agents are typed against: what they need of the process that runs them and of Kafka.

Every agent reaches the outside world through the :class:`~agentlog.worker.wiring.Wiring` it is handed, whose
parts are these protocols. Two implementations exist: the worker's (:mod:`agentlog.worker.app`: the Faust app
runs the tasks and timers, its producer sends) and memory (:mod:`agentlog.worker.memory`: the unit tests build
the agents on it, without a broker). The records an agent reads and writes go through its runtime's log
(:mod:`agentlog.worker.txlog`), not through these.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

#: Separates a table key's group from the rest (``runId␟eventId``): keys of one group are read by prefix.
GROUP_SEP = "\x1f"

#: ``on_acked(partition, offset, value)``: called once a record is durable (``value``: its bytes, None for a
#: tombstone).
Acked = Callable[[int, int, Any], None]


class Partition(Hashable, Protocol):
    """A topic partition (aiokafka's ``TopicPartition``): a dictionary key."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record an agent handles: where it was read, its raw value and its raw key."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes
    key: bytes | None = None


class Topic(Protocol):
    """One of the worker's topics, by its full name."""

    def get_topic_name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class NamedTopic:
    """A :class:`Topic` that is its name."""

    name: str

    def get_topic_name(self) -> str:
        return self.name


class Producer(Protocol):
    """The worker's one producer outside the agents' transactions (acks=all, idempotent)."""

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None) -> Awaitable[Any]:
        """Send one record (``partition`` None: the key's); await the result to know it is durable."""
        ...


#: A task or a timer's tick.
TaskFn = Callable[[], Awaitable[None]]


class Runner(Protocol):
    """What runs the tasks and timers for as long as the worker runs (the Faust app)."""

    def task(self, fn: TaskFn) -> None:
        """Run ``fn`` once the worker starts; it is cancelled when the worker stops."""
        ...

    def timer(self, interval: float, fn: TaskFn) -> None:
        """Run ``fn`` every ``interval`` seconds while the worker runs."""
        ...
