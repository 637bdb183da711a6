"""The log the transactional runtime writes and reads: records and consumed positions appended atomically.

This is the storage-level port of the sequencer's runtime (:mod:`agentlog.worker.txruntime`), shaped like a log,
not like a stream framework's consumer:

- a :class:`Writer` owns one input partition; :meth:`Writer.transaction` opens a :class:`Transaction` into which
  records of any topic are sent and the input position is noted, and on a clean exit the records and the position
  become visible together, or (an exception, a crash, a fence) none of them ever does;
- :meth:`RecordLog.read` reads a partition's committed records from an offset up to its end (what a restore of
  state from its changelog's tail reads);
- :meth:`RecordLog.position` is the input position the last committed transaction of a partition noted.

A partition has one writer at a time: opening a writer for it fences the previous one, whose next
commit raises :class:`Fenced` (a zombie — a member SIGSTOPped past its session, a process the group
replaced — can write nothing after that). On Kafka that is the broker's own transaction protocol:
one transactional id per input partition (:class:`KafkaLog`; aiokafka's ``send_offsets_to_transaction``
takes a group id, not a member's group metadata, so the id per partition is what fences a member that
lost the partition). :class:`MemoryLog` is the in-memory twin the unit tests run the runtime on; one
contract suite (``tests/contract/txlog.py``) runs against both.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Generator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, InvalidProducerEpoch, ProducerFenced
from aiokafka.partitioner import murmur2

from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings

#: A partition of a topic, as :meth:`RecordLog.read` names what it reads.
Where = tuple[str, int]

#: The longest a fetch of :meth:`KafkaLog.read` waits at the broker (a read ends at the end offsets it took first).
READ_WAIT_MS = 100

#: How long a writer leaves between a commit and its next transaction. The broker acknowledges a commit before it has
#: written the transaction's markers, and refuses the next transaction's first request until they are written
#: (CONCURRENT_TRANSACTIONS, KAFKA-5477), which aiokafka retries 20 ms later. The markers take about a millisecond on a
#: local broker: a transaction begun at once after a commit took 22 ms, one begun 1 ms after it under 3 ms; publish →
#: log p95 / p99 at 1k ev/s 24 / 37 ms without the pause, 4 / 12 ms with it (both with a 5 ms retry backoff,
#: tests/bench/JOURNAL.md).
MARKERS_S = 0.002

#: The transactional producer's retry backoff (aiokafka's default is 100 ms). The broker answers transactions running
#: side by side with retriable errors now and then (TxnOffsetCommit: COORDINATOR_NOT_AVAILABLE; a produce not yet
#: verified in its transaction: NOT_ENOUGH_REPLICAS), each a backoff long: with 100 ms, publish → log p99 at 1k ev/s
#: was 199-203 ms; with 10 ms, 17 ms (tests/bench/JOURNAL.md).
RETRY_BACKOFF_MS = 10


class Fenced(Exception):
    """A writer's partition has a newer writer: this transaction is aborted and nothing it sent is ever read."""


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a record sent in a transaction lands (valid once the transaction commits)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One committed record as :meth:`RecordLog.read` returns it."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


class Transaction(Protocol):
    """One transaction of a :class:`Writer`: records of any topic, and the input position they complete."""

    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   partition: int | None = None) -> Awaitable[Appended]:
        """Queue a record (``partition`` None: the key's, by the default partitioner); await the result for where."""
        ...

    def consumed(self, topic: str, partition: int, position: int) -> None:
        """Note that every record of ``topic[partition]`` below ``position`` is handled once this commits."""
        ...


class Writer(Protocol):
    """The one writer of an input partition (its transactions fence every earlier writer of that partition)."""

    def transaction(self) -> Any:
        """An async context manager yielding a :class:`Transaction`: committed on exit, aborted on an exception.

        Raises:
            Fenced: a newer writer of the partition exists (at commit, or at any send).
        """
        ...

    async def close(self) -> None: ...


class RecordLog(Protocol):
    """Writers per input partition, committed reads, and the positions transactions committed."""

    async def writer(self, partition: int) -> Writer:
        """The writer of input ``partition``, fencing any earlier one (its open transaction is aborted)."""
        ...

    async def read(self, starts: Mapping[Where, int]) -> dict[Where, list[LogRecord]]:
        """The committed records of each ``(topic, partition)`` from its offset in ``starts`` to its end now.

        The end is the partition's last stable offset: records of a transaction still open are not read (once
        a writer is open, no earlier transaction of its partition is: what a restore after acquiring reads).
        """
        ...

    async def position(self, topic: str, partition: int) -> int | None:
        """The input position of ``topic[partition]`` the last committed transaction noted (None: none yet)."""
        ...

    async def close(self) -> None: ...


#: ``murmur2(key) & 0x7FFFFFFF`` (the producer's default partitioner's hash) of recent keys: it is Python, ~6 µs a
#: key, and a run's key comes back with each of its events, to every topic it sends to.
_KEY_HASHES: dict[bytes, int] = {}
#: Keys remembered at most (cleared when full: a worker's runs in flight are far fewer).
_KEY_HASHES_MAX = 16384


def _key_hash(key: bytes) -> int:
    """The partition of ``key`` is this modulo the partition count (the default partitioner's choice)."""
    hashed = _KEY_HASHES.get(key)
    if hashed is None:
        if len(_KEY_HASHES) >= _KEY_HASHES_MAX:
            _KEY_HASHES.clear()
        hashed = _KEY_HASHES[key] = murmur2(key) & 0x7FFFFFFF
    return hashed


# -- in memory -------------------------------------------------------------------------------------------------


@dataclass
class _Held:
    records: list[tuple[LogRecord, bool]] = field(default_factory=list)  # (record, committed)


class _MemoryTransaction:
    def __init__(self, log: MemoryLog, epoch: int, input_partition: int) -> None:
        self._log, self._epoch, self._input = log, epoch, input_partition
        self.records: list[tuple[str, int, LogRecord]] = []
        self.positions: dict[tuple[str, int], int] = {}

    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   partition: int | None = None) -> Awaitable[Appended]:
        self._log.check(self._input, self._epoch)
        part = self._log.partition_of(topic, key) if partition is None else partition
        held = self._log.held(topic, part)
        offset = len(held.records)  # a record takes its offset now, as on a broker; aborted, it is never read
        rec = LogRecord(offset, 0, key, value)
        held.records.append((rec, False))
        self.records.append((topic, part, rec))
        done: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        done.set_result(Appended(topic, part, offset))
        return done

    def consumed(self, topic: str, partition: int, position: int) -> None:
        self.positions[(topic, partition)] = position


class _MemoryWriter:
    def __init__(self, log: MemoryLog, partition: int, epoch: int) -> None:
        self._log, self._partition, self._epoch = log, partition, epoch

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_MemoryTransaction]:
        tx = _MemoryTransaction(self._log, self._epoch, self._partition)
        yield tx
        self._log.check(self._partition, self._epoch)
        for topic, part, rec in tx.records:
            held = self._log.held(topic, part)
            held.records[rec.offset] = (rec, True)
        self._log.positions.update(tx.positions)

    async def close(self) -> None:
        pass


class MemoryLog:
    """The :class:`RecordLog` port in memory: uncommitted records take offsets but are never read."""

    def __init__(self, partitions: int = 1) -> None:
        self._partitions = partitions
        self._topics: dict[tuple[str, int], _Held] = {}
        self._epochs: dict[int, int] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self._members: dict[str, MemoryLog] = {}

    def member(self, group: str) -> MemoryLog:
        """The same records and positions, written by ``group``'s writers (an agent's transactional ids): one view
        per group, so two workers on this log taking one partition of a group fence each other, as on Kafka."""
        view = self._members.get(group)
        if view is None:
            view = self._members[group] = MemoryLog(self._partitions)
            view._topics, view.positions, view._members = self._topics, self.positions, self._members
        return view

    def append(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None) -> Appended:
        """One record written outside any transaction (what the worker's own producer sends): committed at once."""
        part = self.partition_of(topic, key) if partition is None else partition
        held = self.held(topic, part)
        rec = LogRecord(len(held.records), 0, key, value)
        held.records.append((rec, True))
        return Appended(topic, part, rec.offset)

    def values(self, topic: str, partition: int | None = None) -> list[bytes | None]:
        """The committed values of ``topic`` (of one partition, or of every one in partition order)."""
        parts = [partition] if partition is not None else sorted(p for t, p in self._topics if t == topic)
        return [rec.value for p in parts for rec in self.committed(topic, p)]

    def committed(self, topic: str, partition: int, start: int = 0) -> list[LogRecord]:
        """The committed records of ``topic[partition]`` from offset ``start`` on (an offset is a record's index)."""
        return [rec for rec, committed in self.held(topic, partition).records[start:] if committed]

    def held(self, topic: str, partition: int) -> _Held:
        return self._topics.setdefault((topic, partition), _Held())

    def partition_of(self, topic: str, key: bytes | None) -> int:
        return 0 if key is None else _key_hash(key) % self._partitions

    def check(self, partition: int, epoch: int) -> None:
        if self._epochs.get(partition) != epoch:
            raise Fenced(f"input partition {partition} has a newer writer")

    async def writer(self, partition: int) -> _MemoryWriter:
        epoch = self._epochs[partition] = self._epochs.get(partition, 0) + 1
        return _MemoryWriter(self, partition, epoch)

    async def read(self, starts: Mapping[Where, int]) -> dict[Where, list[LogRecord]]:
        return {where: self.committed(*where, start) for where, start in starts.items()}

    async def position(self, topic: str, partition: int) -> int | None:
        return self.positions.get((topic, partition))

    async def close(self) -> None:
        pass


# -- on Kafka --------------------------------------------------------------------------------------------------


#: What a producer raises once its transaction is over under it: the broker fenced it (a newer writer of the
#: partition), or its epoch is stale; a send after the producer learnt either (its transaction manager has left the
#: transaction) is refused as an illegal operation. Each leaves nothing of the transaction committed.
_ENDED = (ProducerFenced, InvalidProducerEpoch, IllegalOperation)


class _Open:
    """One topic-partition's batch of a transaction: filled, then handed to the producer whole."""

    __slots__ = ("builder", "sent")

    def __init__(self, builder: Any) -> None:
        self.builder = builder
        self.sent: asyncio.Future[Any] | None = None  # the batch's delivery, once handed over


class _KafkaTransaction:
    """A transaction's records, appended per topic-partition to one producer batch each (aiokafka's
    ``create_batch`` / ``send_batch``), handed over when full, when someone awaits where a record landed, or at
    commit.

    ``producer.send`` per record costs a serialisation, a partitioner call (murmur2 in Python) and a lookup of
    the partition's open batch per record; here a record is one ``append`` to a batch that is already at hand. A
    key goes to the partition the producer's default partitioner would choose, so a run's records stay in its
    partition.
    """

    def __init__(self, producer: AIOKafkaProducer, partitions: dict[str, list[int]]) -> None:
        self._producer = producer
        self._partitions = partitions  # topic -> its partitions, sorted (shared by the writer's transactions)
        self._open: dict[Where, _Open] = {}
        self._sent: list[asyncio.Future[Any]] = []  # the deliveries of the batches handed over
        self.positions: dict[TopicPartition, int] = {}

    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   partition: int | None = None) -> Awaitable[Appended]:
        if partition is None:
            partition = await self._partition_of(topic, key)
        where = (topic, partition)
        batch = self._open.get(where)
        if batch is None:
            batch = self._open[where] = _Open(self._producer.create_batch())
        meta = batch.builder.append(key=key, value=value, timestamp=None)
        if meta is None:  # the batch is full: hand it over and start the next one
            await self._hand_over(where)
            batch = self._open[where] = _Open(self._producer.create_batch())
            meta = batch.builder.append(key=key, value=value, timestamp=None)
            if meta is None:
                raise ValueError(f"a record of {len(value or b'')} bytes does not fit in one producer batch of {topic}")
        return _Landing(self, where, batch, meta.offset)

    async def _partition_of(self, topic: str, key: bytes | None) -> int:
        parts = self._partitions.get(topic)
        if parts is None:
            parts = self._partitions[topic] = sorted(await self._producer.partitions_for(topic))
        if key is None:
            return random.choice(parts)
        return parts[_key_hash(key) % len(parts)]

    async def _hand_over(self, where: Where) -> None:
        batch = self._open.pop(where)
        batch.builder.close()
        try:
            batch.sent = await self._producer.send_batch(batch.builder, where[0], partition=where[1])
        except _ENDED as e:
            raise Fenced(str(e)) from e
        self._sent.append(batch.sent)

    async def landed(self, where: Where, batch: _Open, index: int) -> Appended:
        if batch.sent is None and self._open.get(where) is batch:
            await self._hand_over(where)
        assert batch.sent is not None
        try:
            meta = await batch.sent
        except _ENDED as e:
            raise Fenced(str(e)) from e
        return Appended(where[0], where[1], meta.offset + index)

    async def flush(self) -> None:
        """Hand every open batch over and wait until the broker has them all, before the offsets join the transaction.

        A partition leader checks each produce of a transaction with the coordinator (KIP-890, for a client on
        aiokafka's protocol versions); while the coordinator writes a state change of that transaction
        (AddOffsetsToTxn sent beside the produce) it answers CONCURRENT_TRANSACTIONS, which the leader returns as
        NOT_ENOUGH_REPLICAS: a retry one backoff later. One writer, transactions of 5 records over 4 partitions:
        with the offsets sent beside the records 45 of 120 retried (p50 / p90 5.0 / 17 ms a transaction), with the
        records acknowledged first none did (3.8 / 5.1 ms; tests/bench/JOURNAL.md).
        """
        for where in list(self._open):
            await self._hand_over(where)
        try:
            await asyncio.gather(*self._sent)
        except _ENDED as e:
            raise Fenced(str(e)) from e

    def consumed(self, topic: str, partition: int, position: int) -> None:
        self.positions[TopicPartition(topic, partition)] = position


class _Landing:
    """Where a record sent in a transaction lands once its batch is acknowledged (awaitable; free if never awaited:
    awaiting it hands its batch over)."""

    __slots__ = ("_batch", "_index", "_tx", "_where")

    def __init__(self, tx: _KafkaTransaction, where: Where, batch: _Open, index: int) -> None:
        self._tx, self._where, self._batch, self._index = tx, where, batch, index

    def __await__(self) -> Generator[Any, None, Appended]:
        return self._tx.landed(self._where, self._batch, self._index).__await__()


class _KafkaWriter:
    def __init__(self, producer: AIOKafkaProducer, group: str) -> None:
        self._producer, self._group = producer, group
        self._partitions: dict[str, list[int]] = {}
        self._ended = 0.0  # loop time of the last commit or abort

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_KafkaTransaction]:
        producer = self._producer
        loop = asyncio.get_running_loop()
        wait = self._ended + MARKERS_S - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            async with producer.transaction():
                tx = _KafkaTransaction(producer, self._partitions)
                yield tx
                await tx.flush()
                if tx.positions:
                    await producer.send_offsets_to_transaction(tx.positions, self._group)
        except _ENDED as e:
            raise Fenced(str(e)) from e
        finally:
            self._ended = loop.time()

    async def close(self) -> None:
        await self._producer.stop()


class KafkaLog:
    """The :class:`RecordLog` port on Kafka transactions (aiokafka's public API only).

    ``name`` names the writers' transactional ids (``<name>-<partition>``); ``group`` is the consumer
    group whose committed offsets the transactions advance (the input's consumer group).
    """

    def __init__(self, settings: Settings, *, name: str, group: str) -> None:
        self._settings, self._name, self._group = settings, name, group

    async def writer(self, partition: int) -> _KafkaWriter:
        producer = AIOKafkaProducer(**client_kwargs(self._settings), transactional_id=f"{self._name}-{partition}",
                                    enable_idempotence=True, acks="all", linger_ms=5, max_batch_size=1 << 20,
                                    retry_backoff_ms=RETRY_BACKOFF_MS)
        await producer.start()  # init_transactions: the broker fences the id's earlier producer, aborts its open one
        return _KafkaWriter(producer, self._group)

    async def read(self, starts: Mapping[Where, int]) -> dict[Where, list[LogRecord]]:
        out: dict[Where, list[LogRecord]] = {where: [] for where in starts}
        if not starts:
            return out
        consumer = AIOKafkaConsumer(**client_kwargs(self._settings), group_id=None, enable_auto_commit=False,
                                    isolation_level="read_committed", fetch_max_wait_ms=READ_WAIT_MS)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, partition) for topic, partition in starts]
            consumer.assign(tps)
            begins, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
            pending = set()
            for tp in tps:
                consumer.seek(tp, first := max(starts[(tp.topic, tp.partition)], begins[tp]))
                if first < ends[tp]:
                    pending.add(tp)
            while pending:
                got = await consumer.getmany(*pending, timeout_ms=READ_WAIT_MS)
                for tp, messages in got.items():
                    out[(tp.topic, tp.partition)].extend(LogRecord(m.offset, m.timestamp, m.key, m.value)
                                                         for m in messages if m.offset < ends[tp])
                # The position passes commit markers too, so it reaches the end with or without a record there.
                pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
            return out
        finally:
            await consumer.stop()

    async def position(self, topic: str, partition: int) -> int | None:
        tp = TopicPartition(topic, partition)
        consumer = AIOKafkaConsumer(**client_kwargs(self._settings), group_id=self._group, enable_auto_commit=False,
                                    isolation_level="read_committed")
        await consumer.start()
        try:
            committed: int | None = await consumer.committed(tp)
            return committed
        finally:
            await consumer.stop()

    async def close(self) -> None:
        pass

