"""The ports the worker's runtime and agents are typed against: what they need of a stream framework and Kafka.

The batch runtime (:mod:`.batch`, :mod:`.positions`, :mod:`.fence`) and every agent reach the outside
world only through the :class:`~agentlog.worker.wiring.Wiring` they are handed, whose parts are
these protocols and :class:`agentlog.worker.tables.Table`. Two implementations exist: Faust and
aiokafka (:mod:`agentlog.worker.app` builds them; every private attribute they touch is in
:mod:`agentlog.streams.internals`) and memory (:mod:`agentlog.worker.memory`: the unit tests run the
runtime and the agents on it, without a broker).

Records are not adapted: Faust's events and messages already have the shape of :class:`Event` and
:class:`Message`, so the per-record path reads them as it always did, with no call per record.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Hashable, Sequence
from typing import Any, Protocol


class Partition(Hashable, Protocol):
    """A topic partition (aiokafka's ``TopicPartition``, Faust's ``TP``): a dictionary key."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


class Message(Protocol):
    """Where a delivered record was read (Faust's ``Message``)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> float | None:
        """Seconds since the epoch."""

    @property
    def key(self) -> bytes | None:
        """The record's key as the broker holds it (the agents read their topics' keys raw)."""

    @property
    def tp(self) -> Partition: ...


class Event(Protocol):
    """One delivered record (Faust's ``Event``): its raw value and where it was read."""

    @property
    def value(self) -> Any: ...

    @property
    def message(self) -> Message: ...


class Stream(Protocol):
    """A source of record batches: the records of an agent's topic, in ticks (Faust's ``Stream``)."""

    def take_events(self, max_events: int, within: float) -> AsyncIterator[Sequence[Event]]:
        """Ticks of at most ``max_events`` records, each handed over at most ``within`` seconds after it began."""
        ...


class Topic(Protocol):
    """One of the worker's topics (Faust's ``Topic``)."""

    def get_topic_name(self) -> str: ...


class Source(Protocol):
    """The group's consumer as the runtime sees it: what it was assigned, how far it read, where it is sent back.

    Offsets are "next offset" positions unless a method says otherwise; None: not known (yet).
    """

    def assignment(self) -> Collection[Partition]:
        """The partitions this member holds now."""
        ...

    def highwater(self, tp: Partition) -> int | None:
        """The broker's high watermark of ``tp`` as of the last fetch."""
        ...

    def committed(self, tp: Partition) -> int | None:
        """The offset the group last committed for ``tp``."""
        ...

    def read_offset(self, tp: Partition) -> int | None:
        """The offset of the last record of ``tp`` handed to the agents' streams."""
        ...

    def fetch_position(self, tp: Partition) -> int | None:
        """The offset of ``tp`` the client hands the consumer next (every record below it has been fetched)."""
        ...

    def forget_acks(self, tp: Partition) -> None:
        """Drop the consumer's own acknowledgement bookkeeping for ``tp`` (positions decide commits)."""
        ...

    async def seek(self, tp: Partition, offset: int) -> None:
        """Deliver ``tp`` again from ``offset``."""
        ...


class Backfill(Protocol):
    """Records read again straight from the broker, past the consumer (:func:`agentlog.worker.batch.in_order`)."""

    async def first_offset(self, topic: str, partition: int) -> int:
        """The offset of the first record ``topic[partition]`` still holds."""
        ...

    async def read(self, topic: str, partition: int, start: int,
                   end: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
        """The records ``start <= offset < end`` of ``topic[partition]``: ``(offset, timestamp_ms, key, value)``."""
        ...


class Membership(Protocol):
    """This member of the consumer group: whether the group is settling, and the generation it is in."""

    def settling(self) -> bool:
        """Whether the group rebalances or the tables recover: no batch starts, nothing is healed or committed."""
        ...

    @property
    def generation(self) -> int:
        """The group generation this member last joined (a position made durable in it is tagged with it)."""
        ...


class Delivery(Protocol):
    """Where the broker put a batch: the offset of its first record."""

    @property
    def offset(self) -> int: ...


class BatchBuilder(Protocol):
    """One producer batch of one topic-partition being filled (aiokafka's ``BatchBuilder``)."""

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: float | None) -> Delivery | None:
        """Add a record; returns its index in the batch (``.offset``), or None when the batch is full."""
        ...

    def close(self) -> None: ...


class BatchProducer(Protocol):
    """Whole batches to one partition at a time (aiokafka's producer, under Faust's)."""

    def create_batch(self) -> BatchBuilder: ...

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[Delivery]:
        """Hand a closed batch over; await the result to know the broker has acknowledged it."""
        ...

    async def partitions_for(self, topic: str) -> Collection[int]: ...


class Producer(Protocol):
    """The worker's one producer (acks=all, idempotent)."""

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None) -> Awaitable[Any]:
        """Send one record (``partition`` None: the key's); await the result to know it is durable."""
        ...

    def batches(self) -> BatchProducer:
        """The same client, taking whole batches (what a :class:`~agentlog.worker.batch.Batch` sends through)."""
        ...


#: What an agent runs: the records of its topic, until the worker stops.
AgentFn = Callable[[Stream], Awaitable[None]]
#: A task or a timer's tick.
TaskFn = Callable[[], Awaitable[None]]


class Runner(Protocol):
    """What runs the agents, tasks and timers for as long as the worker runs (the Faust app)."""

    def topic(self, name: str) -> Topic:
        """Declare a topic of raw bytes (keys and values) by its full name."""
        ...

    def agent(self, topic: Topic, name: str, fn: AgentFn) -> None:
        """Run ``fn`` on ``topic``'s records, one instance per worker (concurrency 1)."""
        ...

    def task(self, fn: TaskFn) -> None:
        """Run ``fn`` once the worker starts; it is cancelled when the worker stops."""
        ...

    def timer(self, interval: float, fn: TaskFn) -> None:
        """Run ``fn`` every ``interval`` seconds while the worker runs."""
        ...


class Agents(Protocol):
    """Where agents of the worker run: the Faust batch loop, or each its own loop of Kafka transactions.

    ``table`` makes (and registers in the wiring) a table by name; ``agent`` runs ``handle`` per record of topic
    ``short`` (``before_commit`` / ``after_commit`` once per batch) and returns whose partitions it holds (a
    :class:`agentlog.worker.fence.Fence`: ``partitions(topic)``).
    """

    def table(self, name: str) -> Any: ...

    def agent(self, short: str, *, name: str, table: str, handle: Callable[[Any, Any], Awaitable[None]],
              before_commit: Callable[[Any], Awaitable[None]] | None = None,
              after_commit: Callable[[Any], Awaitable[None]] | None = None) -> Any: ...
