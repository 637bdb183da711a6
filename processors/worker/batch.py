"""The one loop every agent runs: take a batch, heal skipped offsets, send outputs, then write tables.

Every agent consumes with concurrency 1 (more can commit past in-flight messages)
and ``take_events`` batches, and every batch follows the same order: compute
outputs with pure functions, send them, **wait for the broker to acknowledge
them**, and only then write the tables. Faust sends table changelog records
immediately (not at commit), so writing the table first would let a crash leave
a table that is ahead of its outputs; a redelivered record would then look
"already done" and its outputs would be lost. Outputs-then-tables makes every
crash window a redelivery of records whose outputs are byte-identical, and
readers dedup by (runId, sequence) or position.

Table writes are awaited too, and only then does the batch's position become
committable (:mod:`agentlog.worker.positions`: the group commits the slowest
agent's durable position, not Faust's ack bookkeeping). Faust's own pre-commit
flush can miss a changelog record that is between its send buffer and the
client, so committing on its acks could leave a committed source offset whose
table write never reached the broker — the next record of that run would then
look like a gap. Tables are made durable in the stages of :data:`TABLE_STAGES`:
the sequencer's eventId index before its run records (head and state), so a head
never runs ahead of the index it is checked against (a record behind the index is
folded again when its records are redelivered).

Changelog records are written to the *source record's* partition explicitly
(:meth:`Batch._put`), so table partitions stay co-partitioned with the topics by runId.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.partitioner import DefaultPartitioner, murmur2

from agentlog.metrics import METRICS
from agentlog.worker.fence import Fence, Fenced
from agentlog.worker.ports import BatchProducer, Event, Message, Partition, Source, Stream
from agentlog.worker.tables import Table, encode
from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.worker")

#: The clock batch slices are timed with (a name so a test can drive it).
loop_clock = time.perf_counter

# How an agent takes batches (:func:`_adaptive`, the one loop). The stream is taken in ticks; a tick
# that had to be waited for and brought fewer than BATCH_IDLE_EVENTS records means the agent keeps up,
# so it is handled at once (latency about one tick). Busier ticks pile up into one batch (under load:
# fewer table records and acknowledgement round trips per event), closed by the first of BATCH_MAX
# records, BATCH_WITHIN_S after its first tick, or BATCH_QUIET_S without a tick (a burst ended).
#: 5 ms: a trickle waits at most this long to be taken; shorter only spins the loop.
BATCH_TICK_S = 0.005
#: 16: a waited-for tick this small is a trickle, handled at once (the latency and throughput measured
#: with it: tests/bench/JOURNAL.md, "Adaptive batches"). 0: no tick is handled at once, every batch piles up.
BATCH_IDLE_EVENTS = 16
#: The largest batch: its table writes and outputs are one round of acknowledgements.
BATCH_MAX = 5000
#: The longest a pile of busy ticks waits to fill up (latency under load).
BATCH_WITHIN_S = 0.2
#: Under load ticks come every 5 ms, so 20 ms without one means a burst ended: handle it now. 0: only the window.
BATCH_QUIET_S = 0.020
#: A batch yields to the event loop after this much handling, so Faust keeps taking records out of
#: aiokafka's buffer (records left there over its 100 ms prefetch backoff drop out of the next fetch). 0: never.
BATCH_SLICE_S = 0.020
#: Every this often each partition an agent reads is compared with the broker's high watermark: one
#: holding records beyond the agent's position that made no progress over a whole interval is read
#: again (Faust was seen to drop fetched records without delivering them: :func:`heal_stalled`). 0: off.
STALL_CHECK_S = 5.0


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record an agent handles: where it was read, its raw value and its raw key."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes
    key: bytes | None = None


@dataclass(frozen=True, slots=True)
class Delivered:
    """Where the broker put one record (what ``await batch.send(...)`` gives once acknowledged)."""

    topic: str
    partition: int
    offset: int


#: ``on_acked(partition, offset, value)``: called once a record is acknowledged (:meth:`Outbox.add`).
#: (``value`` is the record's bytes, None for a tombstone.)
Acked = Callable[[int, int, Any], None]

#: A table key's and value's changelog bytes (:func:`agentlog.worker.tables.encode`; None: a tombstone).
Encoded = tuple[bytes, bytes | None]


class Outbox:
    """A batch's records, grouped per topic-partition into whole aiokafka batches sent without linger.

    Faust's per-record ``producer.send`` cost about a fifth of the worker's busy time (a py-spy
    profile, tests/bench/JOURNAL.md "Hot paths"), and every record waited out the producer's linger (5 ms) before
    its request left, once for the outputs and once per table: four lingers per batch at low load.
    Here :meth:`add` only appends to the open ``BatchBuilder`` of the record's topic-partition,
    and :meth:`flush` closes every open builder and hands it to the producer whole
    (``send_batch``): a closed batch is sent at once, one produce request per partition. A
    record's offset is the batch's base offset (from the broker) plus its index in the batch, which
    is what :class:`Delivered` reports (snapshots name their log record's offset).

    Keys go to partitions as the producer's own default partitioner puts them (murmur2 of the key,
    random for no key), so a record lands where ``producer.send`` would have put it.

    Records of the ``first`` topics (the keyring) are acknowledged before any other record of the batch is
    handed over: a log record sealed under a new data key never becomes durable without that key's record.
    """

    def __init__(self, producer: BatchProducer, partition_counts: dict[str, list[int]],
                 first: frozenset[str] = frozenset()) -> None:
        self._producer = producer
        self._first = first
        self._first_sent: list[asyncio.Future[Any]] = []
        self._partitions = partition_counts  # topic -> its partitions (shared: counts never change)
        # Per open topic-partition: its BatchBuilder and the records someone asked about
        # (index in the batch, future or None, value, on_acked or None).
        self._open: dict[tuple[str, int], tuple[Any, list[tuple[int, Any, bytes | None, Acked | None]]]] = {}
        self.sent: list[asyncio.Future[Any]] = []
        #: The acknowledgement callbacks of the batches handed over with records someone asked about.
        self._resolving: list[tuple[asyncio.Future[Any], Callable[[asyncio.Future[Any]], None]]] = []

    def chosen(self, topic: str, key: bytes | None) -> int | None:
        """The partition of ``key`` when no look-up is needed (None: ask :meth:`partition_for`)."""
        parts = self._partitions.get(topic)
        if key is None or parts is None:
            return None
        hashed = _KEY_HASHES.get(key)
        return parts[(hashed if hashed is not None else _key_hash(key)) % len(parts)]

    async def partition_for(self, topic: str, key: bytes | None) -> int:
        parts = self._partitions.get(topic)
        if parts is None:
            parts = self._partitions[topic] = sorted(await self._producer.partitions_for(topic))
        if key is None:
            return int(_PARTITIONER(key, parts, parts))
        return parts[_key_hash(key) % len(parts)]

    async def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None, *, want: bool = False,
                  on_acked: Acked | None = None) -> asyncio.Future[Delivered] | None:
        """Append one record to its topic-partition's open batch.

        With ``want``, a future that resolves to where the record landed once it is acknowledged;
        ``on_acked(partition, offset, value)`` is called then (in the batch's acknowledgement
        callback). A record asks for neither by default: a future and its callback per record cost
        ~4% of the worker's main thread, and only a snapshot's log record needs one.
        """
        tp = (topic, partition)
        entry = self._open.get(tp)
        if entry is None:
            entry = self._open[tp] = (self._producer.create_batch(), [])
        meta = entry[0].append(key=key, value=value, timestamp=None)
        if meta is None:  # the open batch is full: hand it over and start the next one
            await self._send(tp)
            entry = self._open[tp] = (self._producer.create_batch(), [])
            meta = entry[0].append(key=key, value=value, timestamp=None)
            if meta is None:
                raise ValueError(f"a record of {len(value or b'')} bytes does not fit in one producer batch of {topic}")
        if not want and on_acked is None:
            return None
        fut: asyncio.Future[Delivered] | None = asyncio.get_running_loop().create_future() if want else None
        entry[1].append((meta.offset, fut, value, on_acked))
        return fut

    async def flush(self) -> None:
        """Hand every open batch to the producer (each is sent at once: closed batches do not linger)."""
        for tp in list(self._open):
            if tp in self._open:  # a barrier may have handed it over already
                await self._send(tp)

    async def _send(self, tp: tuple[str, int]) -> None:
        first = tp[0] in self._first
        if not first and self._first and (self._first_sent or any(t[0] in self._first for t in self._open)):
            await self._barrier()
        builder, records = self._open.pop(tp)
        builder.close()
        sent = await self._producer.send_batch(builder, tp[0], partition=tp[1])
        self.sent.append(sent)
        if first:
            self._first_sent.append(sent)

        if not records:
            return  # nobody asked where these records landed

        def resolve(done: asyncio.Future[Any], topic: str = tp[0], partition: int = tp[1]) -> None:
            if not records:
                return  # resolved already (by :meth:`wait` or by the future's own callback)
            error = asyncio.CancelledError() if done.cancelled() else done.exception()
            base = -1 if error is not None else done.result().offset
            for relative, fut, value, on_acked in records:
                if error is not None:
                    if fut is not None and not fut.done():
                        fut.set_exception(error)
                        fut.exception()  # retrieved: :meth:`wait` raises the batch's error once, not every record's
                    continue
                if on_acked is not None:
                    on_acked(partition, base + relative, value)
                if fut is not None and not fut.done():
                    fut.set_result(Delivered(topic, partition, base + relative))
            records.clear()

        sent.add_done_callback(resolve)
        self._resolving.append((sent, resolve))

    async def _barrier(self) -> None:
        """Hand over the open batches of the ``first`` topics and wait until every one sent is acknowledged."""
        for tp in [t for t in self._open if t[0] in self._first]:
            if tp in self._open:
                await self._send(tp)
        sent, self._first_sent = self._first_sent, []
        for fut in sent:
            await fut

    async def wait(self) -> None:
        """Wait until every batch handed over is acknowledged by the broker (acks=all); raise its error if not.

        Every acknowledged batch's records are resolved (``on_acked`` called) before this returns. Their
        callbacks alone would not do: a future's done callbacks run on a later turn of the event loop, and
        when one produce response acknowledges several batches, the wake-up of this task (waiting for the
        first) is scheduled before the callbacks of the others, so the caller would go on without their
        offsets (a table stage would not mark those partitions as holding their changelog records).
        """
        sent, self.sent = self.sent, []
        resolving, self._resolving = self._resolving, []
        for fut in sent:
            await fut
        for fut, resolve in resolving:
            resolve(fut)


#: The producer's default partitioner (murmur2 of the key; no key: a random available partition).
_PARTITIONER = DefaultPartitioner()

#: ``murmur2(key) & 0x7FFFFFFF`` (the default partitioner's hash) of recent keys: it is Python, ~6 µs
#: a key, and a run's key comes back with each of its events, to every topic it sends to.
_KEY_HASHES: dict[bytes, int] = {}
#: Keys remembered at most (cleared when full: a worker's runs in flight are far fewer).
_KEY_HASHES_MAX = 16384


#: Separates a key's group from the rest (``runId\x1feventId`` in the sequencer's index): :meth:`Batch.keys_from`
#: finds a group's pending writes directly.
GROUP_SEP = "\x1f"


def _key_hash(key: bytes) -> int:
    """The default partitioner's hash of ``key`` (its partition is this modulo the partition count)."""
    hashed = _KEY_HASHES.get(key)
    if hashed is None:
        if len(_KEY_HASHES) >= _KEY_HASHES_MAX:
            _KEY_HASHES.clear()
        hashed = _KEY_HASHES[key] = murmur2(key) & 0x7FFFFFFF
    return hashed


#: The stages in which a batch's table writes are made durable, in order: the tables of one stage are
#: written in one round trip, and a stage is sent once the one before it is acknowledged (a table not
#: named is a stage of its own, after these). ``index`` comes before ``runs`` (a run's head and state): a
#: crash may leave a run record behind its index, which the redelivered records fold again
#: (:mod:`agentlog.worker.sequencer`), never ahead of it, which nothing could repair. A closed run's
#: marker comes first: once it is durable, every record of the run is decided by it, whatever of the
#: run's index and record is deleted yet.
TABLE_STAGES: tuple[tuple[str, ...], ...] = (("closed",), ("index",), ("runs",), ("links",))


class Batch:
    """One batch of an agent (:func:`_adaptive`): outputs go out at once, table writes wait for their acks.

    The one place the module docstring's rule lives: :meth:`commit` awaits every
    output the batch sent, and only then writes the table keys the batch changed
    (to the partition of the record that changed them), stage after stage
    (:data:`TABLE_STAGES`), each table's records as one producer batch per changelog
    partition (:class:`Outbox`). Reads see the batch's own pending writes first, so
    later events of the batch build on earlier ones; an agent's next batch starts once
    this one is durable, so the tables hold everything earlier. ``collected`` is the
    agent's own per-batch scratch list (what its hooks act on).
    """

    def __init__(self, wiring: Wiring, agent: str = "", size: int = 0) -> None:
        self.wiring = wiring
        if agent:
            METRICS.inc("agentlog_batches_total", agent=agent)
            METRICS.inc("agentlog_batch_events_total", size, agent=agent)
        self.collected: list[Any] = []
        self._outbox = Outbox(wiring.producer.batches(), wiring.partition_counts, _first_topics(wiring))
        self._writes: dict[tuple[str, str], tuple[int, Any]] = {}
        #: The keys written of the form ``<group>\x1f<rest>``, by (table, ``<group>\x1f``): what
        #: :meth:`keys_from` adds for such a prefix without walking every write of the batch (a batch of
        #: close requests deletes ~10 index keys per run, and each close lists its run's).
        self._grouped: dict[tuple[str, str], set[str]] = {}
        self._positions: dict[tuple[str, str, int], int] = {}  # (table, topic, partition) -> next offset
        self._generation = wiring.membership.generation
        #: The partition of the record being handled: every key it reads lives there (tables are
        #: co-partitioned with their source topic), so :meth:`get` looks there.
        self.partition = -1

    def get(self, table: str, key: str) -> Any:
        """The key as this batch sees it: its own pending write, else the table's value."""
        hit = self._writes.get((table, key))
        return hit[1] if hit is not None else self.wiring.tables[table].get(self.partition, key)

    def set(self, table: str, partition: int, key: str, value: Any) -> None:
        """Write the key once the batch's outputs are acknowledged (``None`` deletes it)."""
        self._writes[(table, key)] = (partition, value)
        if (end := key.find(GROUP_SEP)) >= 0:
            group = (table, key[:end + 1])
            keys = self._grouped.get(group)
            if keys is None:
                self._grouped[group] = {key}
            else:
                keys.add(key)

    def keys_from(self, table: str, prefix: str) -> list[str]:
        """The keys starting with ``prefix`` in the current partition, as this batch sees them."""
        keys = set(self.wiring.tables[table].keys_from(self.partition, prefix))
        if prefix.endswith(GROUP_SEP) and prefix.find(GROUP_SEP) == len(prefix) - 1:
            written: Iterable[str] = self._grouped.get((table, prefix), ())
        else:
            written = [key for name, key in self._writes if name == table and key.startswith(prefix)]
        writes = self._writes
        for key in written:
            if writes[(table, key)][1] is None:
                keys.discard(key)
            else:
                keys.add(key)
        return sorted(keys)

    async def send(self, short: str, key: str | None, value: bytes, *, want: bool = False,
                   on_acked: Acked | None = None) -> asyncio.Future[Delivered] | None:
        """Queue an output (sent at :meth:`flush`); with ``want``, a future of where it landed once acknowledged.

        :meth:`commit` waits for every output before any table write. ``on_acked`` as in :meth:`Outbox.add`.
        """
        names = self.wiring.topic_names
        topic = names.get(short)
        if topic is None:
            topic = names[short] = self.wiring.topics[short].get_topic_name()
        key_bytes = key.encode("utf-8") if key is not None else None
        outbox = self._outbox
        partition = outbox.chosen(topic, key_bytes)
        if partition is None:
            partition = await outbox.partition_for(topic, key_bytes)
        return await outbox.add(topic, partition, key_bytes, value, want=want, on_acked=on_acked)

    async def flush(self) -> None:
        """Hand the outputs queued so far to the producer (without waiting for their acknowledgement)."""
        await self._outbox.flush()

    async def commit(self) -> None:
        """Make the batch durable: every output acknowledged, then its table writes, then its positions.

        The table writes go stage after stage (:data:`TABLE_STAGES`), a stage sent once the one
        before it is acknowledged.

        Raises:
            Fenced: a source partition of the batch is no longer this worker's (checked before each
                stage and before the positions, :mod:`.fence`); what was durable before stays so.
        """
        outbox = self._outbox
        await outbox.flush()
        await outbox.wait()
        for (table, topic, partition), position in self._positions.items():
            key = position_key(topic, partition)
            if self.wiring.tables[table].get(partition, key) != position:  # unchanged: a batch of redeliveries
                self._writes[(table, key)] = (partition, position)
        # Per table, per partition: (key, value, changelog bytes), in the order the batch wrote them.
        by_table: dict[str, dict[int, list[tuple[str, Any, Encoded]]]] = {}
        for (name, key), (partition, value) in self._writes.items():
            encoded = (encode(key), None if value is None else encode(value))
            by_table.setdefault(name, {}).setdefault(partition, []).append((key, value, encoded))
        sources = {(topic, partition) for (_, topic, partition) in self._positions}
        for stage in _stages(by_table):
            _check_owned(self.wiring, sources)
            sent = [(self.wiring.tables[name], by_table[name]) for name in stage]
            lasts = [await self._send(table, writes) for table, writes in sent]
            await outbox.flush()
            await outbox.wait()
            for (local, writes), last in zip(sent, lasts, strict=True):
                for partition, items in writes.items():
                    local.put_many(partition, items)
                for partition, offset in last.items():
                    local.persisted(partition, offset)
        _check_owned(self.wiring, sources)
        self._publish_positions()

    async def _send(self, table: Table, writes: Mapping[int, list[tuple[str, Any, Encoded]]]) -> dict[int, int]:
        """Queue the writes' changelog records, each to ``partition`` (the source record's).

        Returns a dict that holds, once the records are acknowledged, the offset of each partition's
        last one. ``None`` deletes a key: its changelog record is a tombstone, so compaction removes
        it there too. The local copy is written only after the acknowledgement, and marked as holding
        the changelog up to that offset after that: the local copy is always a prefix of the
        changelog, so whatever a crash interrupts, the restart's recovery (which replays the
        changelog after the marked offset) ends at the changelog's values, and a redelivered record
        is decided on what the broker holds, never on a local write that never reached it.
        """
        topic = table.changelog
        last: dict[int, int] = {}

        def acked(partition: int, offset: int, value: Any) -> None:
            last[partition] = max(offset, last.get(partition, -1))

        add = self._outbox.add
        for partition, items in writes.items():
            for _, _, (raw_key, raw_value) in items[:-1]:
                await add(topic, partition, raw_key, raw_value)
            _, _, (raw_key, raw_value) = items[-1]  # a partition's records land in order: its last one's offset
            await add(topic, partition, raw_key, raw_value, on_acked=acked)
        return last

    def advanced(self, table: str, topic: str, partition: int, position: int) -> None:
        """Note that every record of the partition below ``position`` is handled once this batch is durable.

        :meth:`commit` writes it to ``table`` (key :func:`position_key`) with the batch's other writes.
        """
        self._positions[(table, topic, partition)] = position

    def position(self, table: str, topic: str, partition: int) -> int | None:
        """The next offset of ``topic[partition]`` the agent expects, as this batch sees it (None: none yet)."""
        pending = self._positions.get((table, topic, partition))
        if pending is not None:
            return pending
        held: int | None = self.wiring.tables[table].get(partition, position_key(topic, partition))
        return held

    def _publish_positions(self) -> None:
        positions = self.wiring.positions
        if positions is not None:
            for (table, topic, partition), position in self._positions.items():
                positions.advance(table, topic, partition, position, self._generation)


def _first_topics(wiring: Wiring) -> frozenset[str]:
    """The topics whose records a batch makes durable before the rest (:class:`Outbox`): the keyring's."""
    keyring = wiring.topics.get("keyring")
    return frozenset({keyring.get_topic_name()}) if keyring is not None else frozenset()


def _check_owned(wiring: Wiring, sources: set[tuple[str, int]]) -> None:
    """Raise :class:`Fenced` if a partition of ``sources`` is no longer this worker's (:mod:`.fence`)."""
    unowned = wiring.fence.unowned(sources)
    if unowned:
        raise Fenced(", ".join(f"{topic}[{partition}]" for topic, partition in unowned))


def _stages(tables: Mapping[str, Any]) -> list[list[str]]:
    """The tables written, grouped into :data:`TABLE_STAGES` in order (one not named: a stage of its own, last)."""
    named = [[t for t in stage if t in tables] for stage in TABLE_STAGES]
    return [stage for stage in named if stage] + [[t] for t in tables if t not in _STAGED]


_STAGED = frozenset(t for stage in TABLE_STAGES for t in stage)


#: Table key (+ topic and partition) holding the next source offset an agent expects per partition;
#: no runId can start with NUL.
POSITION_KEY = "\x00position\x1f"


def position_key(topic: str, partition: int) -> str:
    """The table key of the next offset an agent expects on ``topic[partition]``."""
    return f"{POSITION_KEY}{topic}\x1f{partition}"

Handler = Callable[[Batch, SourceRecord], Awaitable[None]]
Hook = Callable[[Batch], Awaitable[None]]


async def in_order(batch: Batch, table: str, msg: Message, value: bytes, handle: Handler) -> None:
    """Hand ``msg`` to ``handle(batch, record)`` — after any records the consumer skipped.

    Each agent keeps, in its own table, the next offset it expects per source
    partition. After crash restarts, Faust's consumer was seen to skip records
    of a partition around a rebalance (and, later, to re-read them). A skipped
    ingest record turns every later event of its run into a ``sequence_gap``;
    so when an offset arrives beyond the expected one, the hole is read with a
    plain consumer and handled first. Offsets below the expected one are
    redeliveries, which every agent already treats as done.
    """
    batch.partition = msg.partition
    expected = batch.position(table, msg.topic, msg.partition)
    if expected is None:
        # Nothing of this partition handled yet, so no position: the consumer should have started at
        # the group's committed offset, else at the partition's first record (auto_offset_reset is
        # earliest). It was seen to skip even that first record (offset 0 of a fresh partition), so
        # a first record beyond that start is a hole like any other.
        committed = _committed(batch, msg)
        expected = committed if committed is not None else await batch.wiring.backfill.first_offset(msg.topic,
                                                                                                    msg.partition)
    if msg.offset > expected:
        committed = _committed(batch, msg)
        skipped = await batch.wiring.backfill.read(msg.topic, msg.partition, expected, msg.offset)
        log.warning("%s partition %d: the consumer skipped offsets %d..%d (agent table %s, group committed %s); "
                    "handling %d records first",
                    msg.topic, msg.partition, expected, msg.offset - 1, table, committed, len(skipped))
        METRICS.inc("agentlog_skipped_records_healed_total", len(skipped), topic=msg.topic)
        for offset, timestamp_ms, skipped_key, skipped_value in skipped:
            await handle(batch, SourceRecord(msg.topic, msg.partition, offset, timestamp_ms, skipped_value or b"",
                                             skipped_key))
    await handle(batch, SourceRecord(msg.topic, msg.partition, msg.offset, int((msg.timestamp or 0) * 1000), value,
                                     msg.key))
    batch.advanced(table, msg.topic, msg.partition, max(expected, msg.offset + 1))


def _committed(batch: Batch, msg: Message) -> int | None:
    """The group's committed offset of ``msg``'s partition (looked up only where :func:`in_order` needs it)."""
    return batch.wiring.source.committed(msg.tp)


def handled_position(wiring: Wiring, topic: str, partition: int) -> int | None:
    """The lowest next offset the agents reading ``topic`` hold for ``partition`` (None: one holds none)."""
    key = position_key(topic, partition)
    tables = [wiring.tables.get(table) for table in wiring.positions.tables_for(topic)]
    found = [table.get(partition, key) if table is not None else None for table in tables]
    positions = [position for position in found if isinstance(position, int)]
    return min(positions) if positions and len(positions) == len(found) else None


async def heal_stalled(wiring: Wiring, seen: dict[Partition, int]) -> None:
    """Read again every partition whose records beyond the agents' position never came (one check).

    Faust's consumer was seen to take records from aiokafka and never deliver them: after a restart,
    all 16 records of a fresh partition were fetched (aiokafka's position at the high watermark) and
    none reached the agent (Faust's read offset still unset), with no error. :func:`in_order` reads
    around such a hole only when a later record comes, so a quiet partition stayed stuck. A partition
    is taken as stalled when the broker holds records beyond the position, aiokafka has handed them
    all over (its position is at the high watermark: records not fetched yet, as when another topic's
    backlog takes the fetches, are not a stall), Faust has handed the agents none of them (its read
    offset is below the position: a backlog in the streams' buffers is not one either), and the
    position is the one the previous check saw (``seen``, kept by the caller): a whole interval
    without progress. It is then sought back to that position; anything the agent still had coming
    is a redelivery, which it treats as done.
    """
    source = wiring.source
    if wiring.membership.settling():
        seen.clear()
        return
    topics = wiring.positions.topics()
    for tp in source.assignment():
        if tp.topic not in topics:
            continue
        high = source.highwater(tp)
        position = handled_position(wiring, tp.topic, tp.partition)
        if position is None:
            position = source.committed(tp)
        if position is None and high is not None:
            position = await wiring.backfill.first_offset(tp.topic, tp.partition)
        delivered, fetched = source.read_offset(tp), source.fetch_position(tp)
        if (high is None or position is None or position >= high or fetched is None or fetched < high
                or (delivered is not None and delivered >= position)):
            seen.pop(tp, None)
            continue
        if seen.get(tp) != position:
            seen[tp] = position
            continue
        seen.pop(tp, None)
        log.warning("%s partition %d: records %d..%d were not delivered for %g s; reading them again",
                    tp.topic, tp.partition, position, high - 1, STALL_CHECK_S)
        METRICS.inc("agentlog_stalled_partitions_reread_total", topic=tp.topic)
        await source.seek(tp, position)


def install_stall_heal(wiring: Wiring) -> None:
    """Run :func:`heal_stalled` every :data:`STALL_CHECK_S` (an app timer; 0 turns it off)."""
    interval = STALL_CHECK_S
    if interval <= 0:
        return
    seen: dict[Partition, int] = {}

    async def heal_stalled_partitions() -> None:
        try:
            await heal_stalled(wiring, seen)
        except Exception:  # never stop the worker over a check; the next one tries again
            log.exception("the stalled-partition check failed")

    wiring.runner.timer(interval, heal_stalled_partitions)


async def _adaptive(stream: Stream, process: Callable[[list[Any]], Awaitable[None]], *, max_events: int,
                    tick_s: float, window_s: float, idle_events: int, quiet_s: float = 0.0,
                    behind: Callable[[list[Any]], bool] | None = None) -> None:
    """The one batching loop: batches sized by the load, a quiet tick handled at once, busy ticks piled up.

    The stream is taken in ``take_events`` ticks of ``tick_s``, and each tick is handed over as soon
    as Faust has it; the next tick is already being collected while a batch is handled (the take is
    resumed first), so records are acknowledged to Faust when collected, and positions decide what
    is committed (:mod:`agentlog.worker.positions`). Batches are handled one at a time, in offset
    order.

    A tick that had to be waited for and brought fewer than ``idle_events`` records says the agent
    keeps up: what piled up is handled at once (latency about one tick). Every other tick piles up,
    and the pile is handled when it holds ``max_events`` records, when ``window_s`` has passed since
    its first tick, or when no tick has come for ``quiet_s`` (a burst ended; ``quiet_s`` 0 turns this off).
    The pending take is waited on with a timeout, never cancelled (cancelling Faust's
    ``take_events`` would leave its passive drainer acknowledging records nobody handles).
    ``idle_events`` 0 makes no tick quiet: every batch piles up, and with ``quiet_s`` 0 too it closes
    only at ``max_events`` or ``window_s``.

    A small tick is not quiet either when ``behind(events)`` says the broker holds more of its
    partitions (:func:`broker_ahead`): Faust hands a 5 ms tick only a few records even with
    thousands waiting, and batches of five records would each pay a whole batch's commit.
    """
    loop = asyncio.get_running_loop()
    takes = stream.take_events(max_events, within=tick_s).__aiter__()
    pending: list[Any] = []
    deadline = 0.0
    nxt: asyncio.Future[Any] = asyncio.ensure_future(takes.__anext__())
    try:
        while True:
            # A tick already collected while the last batch was handled says the stream is ahead of
            # us, however few records it holds (the handling starves Faust's delivery): pile up.
            ahead = nxt.done()
            timeout = None
            if pending:
                timeout = max(0.0, deadline - loop.time())
                if quiet_s > 0:
                    timeout = min(timeout, quiet_s)
            done, _ = await asyncio.wait({nxt}, timeout=timeout)
            if not done:  # the window closed or the stream fell silent: handle what piled up
                batch, pending = pending, []
                await process(batch)
                continue
            try:
                events = list(nxt.result())
            except StopAsyncIteration:
                break
            nxt = asyncio.ensure_future(takes.__anext__())
            if not pending:
                deadline = loop.time() + window_s
            pending.extend(events)
            quiet = not ahead and len(events) < idle_events and not (behind is not None and behind(events))
            if quiet or len(pending) >= max_events or loop.time() >= deadline:
                batch, pending = pending, []
                await process(batch)
    finally:
        if not nxt.done():
            nxt.cancel()  # shutting down: a batch cut short is a crash's redelivery
        await asyncio.wait([nxt])
        if not nxt.cancelled():
            nxt.exception()  # the take that ended the stream (StopAsyncIteration): seen, not an error to log


def broker_ahead(source: Source, events: list[Event], records: int) -> bool:
    """Whether the broker holds at least ``records`` more of a partition of ``events`` (its high watermark)."""
    last: dict[Partition, int] = {}
    for event in events:
        last[event.message.tp] = event.message.offset
    for tp, offset in last.items():
        high = source.highwater(tp)
        if high is not None and high - offset - 1 >= records:
            return True
    return False


async def _commit(batch: Batch, agent: str, before: Hook | None, after: Hook | None) -> None:
    """Make a handled batch durable between the agent's hooks, before the agent takes its next batch.

    ``before`` (the batch's records are handled), :meth:`Batch.commit` (the module docstring's
    order), then ``after`` (work that must see the batch durable). A fenced batch (its partitions
    moved to another worker while it was handled) is, as far as anyone can tell, a crash before its
    table writes: not a failure, counted and logged, and the agent goes on without ``after``. Any
    other failure is raised: the agent crashes and Faust's supervisor restarts it.
    """
    if before is not None:
        await before(batch)
    try:
        await batch.commit()
    except Fenced as e:
        METRICS.inc("agentlog_batches_fenced_total", agent=agent)
        log.warning("agent %s: a batch was not made durable: %s moved to another worker while it was handled; "
                    "its next owner handles its records again", agent, e)
        return
    if after is not None:
        await after(batch)


def batched_agent(
    wiring: Wiring,
    short: str,
    *,
    name: str,
    table: str,
    handle: Handler,
    before_commit: Hook | None = None,
    after_commit: Hook | None = None,
) -> None:
    """Register an agent on topic ``short``: every batch runs ``handle`` per record, in offset order.

    Batches are taken by :func:`_adaptive`, the one loop (:data:`BATCH_MAX`, :data:`BATCH_WITHIN_S`,
    :data:`BATCH_TICK_S`, :data:`BATCH_IDLE_EVENTS`, :data:`BATCH_QUIET_S`). A batch follows the module
    docstring's order: each record (and any the consumer skipped before it, :func:`in_order`) goes
    to ``handle``, which sends outputs and stages table writes on the batch; ``before_commit`` runs
    once the records are handled (the sink inserts there); :meth:`Batch.commit` makes outputs, then
    tables, then positions durable; ``after_commit`` runs last (work that must see the batch
    durable, e.g. replay verdicts). Concurrency 1, and registered so the group commits no offset of
    the topic before this agent has made it durable (:mod:`agentlog.worker.positions`).
    """
    wiring.positions.consumes(wiring.topics[short].get_topic_name(), table)

    slice_s = BATCH_SLICE_S

    idle = asyncio.Event()  # no batch of this agent in progress (what a revocation waits for: :mod:`.fence`)
    idle.set()

    async def process(events: list[Event]) -> None:
        membership = wiring.membership
        while membership.settling():
            # Records taken before a rebalance wait for its end: during the tables' recovery a kept
            # partition's table is being re-read (older values for a while) and a moved one is not ours.
            await asyncio.sleep(0.02)
        wiring.fresh_tables()
        events = wiring.fence.owned_events(events)
        if not events:
            return
        idle.clear()
        try:
            await _process(events)
        finally:
            idle.set()

    async def _process(events: list[Event]) -> None:
        batch = Batch(wiring, name, len(events))
        clock = loop_clock
        resumed = clock()
        for event in events:
            value = event.value if isinstance(event.value, bytes) else bytes(event.value or b"")
            await in_order(batch, table, event.message, value, handle)
            if slice_s > 0 and clock() - resumed > slice_s:
                # Let Faust's drainer run: records left in aiokafka's buffer for over its prefetch
                # backoff (100 ms) are left out of the next fetch, which may then name only idle
                # partitions and long-poll. Nothing else of this agent runs meanwhile
                # (concurrency 1; the next batch waits for this one), so the order is unchanged.
                await asyncio.sleep(0)
                resumed = clock()
        await batch.flush()  # the outputs leave now; ``before_commit`` may wait for some (snapshots do)
        await _commit(batch, name, before_commit, after_commit)

    async def settle() -> None:
        # Faust does not wait for a batch at a rebalance (records are acknowledged to it when taken): the
        # batch in progress must be durable before the member rejoins, or its table writes land while the
        # partitions' next owner recovers them. A batch is durable before the next one starts, so the
        # batch in progress is all there is to wait for.
        await idle.wait()

    wiring.fence.register(settle)

    def behind(events: list[Event]) -> bool:
        return broker_ahead(wiring.source, events, BATCH_IDLE_EVENTS)

    async def agent(stream: Stream) -> None:
        await _adaptive(stream, process, max_events=BATCH_MAX, tick_s=BATCH_TICK_S, window_s=BATCH_WITHIN_S,
                        idle_events=BATCH_IDLE_EVENTS, quiet_s=BATCH_QUIET_S, behind=behind)

    agent.__name__ = name.replace("-", "_")
    wiring.runner.agent(wiring.topics[short], name, agent)


class FaustAgents:
    """Agents on the batch loop (:class:`agentlog.worker.ports.Agents`): Faust agents and tables of the app."""

    def __init__(self, wiring: Wiring) -> None:
        self._wiring = wiring

    def table(self, name: str) -> Table:
        assert self._wiring.make_table is not None
        table = self._wiring.tables[name] = self._wiring.make_table(name)
        return table

    def agent(self, short: str, *, name: str, table: str, handle: Handler, before_commit: Hook | None = None,
              after_commit: Hook | None = None) -> Fence:
        batched_agent(self._wiring, short, name=name, table=table, handle=handle, before_commit=before_commit,
                      after_commit=after_commit)
        return self._wiring.fence
