"""What the worker's consumer group commits: the slowest agent's durable position.

Faust commits the highest offset below which every delivered message was
acknowledged by every stream. That bookkeeping is wrong for us in both
directions once the consumer has been restarted a few times:

* it never commits past a record it did not deliver — and after SIGKILL
  restarts Faust's consumer was seen to skip records (which :func:`in_order`
  then reads around it), so the committed offset stayed below such a hole for
  good: processing complete, consumer lag stuck (fault suite, 10 rapid kills);
* acknowledging the hole ourselves would let one agent's progress commit past
  another agent on the same topic (the run-state processor and the audit sink
  both read ``log``), so "the group is drained" would not mean "ClickHouse
  holds everything".

Every agent already keeps, in its own table, the next offset it has durably
handled per source partition (the outputs and the table write acknowledged
by the broker). So the offset to commit for a partition is simply the minimum
of those positions over the agents that consume its topic; the Faust
consumer's ``_filter_committable_offsets`` is replaced by that. The committed
offset is then only where a restarted consumer starts reading: a position
recovered lower than it is healed by :func:`agentlog.worker.batch.in_order`, and a
commit never runs ahead of any agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from agentlog.metrics import METRICS, Sample
from agentlog.schemas.errors import InfraError
from agentlog.streams import internals
from agentlog.streams.reader import fetch_range
from agentlog.streams.reader import first_offset as reader_first_offset
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.worker.ports import Membership, Partition, Source

log = logging.getLogger("agentlog.positions")

#: How long :class:`PartitionStarts`' consumer waits before it retries a look-up. Its first look-up of a
#: topic always fails once: it holds no metadata for the topic yet, so aiokafka fetches it and retries after
#: this back-off (the retry waits for that metadata anyway); aiokafka's 100 ms default would be spent
#: inside a partition's first batch.
LOOKUP_RETRY_BACKOFF_MS = 10

#: Generations of :meth:`DurablePositions.holding` kept (a few hours of rebalances at most).
_HELD_GENERATIONS = 64


class DurablePositions:
    """Per (table, topic, partition): the next offset the agent owning the table has made durable."""

    def __init__(self) -> None:
        self._tables_by_topic: dict[str, list[str]] = {}
        self._positions: dict[tuple[str, str, int], tuple[int, Any]] = {}
        #: generation -> the (topic, partition)s this worker was seen holding in it (by the commit filter)
        self._held: dict[Any, set[tuple[str, int]]] = {}

    def holding(self, generation: Any, tps: Iterable[Partition]) -> None:
        """Note the partitions this worker holds in ``generation`` (seen outside a rebalance)."""
        self._held.setdefault(generation, set()).update((tp.topic, tp.partition) for tp in tps)
        while len(self._held) > _HELD_GENERATIONS:  # generations arrive in order: drop the first seen
            self._held.pop(next(iter(self._held)))

    def _held_since(self, topic: str, partition: int, since: Any, generation: Any) -> bool:
        """True if this worker held the partition in every generation after ``since`` up to ``generation``.

        Then nobody else can have handled it in between (a partition changes hands only at a
        generation boundary), so a position made durable in ``since`` still holds now (three
        workers, a batch made durable while a rebalance goes by, then no more records on that
        partition: without this its commit would wait for a record that never comes).
        """
        if not (isinstance(since, int) and isinstance(generation, int)) or not since < generation:
            return False
        return all((topic, partition) in self._held.get(g, ()) for g in range(since + 1, generation + 1))

    def topics(self) -> set[str]:
        """The topics some agent declared it reads (:meth:`consumes`)."""
        return set(self._tables_by_topic)

    def tables_for(self, topic: str) -> list[str]:
        """The tables of the agents that read ``topic`` (where each keeps its position)."""
        return list(self._tables_by_topic.get(topic, ()))

    def consumes(self, topic: str, table: str) -> None:
        """Declare that the agent keeping its positions in ``table`` reads ``topic`` (before start)."""
        tables = self._tables_by_topic.setdefault(topic, [])
        if table not in tables:
            tables.append(table)

    def advance(self, table: str, topic: str, partition: int, position: int, generation: Any) -> None:
        key = (table, topic, partition)
        held = self._positions.get(key)
        if held is None or held[1] != generation or position > held[0]:
            self._positions[key] = (position, generation)

    def committable(self, topic: str, partition: int, generation: Any) -> int | None:
        """The offset every agent reading ``topic`` has durably passed in this generation, if known.

        Positions made durable under an earlier consumer generation do not count: the partition may
        have been revoked in between and handled further by another worker.
        """
        tables = self._tables_by_topic.get(topic)
        if not tables:
            return None
        offsets = []
        for table in tables:
            held = self._positions.get((table, topic, partition))
            if held is None or (held[1] != generation and not self._held_since(topic, partition, held[1], generation)):
                return None
            offsets.append(held[0])
        return min(offsets)

    def series(self) -> Iterator[Sample]:
        """``agentlog_durable_position`` gauge samples, for :meth:`agentlog.metrics.Metrics.add_collector`."""
        for (table, topic, partition), (position, _) in list(self._positions.items()):
            yield "agentlog_durable_position", {"topic": topic, "partition": str(partition), "table": table}, position

    def offsets_to_commit(self, source: Source, generation: Any) -> dict[Partition, int]:
        """For each assigned partition, the new committable offset if it is past the committed one."""
        out: dict[Partition, int] = {}
        assigned = source.assignment()
        self.holding(generation, assigned)
        for tp in assigned:
            offset = self.committable(tp.topic, tp.partition, generation)
            if offset is None:
                continue
            committed = source.committed(tp)
            if committed is None or offset > committed:
                out[tp] = offset
            source.forget_acks(tp)
        return out


def install(app: Any, positions: DurablePositions, source: Source, membership: Membership) -> None:
    """Make the Faust app's consumer (``source``) commit the agents' durable positions instead of its own acks.

    Nothing is committed while Faust rebalances or recovers tables: positions from before
    the rebalance may describe partitions this worker no longer holds.
    """

    def make_filter(consumer: Any) -> internals.CommitFilter:
        def committable(_tps: Any) -> dict[Partition, int]:
            if membership.settling():
                return {}
            return positions.offsets_to_commit(source, membership.generation)

        return committable

    internals.replace_commit_filter(app, make_filter)
    internals.on_flow_queues_cleared(app, lambda first: _reread_dropped(source, positions, first))


def _reread_dropped(source: Source, positions: DurablePositions, first: dict[Partition, int]) -> None:
    """Seek the agents' partitions back to the first record Faust dropped when it resumed flow.

    See :func:`agentlog.streams.internals.on_flow_queues_cleared`. The records from there on are delivered
    again; any the agent had already taken are redeliveries, which it treats as done.
    """
    topics = positions.topics()
    ours = {tp: offset for tp, offset in first.items() if tp.topic in topics}
    if ours:
        task = asyncio.ensure_future(_seek_back(source, ours))
        _SEEKS.add(task)
        task.add_done_callback(_SEEKS.discard)


#: Seek-back tasks in flight (held so they are not collected before they finish).
_SEEKS: set[asyncio.Future[None]] = set()


async def _seek_back(source: Source, first: dict[Partition, int]) -> None:
    assigned = source.assignment()
    for tp, offset in sorted(first.items()):
        if tp not in assigned:
            continue
        log.warning("%s partition %d: Faust dropped fetched records from offset %d when it resumed after a "
                    "rebalance; reading them again", tp.topic, tp.partition, offset)
        METRICS.inc("agentlog_dropped_records_reread_total", topic=tp.topic)
        try:
            await source.seek(tp, offset)
        except Exception:  # the next record beyond the hole still heals it (batch.in_order)
            log.exception("%s partition %d: seeking back to offset %d failed", tp.topic, tp.partition, offset)


class PartitionStarts:
    """Log start offsets of source partitions, from one group-less consumer started with the worker.

    An agent asks where a partition starts when it holds no position for it and the group has
    committed nothing (:func:`agentlog.worker.batch.in_order`). Starting a consumer per look-up
    cost a connection, a bootstrap and an all-topics metadata response each time (on a broker with
    thousands of topics, seconds); this one is started once, tracks only the topics asked about
    (its first look-up of a topic fetches that topic's metadata, and its refreshes name only those),
    and is asked one ListOffsets request per look-up.
    Faust's own consumer was tried first (``Consumer.earliest_offsets``): its thread answered the
    first call only after up to 1.5 s.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def start(self, topics: Iterable[str] = ()) -> None:
        """Start the consumer, and have it fetch ``topics``' metadata now rather than in a batch's first look-up."""
        async with self._lock:
            consumer = await self._started()
            firsts = [TopicPartition(topic, 0) for topic in topics]
            if firsts:
                await consumer.beginning_offsets(firsts)

    async def _started(self) -> AIOKafkaConsumer:
        consumer = self._consumer
        if consumer is None:
            consumer = AIOKafkaConsumer(**client_kwargs(self.settings), group_id=None, enable_auto_commit=False,
                                        client_id="agentlog-partition-starts",
                                        retry_backoff_ms=LOOKUP_RETRY_BACKOFF_MS)
            try:
                await consumer.start()
            except BaseException:
                await consumer.stop()
                raise
            self._consumer = consumer
        return consumer

    async def first_offset(self, topic: str, partition: int) -> int:
        """The offset of the first record ``topic[partition]`` still holds."""
        tp = TopicPartition(topic, partition)
        async with self._lock:
            try:
                consumer = await self._started()
                offset: int = (await consumer.beginning_offsets([tp]))[tp]
                return offset
            except KafkaError as e:  # a fresh consumer next time; this look-up has failed
                await self._stop()
                raise InfraError(f"reading the start of {topic}[{partition}] from "
                                 f"{self.settings.kafka_bootstrap} failed: {e}") from e

    async def stop(self) -> None:
        async with self._lock:
            await self._stop()

    async def _stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


class BrokerBackfill:
    """The ``Backfill`` port on Kafka: plain consumers of :mod:`agentlog.streams.reader`, outside the group.

    ``starts``: the worker's :class:`PartitionStarts` once it runs (a look-up otherwise starts a consumer
    of its own, whose bootstrap asks the broker for *every* topic's metadata: on a broker holding thousands
    of topics, seconds of the worker's time inside a partition's first batch).
    """

    def __init__(self, settings: Settings, starts: PartitionStarts | None = None) -> None:
        self.settings = settings
        self.starts = starts

    async def first_offset(self, topic: str, partition: int) -> int:
        if self.starts is not None:
            return await self.starts.first_offset(topic, partition)
        return await reader_first_offset(self.settings, topic, partition)

    async def read(self, topic: str, partition: int, start: int,
                   end: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
        return list(await fetch_range(self.settings, topic, partition, start, end))
