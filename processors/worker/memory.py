"""The worker's ports in memory: the runtime and every agent run on them without a broker.

What a unit test drives, and what it reads back:

* :class:`MemoryStream` takes ticks of :class:`MemoryEvent` s (what Faust's stream hands an agent);
* :class:`MemoryProducer` keeps what is sent in a :class:`MemoryBroker`, acknowledging the batches
  handed over within one turn of the event loop together on the next one, as one produce response
  would (or when :meth:`MemoryProducer.release` says so, with ``hold``), and
  refuses the topics named in ``refuse``; :attr:`MemoryProducer.log` is every record and every
  acknowledgement in order;
* :class:`MemorySource` is the consumer's view (assignment, high watermarks, committed and read
  offsets, seeks), :class:`MemoryMembership` the group (``rebalancing``, ``generation``);
* :class:`MemoryRunner` keeps the agents, tasks and timers the code registers, to be run by hand;
* the tables are :class:`agentlog.worker.tables.MemoryTable`.

:func:`memory_wiring` puts them together into a :class:`~agentlog.worker.wiring.Wiring`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiokafka.partitioner import murmur2

from agentlog.core.keyring import LocalKek
from agentlog.core.redaction import Redactor
from agentlog.streams.keyring import Keyring
from agentlog.streams.redaction import load_redactor
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from agentlog.worker.ports import AgentFn, BatchBuilder, Delivery, Event, Partition, TaskFn, Topic
from agentlog.worker.positions import DurablePositions
from agentlog.worker.tables import MemoryTable, Table
from agentlog.worker.wiring import Wiring


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MemoryMessage:
    topic: str
    partition: int
    offset: int
    timestamp: float | None = 0.0
    key: bytes | None = None

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    value: Any
    message: MemoryMessage


def event(topic: str, partition: int, offset: int, value: Any = b"", timestamp: float | None = 0.0,
          key: bytes | None = None) -> MemoryEvent:
    """One delivered record."""
    return MemoryEvent(value, MemoryMessage(topic, partition, offset, timestamp, key))


_END = object()


class MemoryStream:
    """An agent's records: the ticks :meth:`put` (or given here), in order, until :meth:`close`.

    ``pace_s``: each tick is handed over this long after it is asked for (records arriving at that pace).
    """

    def __init__(self, *ticks: Sequence[Event], pace_s: float = 0.0) -> None:
        self._ticks: asyncio.Queue[Any] = asyncio.Queue()
        self._pace_s = pace_s
        for tick in ticks:
            self.put(tick)

    def put(self, tick: Sequence[Event]) -> None:
        self._ticks.put_nowait(list(tick))

    def close(self) -> None:
        """The stream ends once the ticks before this are taken (the agent returns)."""
        self._ticks.put_nowait(_END)

    def take_events(self, max_events: int, within: float) -> AsyncIterator[Sequence[Event]]:
        async def ticks() -> AsyncIterator[Sequence[Event]]:
            while True:
                if self._pace_s > 0:
                    await asyncio.sleep(self._pace_s)
                tick = await self._ticks.get()
                if tick is _END:
                    return
                yield tick

        return ticks()


@dataclass(frozen=True)
class MemoryTopic:
    name: str

    def get_topic_name(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Stored:
    """A record the broker holds."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0


class MemoryBroker:
    """Topic partitions as lists of records (the offset is the index), readable again (the ``Backfill`` port)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], list[Stored]] = {}

    def append(self, topic: str, partition: int, records: Iterable[Stored]) -> int:
        """Store ``records`` at the end of ``topic[partition]``; returns the offset of the first."""
        held = self.records.setdefault((topic, partition), [])
        base = len(held)
        held.extend(records)
        return base

    def values(self, topic: str, partition: int | None = None) -> list[bytes | None]:
        """The values ``topic`` holds (of one partition, or of every partition, partition by partition)."""
        return [r.value for (t, p), held in sorted(self.records.items()) if t == topic and partition in (None, p)
                for r in held]

    async def first_offset(self, topic: str, partition: int) -> int:
        return 0

    async def read(self, topic: str, partition: int, start: int,
                   end: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
        held = self.records.get((topic, partition), [])
        return [(offset, held[offset].timestamp_ms, held[offset].key, held[offset].value)
                for offset in range(start, min(end, len(held)))]


@dataclass(frozen=True, slots=True)
class _Delivery:
    offset: int


class MemoryBatch:
    """One producer batch (the ``BatchBuilder`` port); full at ``capacity`` records."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.records: list[Stored] = []
        self.closed = False

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: float | None) -> _Delivery | None:
        if self.closed:
            raise RuntimeError("append to a closed batch")
        if len(self.records) >= self.capacity:
            return None
        self.records.append(Stored(key, value, int((timestamp or 0) * 1000)))
        return _Delivery(len(self.records) - 1)

    def close(self) -> None:
        self.closed = True


class Refused(Exception):
    """The in-memory broker refused a batch (its topic is in :attr:`MemoryProducer.refuse`)."""


class MemoryProducer:
    """The ``Producer`` and ``BatchProducer`` ports over a :class:`MemoryBroker`.

    Batches are stored and acknowledged in the order sent, never within the call that sends them: those
    handed over within one turn of the event loop together, on the next turn (aiokafka resolves the
    batches of one produce response one after the other, before any task waiting for them runs); with
    ``hold``, only when :meth:`release` is called. A batch of a topic in :attr:`refuse` fails with
    :class:`Refused` and is not stored. :attr:`log` holds
    ``("sent", topic, partition, key, value)`` per record handed over and ``("acked", topic, partition)``
    per batch acknowledged, in order.
    """

    def __init__(self, broker: MemoryBroker | None = None, *, partitions: int = 1, hold: bool = False,
                 batch_capacity: int = 1 << 20) -> None:
        self.broker = broker if broker is not None else MemoryBroker()
        self.partitions = partitions
        self.hold = hold
        self.batch_capacity = batch_capacity
        self.refuse: set[str] = set()
        self.log: list[tuple[Any, ...]] = []
        self._held: list[tuple[asyncio.Future[Delivery], str, int, list[Stored]]] = []
        self._acking: list[tuple[asyncio.Future[Delivery], str, int, list[Stored]]] = []

    def batches(self) -> MemoryProducer:
        return self

    def create_batch(self) -> MemoryBatch:
        return MemoryBatch(self.batch_capacity)

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[Delivery]:
        assert isinstance(batch, MemoryBatch)
        records = list(batch.records)
        for r in records:
            self.log.append(("sent", topic, partition, r.key, r.value))
        fut: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        entry = (fut, topic, partition, records)
        if self.hold:
            self._held.append(entry)
        else:
            if not self._acking:
                asyncio.get_running_loop().call_soon(self._acknowledge_waiting)
            self._acking.append(entry)
        return fut

    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   partition: int | None) -> Awaitable[Delivery]:
        if partition is None:
            partition = (murmur2(key) & 0x7FFFFFFF) % self.partitions if key is not None else 0
        batch = self.create_batch()
        batch.append(key=key, value=value, timestamp=None)
        batch.close()
        return await self.send_batch(batch, topic, partition=partition)

    def lines(self, strip: str = "") -> list[str]:
        """:attr:`log` as text: ``write <topic> <key>=<value>`` and ``acked <topic>[<partition>]``.

        ``strip``: a prefix taken off topic names (``"<topic_prefix>."``).
        """

        def text(raw: bytes | None) -> str:
            return "None" if raw is None else raw.decode("utf-8", "replace")

        out = []
        for kind, topic, partition, *record in self.log:
            name = topic[len(strip):] if strip and topic.startswith(strip) else topic
            out.append(f"write {name} {text(record[0])}={text(record[1])}" if kind == "sent"
                       else f"acked {name}[{partition}]")
        return out

    def release(self) -> int:
        """Acknowledge (or refuse) every batch held so far, in the order sent; returns how many."""
        held, self._held = self._held, []
        for entry in held:
            self._acknowledge(*entry)
        return len(held)

    def _acknowledge_waiting(self) -> None:
        acking, self._acking = self._acking, []
        for entry in acking:
            self._acknowledge(*entry)

    def _acknowledge(self, fut: asyncio.Future[Delivery], topic: str, partition: int, records: list[Stored]) -> None:
        if fut.done():
            return
        if topic in self.refuse:
            fut.set_exception(Refused(f"the broker refused a batch of {topic}[{partition}]"))
            return
        base = self.broker.append(topic, partition, records)
        self.log.append(("acked", topic, partition))
        fut.set_result(_Delivery(base))


@dataclass
class MemorySource:
    """The consumer's view (the ``Source`` port), every number set by the test; seeks are recorded."""

    assigned: set[Partition] = field(default_factory=set)
    highwaters: dict[Partition, int] = field(default_factory=dict)
    committed_offsets: dict[Partition, int] = field(default_factory=dict)
    read_offsets: dict[Partition, int] = field(default_factory=dict)
    fetch_positions: dict[Partition, int] = field(default_factory=dict)
    #: The consumer's own acknowledgement bookkeeping, per partition (dropped by :meth:`forget_acks`).
    acks: dict[Partition, Any] = field(default_factory=dict)
    sought: list[tuple[Partition, int]] = field(default_factory=list)

    def assignment(self) -> set[Partition]:
        return set(self.assigned)

    def highwater(self, tp: Partition) -> int | None:
        return self.highwaters.get(tp)

    def committed(self, tp: Partition) -> int | None:
        return self.committed_offsets.get(tp)

    def read_offset(self, tp: Partition) -> int | None:
        return self.read_offsets.get(tp)

    def fetch_position(self, tp: Partition) -> int | None:
        return self.fetch_positions.get(tp)

    def forget_acks(self, tp: Partition) -> None:
        self.acks.pop(tp, None)

    async def seek(self, tp: Partition, offset: int) -> None:
        self.sought.append((tp, offset))


@dataclass
class MemoryMembership:
    """The group (the ``Membership`` port): set ``rebalancing`` and ``generation`` as a rebalance would."""

    rebalancing: bool = False
    generation: int = 1

    def settling(self) -> bool:
        return self.rebalancing


class MemoryRunner:
    """Keeps what the code registers (the ``Runner`` port); a test runs it by hand."""

    def __init__(self) -> None:
        self.agents: dict[str, tuple[Topic, AgentFn]] = {}
        self.tasks: list[TaskFn] = []
        self.timers: list[tuple[float, TaskFn]] = []

    def topic(self, name: str) -> MemoryTopic:
        return MemoryTopic(name)

    def agent(self, topic: Topic, name: str, fn: AgentFn) -> None:
        self.agents[name] = (topic, fn)

    def task(self, fn: TaskFn) -> None:
        self.tasks.append(fn)

    def timer(self, interval: float, fn: TaskFn) -> None:
        self.timers.append((interval, fn))


#: The topics :func:`memory_wiring` declares (the worker's own, as :func:`agentlog.worker.app.build_app` does).
TOPICS = ("ingest", "log", "transitions", "violations", "rejections", "snapshots", "verdicts", "handoff-links",
          "checkpoints", "keyring")


def memory_wiring(settings: Settings | None = None, *, tables: Iterable[str] = (), partitions: int = 1,
                  hold: bool = False, redactor: Redactor | None = None) -> Wiring:
    """A :class:`Wiring` on the in-memory ports: the worker's topics, ``tables`` as :class:`MemoryTable` s.

    The sequencer redacts as a worker with these settings does (:func:`agentlog.streams.redaction.load_redactor`:
    the default policy unless ``settings.redaction_policy`` names one), or with ``redactor``.

    The parts are reached through the wiring with their memory types (``wiring.producer`` is a
    :class:`MemoryProducer`, and so on): :func:`parts` gives them typed.
    """
    settings = settings or Settings()
    runner = MemoryRunner()
    broker = MemoryBroker()
    made: dict[str, Table] = {name: MemoryTable(name) for name in tables}
    kek = LocalKek(os.urandom(32))  # a key-encryption key of this wiring's life only
    ready = asyncio.Event()
    ready.set()
    return Wiring(
        settings=settings,
        runner=runner,
        producer=MemoryProducer(broker, partitions=partitions, hold=hold),
        source=MemorySource(),
        membership=MemoryMembership(),
        backfill=broker,
        topics={short: runner.topic(topic_name(settings, short)) for short in TOPICS},
        tables=made,
        positions=DurablePositions(),
        make_table=MemoryTable,
        keyring=Keyring(kek, {kek.kek_id: kek}),
        keyring_ready=ready,
        redactor=redactor if redactor is not None else load_redactor(settings),
    )


@dataclass(frozen=True)
class Parts:
    producer: MemoryProducer
    broker: MemoryBroker
    source: MemorySource
    membership: MemoryMembership
    runner: MemoryRunner


def parts(wiring: Wiring) -> Parts:
    """The in-memory ports of a :func:`memory_wiring`, typed as such."""
    producer, source, membership, runner = wiring.producer, wiring.source, wiring.membership, wiring.runner
    assert isinstance(producer, MemoryProducer) and isinstance(source, MemorySource)
    assert isinstance(membership, MemoryMembership) and isinstance(runner, MemoryRunner)
    return Parts(producer, producer.broker, source, membership, runner)


__all__ = ["MemoryBroker", "MemoryEvent", "MemoryMembership", "MemoryMessage", "MemoryProducer",
           "MemoryRunner", "MemorySource", "MemoryStream", "MemoryTable", "MemoryTopic", "Refused", "Stored",
           "TopicPartition", "event", "memory_wiring", "parts"]
