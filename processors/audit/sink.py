"""Audit sink: every output topic → ClickHouse, exactly once, as a plain bulk Kafka consumer.

Not one of the worker's agents on Kafka transactions: what it writes is ClickHouse, so its exactly-once is
ClickHouse's (:mod:`agentlog.audit.exactly_once`), and it needs no table. One aiokafka consumer (group
``<prefix>.audit-sink``) reads all output topics; records are buffered per (topic, partition) and a buffer is
ready to go as one batch when it holds ``BATCH_ROWS`` records, is ``FLUSH_S`` old, or ends a burst
(the partition is drained: :meth:`AuditSink._drained`). A batch is stored in the background
while the loop fetches the next (chdb releases the GIL while a statement runs), one batch per
partition at a time, so a partition's next range is recorded only once its last is stored.
Batches of different partitions are stored at once on ``LANES`` lanes, each with its own
store connection (:meth:`agentlog.audit.store.Store.fork`) and staging tables. The loop never
waits for a lane while it may fetch: a free lane takes the ready partition with the most rows
left (:meth:`AuditSink._schedule`), and the other partitions of its topic with their buffers
while the batch stays within ``BATCH_ROWS`` (:meth:`AuditSink._riders`): a trickle over
many partitions is stored in one set of statements, not one per partition.

Exactly-once is the ledger of offset ranges and the inserts of :mod:`agentlog.audit.exactly_once`
(range tokens, the natural-key filter, re-forms that trust no token). This loop keeps their order:
a batch's ranges are recorded before its rows (:meth:`AuditSink.flush`), and on (re)assignment a
partition starts by re-forming the ledger's last range (:meth:`AuditSink._assigned`), then carries
on from ``hi + 1``.

Batches are contiguous, so no offset can fall between two ranges: the sink knows, per partition,
the next offset it expects (``hi + 1`` of the last range, or the partition's first offset). Offsets a
fetch skips between two of its records are absent from the topic (transaction markers, compaction).
A fetch whose first record is past that offset (a rebalance or a re-seek racing records fetched
earlier) makes it seek back to the expected offset and read again; only when the same jump repeats
are the offsets taken as absent, and the next range still starts at the expected offset.
:data:`agentlog.audit.exactly_once.LEDGER_GAPS` lists any gap between recorded ranges; there should
be none. Kafka offsets are committed too, but only for lag tooling:
the sink never resumes from them.

The log (most of the volume) is not decoded here: its raw records go to ClickHouse in one insert
and ClickHouse maps them and proves each row exact (:meth:`AuditSink._insert_log`). Only the
records it cannot prove (a foreign writer's non-JCS text, a wrong hash, an unusual timestamp …)
are decoded and mapped in Python (:func:`split_batch`), under the token ``<range>/py``. The other
topics are mapped in Python.

A record that cannot be decoded or mapped is not skipped silently: it goes to the
``rejections`` table (reason ``sink_undecodable`` / ``sink_unmappable``, or
``log_format_unsupported`` for a log record without ``stateHash``, raw bytes kept) in the same
exactly-once way, and the rest of its batch is inserted. A failing insert is
retried with backoff, never dropped.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from agentlog.audit import retention
from agentlog.audit.exactly_once import BlockingSink, batch_token, stage_name
from agentlog.audit.migrations import open_owned
from agentlog.audit.rows import rows_for
from agentlog.audit.store import Store
from agentlog.metrics import METRICS
from agentlog.schemas.errors import LogFormatError, StoreError
from agentlog.streams.codec import decode_record
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import REBALANCE_TIMEOUT_S, Settings
from agentlog.streams.topics import topic_name

log = logging.getLogger("agentlog.sink")

#: topic short name -> record kind understood by :meth:`agentlog.audit.store.Store.insert_records`
SINK_TOPICS = {
    "log": "committed",
    "transitions": "transition",
    "violations": "violation",
    "rejections": "rejection",
    "snapshots": "snapshot",
    "verdicts": "verdict",
    "checkpoints": "checkpoint",
}


#: Rows of a sink batch. The sink's 200k bench, alternated on one broker: 115-133k rows/s at 30,000
#: against 90-115k at 20,000 (fewer statements, parts and ledger rows per row); a trickle still waits
#: FLUSH_S. Also the bound of a batch that carries several partitions of a topic (a trickle's buffers
#: ride along with the first one ready: :meth:`AuditSink._riders`).
BATCH_ROWS = 30_000
#: How long a partition's buffer waits before it is stored anyway. 0.5 s: publish → queryable p99 at
#: 1k ev/s 1.7 s against 2.2 s at 1 s (quiet machine); at most two inserts per second per partition and
#: table at a trickle.
FLUSH_S = 0.5
#: Log batches of this many partitions are stored at once, each on its own ClickHouse connection and
#: staging tables (chdb releases the GIL: two statements use two cores). A partition still has one
#: batch in flight at a time. 1 = one batch at a time.
LANES = 2

#: A drained partition's buffer is flushed at once from this fraction of ``BATCH_ROWS`` on, and
#: so is the rest after such a batch (:meth:`AuditSink._drained`): 1,500 records, six seconds
#: of a 1k ev/s trickle spread over four partitions, so a trickle still waits for ``FLUSH_S``.
DRAINED_FRACTION = 20

#: The consumer's poll while a ready buffer waits for a lane: the loop looks for a free lane this often.
WAITING_POLL_MS = 10


async def retrying(what: str, fn: Callable[[bool], Any], *, table: str) -> None:
    """Run a blocking store call in a thread until it succeeds; an audit row is never dropped.

    ``fn(retry)`` is told whether an attempt failed before it: a failed insert may have landed its
    part (or part of its views) before it raised, so the sink's inserts re-form the batch on a
    retry (:meth:`BlockingSink.insert_rows`) instead of trusting the token again.
    """
    delay = 0.5
    loop = asyncio.get_running_loop()
    retry = False
    while True:
        try:
            await loop.run_in_executor(None, fn, retry)
            return
        except Exception as e:
            retry = True
            METRICS.inc("agentlog_sink_errors_total", table=table)
            log.error("%s failed (%s); retrying in %.1fs", what, e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


@dataclass(eq=False)
class _Partition:
    """What the sink knows of one assigned partition; replaced (not mutated) on every assignment.

    Code that awaited checks it still holds the current object, so a rebalance that happened
    meanwhile (aiokafka runs the listener in its own task, concurrently with the consume loop)
    is never mixed with the work of the previous assignment.
    """

    #: the offset the next accepted record must have: batches are contiguous
    expected: int | None
    #: the last range of the ledger, to re-form before anything else (None once done)
    pending: tuple[int, int] | None = None
    messages: list[Any] = field(default_factory=list)
    #: the range start of ``messages`` (the expected offset when the first was taken)
    lo: int = 0
    since: float = field(default_factory=time.monotonic)
    #: an offset jump seen once (expected, seen): seen again after a re-read, the offsets are absent
    jump: tuple[int, int] | None = None
    #: the last batch flushed was a burst's (:meth:`AuditSink._drained`)
    burst: bool = False


class Rider(NamedTuple):
    """One partition's share of a batch that carries several (:meth:`AuditSink._riders`)."""

    tp: TopicPartition
    part: _Partition
    messages: list[Any]
    lo: int
    hi: int


def batch_ranges(tp: TopicPartition, lo: int, hi: int, riders: Sequence[Rider] = ()) -> list[tuple[str, int, int, int]]:
    """The ledger ranges ``(topic, partition, lo, hi)`` of a batch: its own partition's, then each rider's."""
    return [(tp.topic, tp.partition, lo, hi), *((r.tp.topic, r.tp.partition, r.lo, r.hi) for r in riders)]


Mapped = tuple[str, tuple[str, ...], list[list[Any]]]


def split_batch(kind: str, messages: Sequence[Any]) -> tuple[Mapped | None, list[dict[str, Any]]]:
    """Decode and map a batch: (the kind's table, columns and data — None if no record maps —,
    rejections for the records that cannot go there).

    Mapping is tried on the whole batch first and per record only when that fails, so the
    common case stays one columnar mapping, done once. A log record without ``stateHash`` (log
    format 1) is rejected with that reason, ``log_format_unsupported``, and its message.
    """
    good: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []

    def reject(m: Any, reason: str, detail: str, value: dict[str, Any] | None) -> None:
        bad.append({
            "reason": reason, "detail": detail[:2000],
            "runId": (value or {}).get("runId") or ((value or {}).get("doc") or {}).get("runId"),
            "raw": base64.b64encode(m.value or b"").decode("ascii"),
            "source": {"topic": m.topic, "partition": m.partition, "offset": m.offset, "timestampMs": m.timestamp},
        })

    decoded: list[tuple[Any, dict[str, Any]]] = []
    for m in messages:
        try:
            decoded.append((m, decode_record(m.value)))
        except Exception as e:
            reject(m, "sink_undecodable", f"{type(e).__name__}: {e}", None)
    try:
        return (rows_for(kind, [v for _, v in decoded], parsed=True) if decoded else None), bad
    except StoreError:
        for m, v in decoded:
            try:
                rows_for(kind, [v], parsed=True)
                good.append(v)
            except StoreError as e:
                reject(m, e.code if e.code == LogFormatError.code else "sink_unmappable", str(e), v)
    return (rows_for(kind, good, parsed=True) if good else None), bad


class AuditSink:
    """The consumer loop; :meth:`run` until cancelled (the worker starts it as a task: :func:`install`)."""

    def __init__(self, settings: Settings, store: Store, *,
                 topics: dict[str, str] | None = None) -> None:
        self.settings = settings
        #: lane i stores batches on ``sinks[i]``: lane 0 is :attr:`sink`, the others get a connection
        #: and staging tables of their own in :meth:`run` (:meth:`_open_lanes`)
        self.sinks: list[BlockingSink] = [
            BlockingSink(store, stage=stage_name(settings.worker_id, shared=store.backend == "server"))]
        #: ``time.perf_counter()`` when the first records arrived (after the group join): the bench times from it
        self.first_fetch_at: float | None = None
        self.kinds = {topic_name(settings, short): kind for short, kind in (topics or SINK_TOPICS).items()}
        self.shorts = {topic_name(settings, short): short for short in (topics or SINK_TOPICS)}
        self._parts: dict[TopicPartition, _Partition] = {}
        self.consumer: AIOKafkaConsumer | None = None
        #: per partition, its batch being stored while the loop fetches on, and the lane storing it
        #: (:meth:`_start`): one per partition, at most one per lane
        self._inflight: dict[TopicPartition, tuple[asyncio.Task[None], int]] = {}
        #: per partition, the offset after its last stored batch, not committed yet (:meth:`_commit_stored`)
        self._commits: dict[TopicPartition, int] = {}
        self._committing: asyncio.Task[None] | None = None
        #: partitions paused because their buffer holds a whole batch beyond the one in flight (:meth:`_hold`)
        self._held: set[TopicPartition] = set()

    @property
    def sink(self) -> BlockingSink:
        """Lane 0's store access: the ledger reads and re-forms go through it."""
        return self.sinks[0]

    @sink.setter
    def sink(self, value: BlockingSink) -> None:
        self.sinks[0] = value

    def _new_consumer(self) -> AIOKafkaConsumer:
        """The sink's only Kafka client (connection settings go here, and only here)."""
        s = self.settings
        return AIOKafkaConsumer(
            **client_kwargs(s),
            group_id=f"{s.topic_prefix}.audit-sink",
            client_id=f"{s.worker_id}-sink",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=BATCH_ROWS,
            # a batch in few fetches: the default 1 MiB per partition is ~2,500 log records, so a
            # 20,000-record batch would take eight round trips, each waited for between inserts
            max_partition_fetch_bytes=16 * 1024 * 1024,
            session_timeout_ms=int(s.session_timeout_s * 1000),
            rebalance_timeout_ms=int(REBALANCE_TIMEOUT_S * 1000),
        )

    async def _assigned(self, tps: Sequence[TopicPartition]) -> None:
        """Start each partition from the ledger: re-form its last range, or read it from its first offset.

        The partitions are paused meanwhile: aiokafka fetches a partition as soon as it is assigned,
        while this listener still runs, and a record taken before the partition's state exists is
        dropped and read again (measured: unpaused, such reads fill most of the first second of a
        200k-record start). One ledger query and one offsets request serve the whole assignment.
        """
        assert self.consumer is not None
        tps = list(tps)
        for tp in tps:
            self._parts.pop(tp, None)
        self._held.difference_update(tps)
        held = [tp for tp in tps if tp in self.consumer.assignment()]
        self.consumer.pause(*held)
        try:
            lasts = await self._last_ranges(tps)
            fresh = [tp for tp in tps if lasts.get(tp) is None]
            firsts: dict[TopicPartition, int] = {}
            if fresh:
                try:
                    firsts = await self.consumer.beginning_offsets(fresh)
                except Exception as e:  # the broker will not say: the first record read is the start
                    log.warning("sink: no first offsets for %s (%s); starting at the first record read",
                                ", ".join(f"{tp.topic}/{tp.partition}" for tp in fresh), e)
            for tp in tps:
                last = lasts.get(tp)
                if last is not None:
                    self.consumer.seek(tp, last[0])
                    self._parts[tp] = _Partition(expected=last[0], pending=last)
                    log.info("sink resumes %s/%d by re-forming offsets %d-%d", tp.topic, tp.partition, *last)
                    continue
                first = firsts.get(tp)
                if first is None:
                    await self.consumer.seek_to_beginning(tp)
                else:
                    self.consumer.seek(tp, first)
                self._parts[tp] = _Partition(expected=first)
        finally:
            self.consumer.resume(*[tp for tp in held if tp in self.consumer.assignment()])

    async def _last_ranges(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """The ledger's newest range of each of ``tps`` (:meth:`BlockingSink.last_ranges`), read until the
        store answers."""
        found: list[dict[tuple[str, int], tuple[int, int]]] = []

        def read(_retry: bool) -> None:
            found.append(self.sink.last_ranges([(tp.topic, tp.partition) for tp in tps]))

        await retrying("reading the sink's ledger", read, table=self.shorts[tps[0].topic] if tps else "log")
        return {tp: found[-1][(tp.topic, tp.partition)] for tp in tps if (tp.topic, tp.partition) in found[-1]}

    def _revoked(self, tps: Sequence[TopicPartition]) -> None:
        # Unflushed buffers have no ledger row yet: the next owner reads them again.
        for tp in tps:
            self._parts.pop(tp, None)
        self._held.difference_update(tps)

    def _listener(self) -> ConsumerRebalanceListener:
        sink = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
                sink._revoked(revoked)

            async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
                await sink._assigned(assigned)

        return Listener()

    async def flush(self, tp: TopicPartition, messages: list[Any], *, lo: int, hi: int, marked: bool,
                    lane: int = 0, riders: Sequence[Rider] = ()) -> None:
        """Insert one batch exactly once: record its range, then insert with its token.

        ``marked=True`` re-forms the ledger's last range (already recorded): its rows go in by
        what is missing, not by trusting the token (:meth:`BlockingSink.insert_rows`).

        ``riders`` are other partitions of the topic whose whole buffers go in the same statements
        (:meth:`_riders`): every range is recorded in one ledger insert before the rows, and the
        token names them all. A restart re-forms each partition's last range on its own, trusting no
        token, so a batch of several partitions is re-formed exactly as one of each would be.

        The range is recorded in the same thread call as the batch's first insert: a separate call
        would wait for the event loop between the two, and the loop is busy fetching the next batch.
        """
        if riders and marked:
            raise ValueError("a re-formed range is stored on its own")
        kind, short = self.kinds[tp.topic], self.shorts[tp.topic]
        ranges = batch_ranges(tp, lo, hi, riders)
        token = batch_token(ranges)
        if riders:
            messages = [*messages, *(m for r in riders for m in r.messages)]
        recorded = marked
        sink = self.sinks[lane]

        def record() -> None:
            nonlocal recorded
            if not recorded:
                sink.mark_ranges(ranges)
                recorded = True

        rows, python_path = 0, messages
        if kind == "committed":
            # The fast path: ClickHouse maps and proves the raw records; only the rest is decoded here.
            proven, python_path = await self._insert_log(messages, token, reform=marked, before=record, lane=lane)
            rows += proven
        good, bad = split_batch(kind, python_path) if python_path else (None, [])
        if good is not None:
            mapped = good
            rows += len(good[2][0])
            mapped_token = token + "/py" if kind == "committed" else token

            def insert_mapped(retry: bool) -> None:
                record()
                sink.insert_rows(*mapped, mapped_token, reform=marked or retry)

            await retrying(f"insert of {len(good[2][0])} {kind} rows ({mapped_token})", insert_mapped, table=short)
        if bad:
            log.error("%d %s records of %s cannot be stored as %s; kept in rejections", len(bad), short, token, kind)

            def insert_rejected(retry: bool) -> None:
                record()
                sink.insert_records("rejection", bad, token + "/rejected", reform=marked or retry)

            await retrying(f"insert of {len(bad)} sink rejections ({token})", insert_rejected, table=short)
            METRICS.inc("agentlog_sink_rejected_total", len(bad), table=short)
        if not recorded:
            await retrying(f"recording range {token}", lambda _retry: record(), table=short)
        METRICS.inc("agentlog_sink_batches_total", table=short)
        METRICS.inc("agentlog_sink_rows_total", rows, table=short)
        oldest_ms = min((m.timestamp for m in messages if m.timestamp), default=None)
        if oldest_ms is not None:
            METRICS.set("agentlog_sink_lag_seconds", max(0.0, time.time() - oldest_ms / 1000), table=short)
        self._commits[tp] = hi + 1
        for rider in riders:
            self._commits[rider.tp] = rider.hi + 1

    def _commit_stored(self) -> None:
        """Commit the stored ranges' ends to the group, in the background (lag tooling only: the sink
        resumes from its ledger), one commit at a time; not in :meth:`flush`, where its round trip
        would hold the next batch back."""
        if self.consumer is None or not self._commits or (self._committing and not self._committing.done()):
            return
        offsets, self._commits = self._commits, {}
        consumer = self.consumer

        async def commit() -> None:
            with contextlib.suppress(Exception):
                await consumer.commit({tp: o for tp, o in offsets.items() if tp in consumer.assignment()})

        self._committing = asyncio.ensure_future(commit())

    async def _insert_log(self, messages: list[Any], token: str, *, reform: bool,
                          before: Callable[[], None] | None = None, lane: int = 0) -> tuple[int, list[Any]]:
        """Insert a log batch through :meth:`BlockingSink.insert_log`; returns (rows proven there,
        the messages left for the Python path, in offset order). ``before()`` runs first, in the
        same thread call (the ledger row).

        A record that cannot be one ``LineAsString`` line (no value, empty, a raw line break: never
        JCS) skips ClickHouse. If ClickHouse stages another number of lines than it was sent, the
        whole batch takes the Python path (nothing was inserted: the count is checked first).
        """
        lines = [m for m in messages if m.value and b"\n" not in m.value and b"\r" not in m.value]
        if not lines:
            return 0, messages
        outcome: list[tuple[int, list[bytes]]] = []

        def insert(retry: bool) -> None:
            if before is not None:
                before()
            try:
                outcome.append(self.sinks[lane].insert_log([m.value for m in lines], token, reform=reform or retry))
            except StoreError as e:
                if e.code != "sink_stage_mismatch":
                    raise
                log.error("%s; mapping the batch in Python instead", e)
                outcome.append((0, [m.value for m in lines]))

        await retrying(f"insert of {len(lines)} log records ({token})", insert, table="log")
        proven, unproven = outcome[-1]
        if proven == len(messages):
            return proven, []
        left = collections.Counter(unproven)
        sent = {id(m) for m in lines}
        rest = []
        for m in messages:
            if id(m) in sent:
                if left[m.value] <= 0:
                    continue  # stored by ClickHouse
                left[m.value] -= 1
            rest.append(m)
        METRICS.inc("agentlog_sink_unproven_total", len(rest), table="log")
        return proven, rest

    async def _take(self, tp: TopicPartition, messages: Sequence[Any]) -> None:
        """Buffer a fetch of one partition, keeping batches contiguous; re-form the pending range first."""
        part = self._parts.get(tp)
        if (part is not None and part.pending is None and messages and part.expected is not None
                and messages[0].offset == part.expected):
            # The common case, without a per-record loop: a fetch that continues the buffer. Offsets it
            # skips are absent from the topic (:meth:`_within`), so only their count is looked at.
            if not part.messages:
                part.lo, part.since = part.expected, time.monotonic()
            part.messages.extend(messages)
            if skipped := messages[-1].offset + 1 - part.expected - len(messages):
                self._count_absent(tp, skipped)
            part.expected = messages[-1].offset + 1
            part.jump = None
            messages = ()
        taken: int | None = None  # the offset of this fetch's record taken last
        for m in messages:
            if part is None or self._parts.get(tp) is not part:
                return  # revoked or reassigned meanwhile: the new assignment starts from the ledger
            if part.expected is None:
                part.expected = m.offset
            if m.offset < part.expected:
                continue  # fetched before a seek back; read again in order
            if m.offset > part.expected and not self._within(tp, part, taken, m.offset) \
                    and not self._absent(tp, part, m.offset):
                return  # seeked back to the expected offset: the rest of this fetch comes again
            if part.jump is not None and m.offset < part.jump[1]:
                log.warning("sink: a re-read of %s/%d brought offset %d, which a fetch had skipped (to %d)",
                            tp.topic, tp.partition, m.offset, part.jump[1])
            part.jump = None
            if not part.messages:
                part.lo, part.since = part.expected, time.monotonic()
            part.messages.append(m)
            part.expected = taken = m.offset + 1
            if part.pending is not None and m.offset >= part.pending[1]:
                lo, hi = part.pending
                batch = [x for x in part.messages if x.offset <= hi]
                rest = [x for x in part.messages if x.offset > hi]
                await self._settle(tp)  # a batch of the previous assignment may still be in flight
                if self._parts.get(tp) is not part:
                    return
                await self.flush(tp, batch, lo=lo, hi=hi, marked=True)
                if self._parts.get(tp) is not part:
                    return
                part.pending, part.messages, part.lo, part.since = None, rest, hi + 1, time.monotonic()
        if part is not None and self._parts.get(tp) is part:
            self._hold(tp, part)

    def _within(self, tp: TopicPartition, part: _Partition, taken: int | None, offset: int) -> bool:
        """A record past the expected offset whose fetch also brought the record just before the gap: True.

        A fetch is one broker response, read from one position onwards: what it skips between two of its
        records is absent from the topic (a transaction's commit marker, an aborted or compacted record),
        with no stale fetch or seek in between. The worker's topics skip an offset at every transaction.
        """
        if taken is None or taken != part.expected:
            return False
        self._count_absent(tp, offset - part.expected)
        return True

    def _count_absent(self, tp: TopicPartition, offsets: int) -> None:
        METRICS.inc("agentlog_sink_absent_offsets_total", offsets, table=self.shorts[tp.topic])

    def _absent(self, tp: TopicPartition, part: _Partition, offset: int) -> bool:
        """A record past the expected offset: True if the offsets between are confirmed absent.

        The first time, seek back to the expected offset (a gap can be a stale fetch racing a seek or a
        rebalance) and return False. If the re-read lands on the same record again, the broker has nothing
        in between: return True. On the worker's topics, written in transactions, that is routine when a
        fetch starts right after a transaction's commit marker, an offset no consumer receives, so both steps
        log at DEBUG (and count); a re-read that brings a record the fetch had skipped is the warning
        (:meth:`_take`).
        """
        assert self.consumer is not None and part.expected is not None
        jump = (part.expected, offset)
        if part.jump == jump:
            log.debug("sink: offsets %d-%d of %s/%d are absent (confirmed by a re-read)",
                      jump[0], offset - 1, tp.topic, tp.partition)
            self._count_absent(tp, offset - jump[0])
            return True
        log.debug("sink: %s/%d jumped from expected offset %d to %d; re-reading from %d",
                  tp.topic, tp.partition, jump[0], offset, jump[0])
        METRICS.inc("agentlog_sink_reseeks_total", table=self.shorts[tp.topic])
        part.jump = jump
        self.consumer.seek(tp, jump[0])
        return False

    def _schedule(self) -> int:
        """Start a batch on every free lane, the partitions with the most rows still to store first;
        returns how many buffers are ready but wait for a lane.

        Never waits: the loop fetches on while every lane is busy (up to :meth:`_buffer_full`). A
        partition's buffer is ready when it holds ``BATCH_ROWS`` records, is ``FLUSH_S`` old
        or ends a burst (:meth:`_drained`), and no batch of it is in flight: a partition has one batch
        in flight at a time (:meth:`_store_batch`), so its next range is recorded only once its last
        is stored, because a restart re-forms only the newest range of the ledger.

        The order matters because of that rule: a partition's batches run one after another, so the
        partition with the largest backlog (buffered and not yet fetched: up to its high watermark)
        is the longest chain, and a lane given to a small partition first leaves it waiting at the
        end while the other lane idles (measured with the bench's key spread, 34/29/21/16% of the rows
        in four partitions: smaller partitions first leave the largest partition's batches to the end).
        """
        busy = {lane for _task, lane in self._inflight.values()}
        free = [lane for lane in range(len(self.sinks)) if lane not in busy]
        now = time.monotonic()
        ready = [(tp, part) for tp, part in self._parts.items()
                 if tp not in self._inflight and part.pending is None and part.messages
                 and (len(part.messages) >= BATCH_ROWS
                      or now - part.since >= FLUSH_S or self._drained(tp, part))]
        ready.sort(key=lambda item: self._backlog(*item), reverse=True)
        taken: set[TopicPartition] = set()
        for tp, part in ready:
            if not free:
                break
            if tp in taken:
                continue  # rode along with a batch started just before
            taken.add(tp)
            self._start(tp, part, free.pop(0), taken)
        return sum(1 for tp, _part in ready if tp not in taken)

    def _riders(self, tp: TopicPartition, rows: int,
                taken: set[TopicPartition]) -> list[tuple[TopicPartition, _Partition]]:
        """The other partitions of ``tp``'s topic whose whole buffers join its batch of ``rows`` rows.

        Under a steady load that the sink keeps up with, every partition's buffer goes when it is
        ``FLUSH_S`` old, a few hundred records each, and a batch's statements cost the same
        whether they carry 800 rows or 3,000: about 55 ms of chdb CPU per log batch besides ~7 µs a
        row (``BlockingSink.insert_log`` alone: 73 µs a row at 800-row batches, 23 at
        3,200, 11 at 12,800). So the partitions not storing a batch go along, ready or not, while the
        batch stays within ``BATCH_ROWS``: fewer statements and parts, and no buffer waits longer
        for it. A backlog fills batches by itself, one partition each, on as many lanes as are free.
        """
        cap = BATCH_ROWS
        out = []
        for other, part in sorted(self._parts.items(), key=lambda item: item[0].partition):
            if (other.topic != tp.topic or other in taken or other in self._inflight or part.pending is not None
                    or not part.messages or rows + len(part.messages) > cap):
                continue
            rows += len(part.messages)
            out.append((other, part))
        return out

    def _start(self, tp: TopicPartition, part: _Partition, lane: int, taken: set[TopicPartition]) -> None:
        """Store the partition's buffer as one batch on ``lane``, in the background: all of it, or
        :attr:`_max_batch` records if the rest would still make a batch (no small batch left behind),
        with the buffers of :meth:`_riders` (added to ``taken``).

        chdb releases the GIL while a statement runs (measured: a Python thread kept its full pace
        beside a 12 s query), so ClickHouse works on this batch while the event loop fetches and
        buffers the next. Batches of different partitions go on different lanes at once, up to
        ``LANES`` (:meth:`_open_lanes`).
        """
        whole = len(part.messages) < self._max_batch + BATCH_ROWS
        messages, lo = (part.messages if whole else part.messages[:self._max_batch]), part.lo
        part.messages = part.messages[len(messages):]
        hi = messages[-1].offset
        if part.messages:
            part.lo, part.since = hi + 1, time.monotonic()
        part.burst = len(messages) >= self._burst_rows
        self._hold(tp, part)
        riders: list[Rider] = []
        for other, rider in self._riders(tp, len(messages), taken):
            batch, rider.messages = rider.messages, []
            rider.burst = len(batch) >= self._burst_rows
            self._hold(other, rider)
            riders.append(Rider(other, rider, batch, rider.lo, batch[-1].offset))
            taken.add(other)
        task = asyncio.ensure_future(self._store_batch(tp, part, messages, lo=lo, hi=hi, lane=lane, riders=riders))
        self._inflight[tp] = (task, lane)
        for r in riders:
            self._inflight[r.tp] = (task, lane)

    def _hold(self, tp: TopicPartition, part: _Partition) -> None:
        """Pause fetching a partition while its buffer holds its next batch at the most (:attr:`_max_batch`
        and ``BATCH_ROWS`` more: see :meth:`_start`) and resume it below that: more would only wait
        for its batch in flight, and the fetch goes on for the partitions that can use a free lane (the
        bound of :meth:`_buffer_full` applies only while every lane is busy)."""
        assert self.consumer is not None
        # (a range to re-form is read to its end whatever its length: it may predate this bound)
        full = part.pending is None and len(part.messages) >= self._max_batch + BATCH_ROWS
        if full and tp not in self._held and tp in self.consumer.assignment():
            self.consumer.pause(tp)
            self._held.add(tp)
        elif not full and tp in self._held:
            self._held.discard(tp)
            if tp in self.consumer.assignment():
                self.consumer.resume(tp)

    def _backlog(self, tp: TopicPartition, part: _Partition) -> int:
        """Rows of the partition still to store: buffered, and on the broker past them (as of the last fetch)."""
        assert self.consumer is not None
        high = self.consumer.highwater(tp)
        return max(len(part.messages), (high - part.lo) if high is not None else 0)

    @property
    def _max_batch(self) -> int:
        """A buffer that grew while its partition's last batch was stored goes as one batch (fewer
        statements and parts): all of it while shorter than this and ``BATCH_ROWS`` more, else this
        many records (twice ``BATCH_ROWS``) and the rest after them (:meth:`_start`)."""
        return 2 * max(1, BATCH_ROWS)

    def _buffer_full(self) -> bool:
        """True when every lane is busy and the buffers hold enough for every lane and two batches more:
        the loop waits for a batch to be stored instead of fetching (the bound on what the sink holds in
        memory; with a lane free it fetches on for a partition that can use it, see :meth:`_hold`)."""
        if len({lane for _task, lane in self._inflight.values()}) < len(self.sinks):
            return False
        buffered = sum(len(part.messages) for part in self._parts.values())
        return buffered >= (len(self.sinks) + 2) * max(1, BATCH_ROWS)

    async def _reap(self) -> None:
        """Forget the batches stored meanwhile; re-raises what their tasks raised (see :meth:`_settle`)."""
        for tp, (task, _lane) in list(self._inflight.items()):
            if task.done():
                await self._settle(tp)

    def _drained(self, tp: TopicPartition, part: _Partition) -> bool:
        """True when the partition's buffer should go now: the broker holds nothing after it (its
        high watermark, as of the last fetch), and it is a burst's: at least 1/:data:`DRAINED_FRACTION`
        of a batch, or the rest after a batch that was.

        So the end of a burst is stored at once instead of ``FLUSH_S`` later, while a trickle
        (every fetch drains the partition) still gathers for ``FLUSH_S``: flushed per fetch, it
        would write a part (and a ledger row) per few records.
        """
        assert self.consumer is not None
        high = self.consumer.highwater(tp)
        return (high is not None and part.expected is not None and part.expected >= high
                and (part.burst or len(part.messages) >= self._burst_rows))

    @property
    def _burst_rows(self) -> int:
        return max(1, BATCH_ROWS // DRAINED_FRACTION)

    async def _settle(self, tp: TopicPartition | None = None) -> None:
        """Wait until the partition's batch in flight (every partition's: ``tp=None``) is stored;
        re-raises what its task raised (not an Exception: :meth:`_store_batch` recovers from those)."""
        for key in ([tp] if tp is not None else list(self._inflight)):
            entry = self._inflight.get(key)
            if entry is None:
                continue
            try:
                await entry[0]
            finally:
                if self._inflight.get(key) is entry:
                    del self._inflight[key]

    async def _store_batch(self, tp: TopicPartition, part: _Partition, messages: list[Any], *,
                           lo: int, hi: int, lane: int = 0, riders: Sequence[Rider] = ()) -> None:
        """:meth:`flush` a batch; if it fails, resume the partition from the ledger.

        :meth:`flush` retries the store until it succeeds, so an error here is anything else. The
        batch may be half-stored and the records after it already fetched and buffered: the
        partition's state is dropped (so is that buffer), and the partition is resumed exactly
        as after a restart (:meth:`_assigned`: seek back to the ledger's last range and re-form it),
        which refetches the records from the right offset.
        """
        try:
            await self.flush(tp, messages, lo=lo, hi=hi, marked=False, lane=lane, riders=riders)
        except Exception as e:
            short = self.shorts[tp.topic]
            METRICS.inc("agentlog_sink_errors_total", table=short)
            ranges = batch_ranges(tp, lo, hi, riders)
            log.exception("sink: storing %s failed (%s); resuming %s from the ledger", batch_token(ranges), e,
                          ", ".join(f"{topic}/{partition}" for topic, partition, _lo, _hi in ranges))
            for resumed_tp, resumed in [(tp, part), *((r.tp, r.part) for r in riders)]:
                await self._resume(resumed_tp, resumed)

    async def _resume(self, tp: TopicPartition, part: _Partition) -> None:
        """Forget what the partition fetched and buffered, then start it again from the ledger."""
        if self._parts.get(tp) is not part:
            return  # a rebalance resumed it (or took it away) meanwhile
        self._parts.pop(tp)
        assert self.consumer is not None
        if tp in self.consumer.assignment():
            await self._assigned([tp])

    def _open_lanes(self) -> None:
        """Lanes 1 … ``LANES - 1``: a forked store connection and staging tables each
        (:meth:`agentlog.audit.store.Store.fork`); closed when :meth:`run` ends."""
        store, stage = self.sink.store, self.sink.land.removeprefix("sink_land_")
        while len(self.sinks) < max(1, LANES):
            self.sinks.append(BlockingSink(store.fork(), stage=f"{stage}_{len(self.sinks)}"))

    def _close_lanes(self) -> None:
        """Close the lanes' connections, each once its statement is done (:meth:`BlockingSink.close`)."""
        for sink in self.sinks[1:]:
            sink.close()
        del self.sinks[1:]

    async def run(self, *, started: Callable[[], Awaitable[None]] | None = None) -> None:
        self.consumer = self._new_consumer()
        self.consumer.subscribe(list(self.kinds), listener=self._listener())
        await self.consumer.start()
        try:
            self._open_lanes()
            if started is not None:
                await started()
            poll_ms = max(50, int(FLUSH_S * 1000 / 2))
            while True:
                await self._reap()
                self._commit_stored()
                waiting = self._schedule()
                # getmany returns at once, without yielding, while aiokafka holds fetched records: let
                # the batches just started and those in flight take their turn (their next statement)
                # first, or ClickHouse idles
                await asyncio.sleep(0)
                if self._inflight and self._buffer_full():
                    # enough fetched for every lane (or one partition far ahead of its batch in
                    # flight): wait for a batch to be stored instead of buffering more
                    await asyncio.wait({task for task, _lane in self._inflight.values()},
                                       return_when=asyncio.FIRST_COMPLETED)
                    continue
                # a buffer waiting for a lane is started as soon as one is free, not a long poll later
                data = await self.consumer.getmany(timeout_ms=WAITING_POLL_MS if waiting else poll_ms,
                                                   max_records=BATCH_ROWS)
                if data and self.first_fetch_at is None:
                    self.first_fetch_at = time.perf_counter()
                for tp, messages in data.items():
                    if tp.topic in self.kinds:
                        await self._take(tp, messages)
        finally:
            for task, _lane in list(self._inflight.values()):
                task.cancel()
            for tp in list(self._inflight):
                try:
                    await self._settle(tp)
                except asyncio.CancelledError:
                    pass
                except BaseException as e:  # noqa: BLE001 - the loop already stops with its own error
                    # two lanes can fail at once (a crash taking both batches): the second batch's
                    # error must not skip stopping the consumer and closing the lanes below
                    log.error("sink: a batch of %s/%d also failed while the sink stopped: %r",
                              tp.topic, tp.partition, e)
            if self._committing is not None:
                self._committing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._committing
            await self.consumer.stop()
            if self.sink.store.backend == "server":
                for sink in self.sinks:
                    with contextlib.suppress(Exception):  # best effort: an orphan holds one batch at most
                        await asyncio.get_running_loop().run_in_executor(None, sink.drop_staging)
            await asyncio.get_running_loop().run_in_executor(None, self._close_lanes)


def install(settings: Settings, run_task: Callable[[Callable[[], Awaitable[None]]], object], *,
            shred: Callable[[list[str]], Awaitable[list[str]]] | None = None) -> Store:
    """Open (and migrate) the audit store and hand the sink's loop to ``run_task``; returns the store.

    ``run_task`` starts a no-argument coroutine function and cancels it when its owner stops. The
    worker passes its runner's ``task`` (the Faust app's): the sink is then an asyncio task the app starts and
    cancels, not an agent, so the app's consumer group commit does not wait for it. Taking the
    starter as an argument keeps this package free of the worker (and of Faust). With ``AGENTLOG_RETENTION`` set it
    starts the retention sweeps (:mod:`agentlog.audit.retention`) too, which ``shred`` the expired runs' keys.
    """
    kept = retention.parse_retention(settings.retention)
    store = open_owned(settings)
    sink = AuditSink(settings, store)

    async def audit_sink() -> None:
        await sink.run()

    async def sweeps() -> None:
        await retention.sweeping(store, kept, shred=shred)

    run_task(audit_sink)
    if kept.sweep_s is not None:
        run_task(sweeps)
    return store
