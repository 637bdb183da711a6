"""The worker's agents on Kafka transactions: consume → handle → one transaction per batch, fenced by the broker.

This is the one module of commits and recovery. Every agent of the worker runs as a :class:`TxAgent`: the
sequencer (ingest), the handoff agent (handoff-links), the OTel span mapper (spans) and the OTel run sequencer
(otel-events). Every batch of an input partition is one transaction of that partition's writer
(:mod:`agentlog.worker.txlog`): the records the batch sends (the log, rejections, checkpoints, snapshots, keyring
records, transitions, ingest records of mapped spans, …), the changelog records of its table writes, and the
partition's next input offset (``send_offsets_to_transaction``). Either all of it becomes visible to readers (who
read committed only) or none of it does, so there is no order of acknowledgements to keep, nothing to heal (the
consumer is aiokafka's own, reading from the position the last committed transaction noted), and no fence of our
own: a member that lost a partition is fenced by the broker the moment the partition's new owner opens its writer,
and its next commit fails (:class:`agentlog.worker.txlog.Fenced`).

An agent's per-record work is its own (:class:`Work`: the sequencer's from :func:`agentlog.worker.sequencer.build`,
the handoff agent's from :mod:`agentlog.worker.handoff`, the OTel agents' from :mod:`agentlog.worker.spans`), handed
a :class:`TxBatch` (the :class:`agentlog.worker.sequencer.Staging` port: reads through the batch's own writes,
staged writes, outputs). State is in :class:`agentlog.worker.txstate.StateTable` s, restored from their changelogs'
tails when a partition is assigned, after its writer is opened (which ends any transaction its earlier owner left
open).

A batch that fails to commit is a crash of the batch: nothing of it is visible, and its records are read again
from the committed position by whoever owns the partition. The one thing outside the transaction is the worker's
keyring in memory: a key minted in a batch that did not commit is known locally but not on the keyring topic,
so a fenced batch forgets the keys it minted (the partition's owner mints them, and the keyring topic brings them),
and a partition is taken only once the worker's keyring holds every key committed so far.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from agentlog.core.keyring import KeyRecord
from agentlog.metrics import METRICS
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import agent_group
from agentlog.worker.owned import Owned
from agentlog.worker.ports import GROUP_SEP, SourceRecord
from agentlog.worker.sequencer import Staging, StagingHandler, StagingHook
from agentlog.worker.tables import encode
from agentlog.worker.txlog import Appended, Fenced, KafkaLog, RecordLog, Transaction, Writer
from agentlog.worker.txstate import StateTable
from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.txruntime")

#: The sequencer's tables, by the short names it uses, and the names their changelogs and databases carry.
TABLE_NAMES = {"index": "seq-index", "runs": "run-state", "closed": "run-closed"}

#: A fetch the broker answers at once holds this much (a backlog); with less there it waits up to the agent's fetch
#: wait for more (Kafka's fetch.min.bytes / fetch.max.wait.ms). A transaction costs ~1.1 ms of aiokafka's CPU whatever
#: it holds (five requests, ~60 callbacks), and each partition's batch is one: at a steady rate the wait sets how many
#: events share one, and an idle agent fetches once a wait.
FETCH_MIN_BYTES = 1 << 20
#: The fetch wait of an agent off the publish -> log path (handoff, OTel): few transactions and idle fetches.
FETCH_WAIT_MS = 100
#: The sequencer's fetch wait: publish -> log latency against CPU. Toy events at 1k ev/s over 4 partitions
#: (tests/bench/JOURNAL.md), the worker's CPU an event and publish -> log p50 / p99: answered at once 650-690 µs,
#: 5-16 / 38-43 ms; 20 ms 505 µs, 14 / 27 ms; 30 ms 381-421 µs, 20 / 37 ms; 50 ms 287-298 µs, 32 / 57-61 ms;
#: 100 ms 214 µs, 59 / 110 ms.
SEQUENCER_FETCH_WAIT_MS = 30
#: How long the loop waits for a fetch before it looks at partitions it lost to a fence again.
POLL_MS = 100
#: The most records of one fetch: a batch of one partition is at most this, one transaction.
BATCH_MAX = 5000


class TxBatch:
    """One batch of one input partition, handled inside its transaction (what the sequencer's handle uses)."""

    def __init__(self, wiring: Wiring, tables: dict[str, StateTable], tx: Transaction, partition: int) -> None:
        self.wiring = wiring
        self.partition = partition
        self.collected: list[Any] = []
        self._tables = tables
        self._tx = tx
        self._writes: dict[tuple[str, str], Any] = {}
        self._grouped: dict[tuple[str, str], set[str]] = {}
        #: Records whose landing someone asked about: (where, on_acked, value), resolved once committed.
        self._acked: list[tuple[Awaitable[Appended], Any, bytes | None]] = []
        #: Keyring records this batch sent: the keys it minted, which only its commit makes known to others.
        self.minted: list[bytes] = []

    def get(self, table: str, key: str) -> Any:
        hit = self._writes.get((table, key), _MISSING)
        return self._tables[table].get(self.partition, key) if hit is _MISSING else hit

    def set(self, table: str, partition: int, key: str, value: Any) -> None:
        self._writes[(table, key)] = value
        if (end := key.find(GROUP_SEP)) >= 0:
            self._grouped.setdefault((table, key[:end + 1]), set()).add(key)

    def keys_from(self, table: str, prefix: str) -> list[str]:
        keys = set(self._tables[table].keys_from(self.partition, prefix))
        if prefix.endswith(GROUP_SEP) and prefix.find(GROUP_SEP) == len(prefix) - 1:
            written: Iterable[str] = self._grouped.get((table, prefix), ())
        else:
            written = [key for name, key in self._writes if name == table and key.startswith(prefix)]
        for key in written:
            if self._writes[(table, key)] is None:
                keys.discard(key)
            else:
                keys.add(key)
        return sorted(keys)

    async def send(self, short: str, key: str | None, value: bytes, *, want: bool = False,
                   on_acked: Any = None) -> Awaitable[Appended] | None:
        names = self.wiring.topic_names
        topic = names.get(short)
        if topic is None:
            topic = names[short] = self.wiring.topics[short].get_topic_name()
        if short == "keyring":
            self.minted.append(value)
        where = await self._tx.send(topic, key.encode("utf-8") if key is not None else None, value)
        if not want and on_acked is None:
            return None
        if on_acked is not None:  # told once the transaction commits (:meth:`committed`)
            self._acked.append((where, on_acked, value))
        return where if want else None  # awaitable more than once: its batch's acknowledgement

    async def stage(self) -> list[tuple[StateTable, list[tuple[str, Any, tuple[bytes, bytes | None]]],
                                        Awaitable[Appended]]]:
        """Send the changelog records of the batch's writes; what to write locally once the transaction commits."""
        by_table: dict[str, list[tuple[str, Any, tuple[bytes, bytes | None]]]] = {}
        for (name, key), value in self._writes.items():
            by_table.setdefault(name, []).append((key, value, (encode(key), None if value is None else encode(value))))
        staged: list[tuple[StateTable, list[tuple[str, Any, tuple[bytes, bytes | None]]], Awaitable[Appended]]] = []
        for name, writes in by_table.items():
            table = self._tables[name]
            last: Awaitable[Appended] | None = None
            for _, _, (raw_key, raw_value) in writes:
                last = await self._tx.send(table.changelog, raw_key, raw_value, self.partition)
            assert last is not None
            staged.append((table, writes, last))
        return staged

    async def committed(self) -> None:
        """Tell whoever asked where their records landed (the transaction is committed)."""
        for landed, on_acked, value in self._acked:
            where = await landed
            on_acked(where.partition, where.offset, value)


_MISSING = object()


class Work(Protocol):
    """An agent's work, for the runtime to run: ``handle`` per record, the hooks once per batch.

    ``before_commit`` once a batch's records are handled, inside its transaction; ``after_commit`` once it is
    committed (work that must see the batch durable: lifetimes, verdicts, key shredding).
    """

    @property
    def handle(self) -> StagingHandler: ...

    @property
    def before_commit(self) -> StagingHook: ...

    @property
    def after_commit(self) -> StagingHook: ...


async def nothing(batch: Staging) -> None:
    """A hook that does nothing."""


@dataclass(frozen=True, slots=True)
class Hooks:
    """A :class:`Work` from functions."""

    handle: StagingHandler
    before_commit: StagingHook = nothing
    after_commit: StagingHook = nothing


class TxAgent:
    """An agent's loop on Kafka transactions: one consumer, a writer and restored state per input partition."""

    def __init__(self, wiring: Wiring, work: Work, records: RecordLog, tables: dict[str, StateTable],
                 owned: Owned, *, short: str, group: str, name: str = "sequencer",
                 fetch_wait_ms: int = FETCH_WAIT_MS) -> None:
        self._wiring = wiring
        self._fetch_wait_ms = fetch_wait_ms
        self._name = name
        self._agent = work
        self._log = records
        self._tables = tables
        self._owned = owned
        self._group = group
        self.topic = wiring.topics[short].get_topic_name()
        self._writers: dict[int, Writer] = {}
        self._gate = _Gate()  # batches of several partitions side by side; a rebalance step alone, after them
        self._consumer: AIOKafkaConsumer | None = None
        self._lost: dict[int, float] = {}  # partitions a newer writer fenced us out of: since when (loop time)

    async def run(self) -> None:
        settings = self._wiring.settings
        consumer = self._consumer = AIOKafkaConsumer(
            **client_kwargs(settings), group_id=self._group, enable_auto_commit=False,
            auto_offset_reset="earliest", isolation_level="read_committed",
            fetch_max_wait_ms=self._fetch_wait_ms, fetch_min_bytes=FETCH_MIN_BYTES,
            max_partition_fetch_bytes=8 << 20, session_timeout_ms=int(settings.session_timeout_s * 1000),
            heartbeat_interval_ms=int(min(3.0, settings.session_timeout_s / 3) * 1000))
        consumer.subscribe([self.topic], listener=_Listener(self))
        await consumer.start()
        try:
            while True:
                got = await consumer.getmany(timeout_ms=POLL_MS, max_records=BATCH_MAX)
                # Each partition's batch is its own transaction: while one waits for the broker (its commit takes
                # several round trips), the next is handled.
                await asyncio.gather(*(self.handle_batch(tp, messages) for tp, messages in got.items() if messages))
                if self._lost:
                    await self._reclaim()
        finally:
            await consumer.stop()
            for writer in self._writers.values():
                await writer.close()
            self._writers.clear()
            for table in self._tables.values():
                table.close_all()

    async def handle_batch(self, tp: TopicPartition, messages: list[Any]) -> None:
        async with self._gate.batch():
            writer = self._writers.get(tp.partition)
            if writer is None:
                return  # revoked while fetched
            agent = self._agent
            batch: TxBatch | None = None
            try:
                async with writer.transaction() as tx:
                    batch = TxBatch(self._wiring, self._tables, tx, tp.partition)
                    for m in messages:
                        await agent.handle(batch, SourceRecord(tp.topic, tp.partition, m.offset, m.timestamp,
                                                               m.value or b"", m.key))
                    await agent.before_commit(batch)
                    staged = await batch.stage()
                    tx.consumed(tp.topic, tp.partition, messages[-1].offset + 1)
            except Fenced as e:
                METRICS.inc("agentlog_batches_fenced_total", agent=self._name)
                log.warning("%s partition %d: a batch was fenced (%s): another worker owns it now", tp.topic,
                            tp.partition, e)
                keyring = self._wiring.keyring
                if batch is not None and keyring is not None:
                    for value in batch.minted:
                        keyring.forget(KeyRecord.from_value(value))  # the partition's owner mints its own
                await self._fenced(tp)
                return
            METRICS.inc("agentlog_batches_total", agent=self._name)
            METRICS.inc("agentlog_batch_events_total", len(messages), agent=self._name)
            for table, writes, last in staged:
                table.put_many(tp.partition, writes, restored_to=(await last).offset)
            await batch.committed()
            await agent.after_commit(batch)

    async def _fenced(self, tp: TopicPartition) -> None:
        """A newer writer holds the partition: drop it (writer, state) and read none of it until it is ours again.

        It is ours again when the group assigns it to this member in a later rebalance, or when the group
        still says it is ours a whole session timeout later (the fence was a transaction that outlived its
        timeout, not a new owner): then the writer is opened again (fencing whatever wrote meanwhile) and it
        is read on from the position its last committed transaction noted.
        """
        await self._release([tp.partition], drop=False)
        self._lost[tp.partition] = asyncio.get_running_loop().time()
        if self._consumer is not None and tp in self._consumer.assignment():
            self._consumer.pause(tp)

    async def _reclaim(self) -> None:
        """Take back the partitions :meth:`_fenced` dropped that the group still gives this member."""
        consumer = self._consumer
        now = asyncio.get_running_loop().time()
        wait_s = self._wiring.settings.session_timeout_s
        for partition, since in list(self._lost.items()):
            if now - since < wait_s:
                continue
            del self._lost[partition]
            tp = TopicPartition(self.topic, partition)
            if consumer is None or tp not in consumer.assignment():
                continue
            async with self._gate.alone():
                await self._acquire([partition])
                position = await self._log.position(tp.topic, tp.partition)
                if position is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, position)
                consumer.resume(tp)

    async def _acquire(self, partitions: Iterable[int]) -> None:
        """Open the writers of ``partitions``, then restore their tables (each step concurrently)."""
        partitions = list(partitions)
        if not partitions:
            return
        # The writers first: opening one ends any transaction an earlier owner left open, so the
        # changelogs' committed tail is final when the restore reads it.
        writers = await asyncio.gather(*(self._log.writer(p) for p in partitions))
        self._writers.update(zip(partitions, writers, strict=True))
        await self._keys_of(partitions)
        tables = self._tables.values()
        tails = await self._log.read({(t.changelog, p): t.tail_start(p) for p in partitions for t in tables})
        restored = sum(t.restore(p, tails[(t.changelog, p)]) for p in partitions for t in tables)
        log.info("%s partitions %s: state restored (%d changelog records)", self.topic, partitions, restored)

    async def _keys_of(self, partitions: list[int]) -> None:
        """Wait until the worker's keyring holds every key committed so far (``partitions`` are being taken).

        Their earlier owner's transactions are final once the writers are open; a record it sealed and left
        uncommitted comes again, and must be sealed under the key it had, not a new one. Every partition of
        the keyring: the sequencer's keys are co-partitioned with ingest, the span mapper's are not.
        """
        keyring, consumer = self._wiring.keyring, self._consumer
        if keyring is None or consumer is None or not partitions:
            return
        topic = self._wiring.topics["keyring"].get_topic_name()
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(self._wiring.settings.partitions)])
        await keyring.reached({tp.partition: end for tp, end in ends.items()})

    async def _release(self, partitions: Iterable[int], *, drop: bool) -> None:
        for partition in partitions:
            writer = self._writers.pop(partition, None)
            if writer is not None:
                await writer.close()
            for table in self._tables.values():
                table.close(partition, drop=drop)

    async def assigned(self, tps: Iterable[TopicPartition]) -> None:
        async with self._gate.alone():
            now = {tp.partition for tp in tps if tp.topic == self.topic}
            self._lost.clear()  # a new assignment: every partition of it is acquired afresh
            await self._release(sorted(set(self._writers) - now), drop=True)
            await self._acquire(sorted(now - set(self._writers)))
            if self._consumer is not None:
                self._consumer.resume(*self._consumer.paused())
            self._owned.assigned([TopicPartition(self.topic, p) for p in sorted(now)])

    async def revoked(self) -> None:
        async with self._gate.alone():  # the batches in progress end (committed or not) before the group moves on
            pass


class _Gate:
    """Batches run side by side; a rebalance step runs alone, once every batch in progress has ended, and no batch
    starts while it runs. Hand-written: asyncio has no readers-writer lock, and this is all of its use."""

    def __init__(self) -> None:
        self._alone = asyncio.Lock()
        self._batches = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        async with self._alone:  # not while a rebalance step runs
            self._batches += 1
            self._idle.clear()
        try:
            yield
        finally:
            self._batches -= 1
            if not self._batches:
                self._idle.set()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        async with self._alone:
            await self._idle.wait()
            yield


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, runtime: TxAgent) -> None:
        self._runtime = runtime

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._runtime.revoked()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._runtime.assigned(assigned)


def state_root(settings: Settings) -> Path:
    """Where the transactional runtime's tables live: one directory of the worker's state directory."""
    return settings.state_path / f"{settings.topic_prefix}-worker-tx"


def state_tables(settings: Settings, opener: Any, names: Mapping[str, str],
                 ttl_s: Mapping[str, int] | None = None) -> dict[str, StateTable]:
    """Tables by the short names an agent uses, from their names (``opener(path, ttl_s)`` opens a database).

    A table's changelog is ``<prefix>-worker-<name>-changelog`` (under the prefix the secure broker's ACLs give the
    worker).
    """
    app_id = f"{settings.topic_prefix}-worker"
    ttl = ttl_s or {}

    def opener_of(ttl: int | None) -> Any:
        return lambda path: opener(path, ttl)

    root = state_root(settings)
    return {short: StateTable(name, f"{app_id}-{name}-changelog", root, opener=opener_of(ttl.get(short)))
            for short, name in names.items()}


def sequencer_tables(settings: Settings, opener: Any) -> dict[str, StateTable]:
    """The sequencer's tables (:data:`TABLE_NAMES`); a closed run's marker expires after its retention."""
    return state_tables(settings, opener, TABLE_NAMES, {"closed": int(settings.run_closed_retention_s)})


def install(wiring: Wiring, work: Work, tables: dict[str, StateTable], owned: Owned, *, short: str, name: str,
            records: Callable[[str], RecordLog] | None = None, fetch_wait_ms: int = FETCH_WAIT_MS) -> TxAgent:
    """Run ``work`` on topic ``short`` as a loop of Kafka transactions, a task of the worker.

    Its consumer group and its writers' transactional-id prefix are ``agent_group(settings, name)``; its records
    go through ``records(group)`` (by default the Kafka log of that group).
    """
    group = agent_group(wiring.settings, name)
    log_of = records or (lambda group: KafkaLog(wiring.settings, name=group, group=group))
    runtime = TxAgent(wiring, work, log_of(group), tables, owned, short=short, group=group, name=name,
                      fetch_wait_ms=fetch_wait_ms)
    wiring.runner.task(runtime.run)
    wiring.tx_agents[name] = runtime
    return runtime


class TxAgents:
    """Where the worker's agents are made: each its own :class:`TxAgent`, its tables registered in the wiring."""

    def __init__(self, wiring: Wiring, opener: Any, records: Callable[[str], RecordLog] | None = None) -> None:
        """``opener(path, ttl_s)`` opens a table's database (``RocksBudget.open`` in the worker); ``records(group)``:
        the log an agent's records go through (by default its group's on Kafka)."""
        self._wiring, self._opener, self._records = wiring, opener, records

    def table(self, name: str) -> StateTable:
        table = state_tables(self._wiring.settings, self._opener, {name: name})[name]
        self._wiring.tables[name] = table
        return table

    def agent(self, short: str, *, name: str, table: str, handle: StagingHandler,
              before_commit: StagingHook | None = None, after_commit: StagingHook | None = None) -> Owned:
        """Run ``handle`` per record of topic ``short`` (the hooks once per batch) with table ``table`` (made by
        :meth:`table`); returns the partitions it holds."""
        owned = Owned()
        tables = {table: cast(StateTable, self._wiring.tables[table])}
        install(self._wiring, Hooks(handle, before_commit or nothing, after_commit or nothing), tables, owned,
                short=short, name=name, records=self._records)
        return owned
