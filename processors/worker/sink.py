"""Audit sink: every output topic → ClickHouse, exactly once, as a plain bulk Kafka consumer.

Not a Faust agent: it needs no table, and Faust's per-record stream machinery is most of
what made the old sink slow. One aiokafka consumer (group ``<prefix>.audit-sink``) reads
all output topics; records are buffered per (topic, partition) and a buffer is flushed as
one batch when it holds ``sink_batch_rows`` records or is ``sink_flush_s`` old.

Exactly-once, after the design of ClickHouse's Kafka Connect sink (state = offset ranges):

1. before inserting the batch ``[lo, hi]`` of a partition, the sink records that range in
   ``sink_offsets`` (ClickHouse itself, the same store as the data);
2. the batch is inserted with ``insert_deduplication_token = <topic>/<partition>/<lo>-<hi>``;
   the tables keep a deduplication window, so inserting the same range twice stores it once
   (their materialized views skip the duplicate too);
3. on (re)assignment the sink reads the last range per partition: it seeks to ``lo``,
   re-forms exactly ``[lo, hi]`` and inserts it with the same token — a no-op if the crash
   came after the insert, the missing rows if it came before — then carries on from ``hi + 1``.

Records the topics hold twice (at-least-once producers) are dropped by natural key before
the insert (:meth:`BlockingSink.insert_records`). So ``SELECT count()`` (no FINAL) equals
the records sent, whatever was killed when. Kafka
offsets are committed too, but only for lag tooling: the sink never resumes from them.

A record that cannot be decoded or mapped is not skipped silently: it goes to the
``rejections`` table (reason ``sink_undecodable`` / ``sink_unmappable``, raw bytes kept) in
the same exactly-once way, and the rest of its batch is inserted. A failing insert is
retried with backoff, never dropped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from processors.audit.migrations import open_owned
from processors.audit.rows import rows_for
from processors.audit.store import Store
from processors.metrics import METRICS
from processors.worker.wiring import Wiring
from schemas.errors import StoreError
from streams.codec import decode_record
from streams.settings import Settings
from streams.topics import topic_name

log = logging.getLogger("agentlog.sink")

#: topic short name -> record kind understood by :meth:`processors.audit.store.Store.insert_records`
SINK_TOPICS = {
    "log": "committed",
    "transitions": "transition",
    "violations": "violation",
    "rejections": "rejection",
    "snapshots": "snapshot",
    "digests": "digest",  # quiet once the log carries stateHash (format 2); kept for old data
    "verdicts": "verdict",
}


#: The natural key of each table's records (0001's ReplacingMergeTree keys): one row per key.
NATURAL_KEYS: dict[str, tuple[str, ...]] = {
    "events": ("run_id", "sequence"),
    "transitions": ("parent_run_id", "dispatch_id", "phase"),
    "violations": ("run_id", "sequence", "event_id", "code"),
    "rejections": ("source_topic", "source_partition", "source_offset"),
    "snapshots": ("run_id", "at_sequence"),
    "state_digests": ("run_id", "sequence"),
    "replay_verdicts": ("source_run_id", "replay_run_id", "record_hash"),
}


class BlockingSink:
    """Serialises statements on one store from the event loop (chdb is in-process and blocking)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()

    def insert_records(self, kind: str, records: list[dict[str, Any]], token: str) -> int:
        """Map ``records`` and :meth:`insert_rows` them."""
        return self.insert_rows(*rows_for(kind, records), token)

    def insert_rows(self, table: str, names: tuple[str, ...], cols: list[list[Any]], token: str) -> int:
        """Insert the rows whose natural key is not stored yet, with ``token``; returns rows inserted.

        The log and the other output topics are written at least once (a producer retry or a
        processor crash re-emits a record at a new offset), so one natural key can occur at two
        offsets. Those copies are dropped here, by key, against the table and within the batch.
        Sound with the token because one insert is one part: after a crash it either all landed
        (same token: dropped) or none did (the check sees only earlier batches).
        """
        with self._lock:
            keep = self._new_rows(table, names, cols)
            if len(keep) != len(cols[0]):
                cols = [[col[i] for i in keep] for col in cols]
            if not keep:
                return 0
            return self.store.insert(table, cols, names, column_oriented=True, dedup_token=token)

    def _new_rows(self, table: str, names: tuple[str, ...], cols: list[list[Any]]) -> list[int]:
        key_cols = NATURAL_KEYS[table]
        idx = [names.index(k) for k in key_cols]
        keys = list(zip(*(cols[i] for i in idx), strict=True))
        first = sorted({k[0] for k in keys})
        where = f"{key_cols[0]} IN {{first:Array(String)}}"
        params: dict[str, Any] = {"first": first}
        second = [k[1] for k in keys]
        if len(key_cols) > 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in second):
            where += f" AND {key_cols[1]} BETWEEN {{lo:Int64}} AND {{hi:Int64}}"
            params.update(lo=min(second), hi=max(second))
        stored = {tuple(r) for r in self.store.query(
            f"SELECT {', '.join(key_cols)} FROM {table} WHERE {where}", params).rows}
        keep: list[int] = []
        for i, k in enumerate(keys):
            if k not in stored:
                stored.add(k)
                keep.append(i)
        return keep

    def mark(self, topic: str, partition: int, lo: int, hi: int) -> None:
        with self._lock:
            self.store.insert("sink_offsets", [[topic, partition, lo, hi]], ["topic", "partition", "lo", "hi"])

    def last_range(self, topic: str, partition: int) -> tuple[int, int] | None:
        with self._lock:
            rows = self.store.query(
                "SELECT argMax(lo, hi), max(hi), count() FROM sink_offsets "
                "WHERE topic = {t:String} AND partition = {p:Int32}", {"t": topic, "p": partition}).rows
        lo, hi, n = rows[0]
        return (int(lo), int(hi)) if n else None


async def retrying(what: str, fn: Callable[[], Any], *, table: str) -> None:
    """Run a blocking store call in a thread until it succeeds; an audit row is never dropped."""
    delay = 0.5
    loop = asyncio.get_running_loop()
    while True:
        try:
            await loop.run_in_executor(None, fn)
            return
        except Exception as e:
            METRICS.inc("agentlog_sink_errors_total", table=table)
            log.error("%s failed (%s); retrying in %.1fs", what, e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


@dataclass
class _Buffer:
    messages: list[Any] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


def token_for(topic: str, partition: int, lo: int, hi: int) -> str:
    """The insert deduplication token of a batch: its offset range, nothing else."""
    return f"{topic}/{partition}/{lo}-{hi}"


Mapped = tuple[str, tuple[str, ...], list[list[Any]]]


def split_batch(kind: str, messages: Sequence[Any]) -> tuple[Mapped | None, list[dict[str, Any]]]:
    """Decode and map a batch: (the kind's table, columns and data — None if no record maps —,
    rejections for the records that cannot go there).

    Mapping is tried on the whole batch first and per record only when that fails, so the
    common case stays one columnar mapping, done once.
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
        return (rows_for(kind, [v for _, v in decoded]) if decoded else None), bad
    except StoreError:
        for m, v in decoded:
            try:
                rows_for(kind, [v])
                good.append(v)
            except StoreError as e:
                reject(m, "sink_unmappable", str(e), v)
    return (rows_for(kind, good) if good else None), bad


class AuditSink:
    """The consumer loop; :meth:`run` until cancelled (started as a task of the worker app)."""

    def __init__(self, settings: Settings, store: Store, *,
                 topics: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.sink = BlockingSink(store)
        self.kinds = {topic_name(settings, short): kind for short, kind in (topics or SINK_TOPICS).items()}
        self.shorts = {topic_name(settings, short): short for short in (topics or SINK_TOPICS)}
        self._buffers: dict[TopicPartition, _Buffer] = {}
        # ranges recorded in sink_offsets that may be half-written: re-form exactly these first
        self._pending: dict[TopicPartition, tuple[int, int]] = {}
        self.consumer: AIOKafkaConsumer | None = None

    async def _assigned(self, tps: Sequence[TopicPartition]) -> None:
        assert self.consumer is not None
        loop = asyncio.get_running_loop()
        for tp in tps:
            self._buffers.pop(tp, None)
            last = await loop.run_in_executor(None, self.sink.last_range, tp.topic, tp.partition)
            if last is None:
                await self.consumer.seek_to_beginning(tp)
                self._pending.pop(tp, None)
            else:
                self._pending[tp] = last
                self.consumer.seek(tp, last[0])
                log.info("sink resumes %s/%d by re-forming offsets %d-%d", tp.topic, tp.partition, *last)

    def _revoked(self, tps: Sequence[TopicPartition]) -> None:
        # Unflushed buffers have no sink_offsets row yet: the next owner reads them again.
        for tp in tps:
            self._buffers.pop(tp, None)
            self._pending.pop(tp, None)

    def _listener(self) -> ConsumerRebalanceListener:
        sink = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
                sink._revoked(revoked)

            async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
                await sink._assigned(assigned)

        return Listener()

    async def flush(self, tp: TopicPartition, messages: list[Any], *, lo: int, hi: int, marked: bool) -> None:
        """Insert one batch exactly once: record its range (unless re-forming one), then insert with its token."""
        kind, short = self.kinds[tp.topic], self.shorts[tp.topic]
        token = token_for(tp.topic, tp.partition, lo, hi)
        if not marked:
            await retrying(f"recording range {token}", lambda: self.sink.mark(tp.topic, tp.partition, lo, hi),
                           table=short)
        good, bad = split_batch(kind, messages)
        rows = len(good[2][0]) if good is not None else 0
        if good is not None:
            mapped = good
            await retrying(f"insert of {rows} {kind} rows ({token})",
                           lambda: self.sink.insert_rows(*mapped, token), table=short)
        if bad:
            log.error("%d %s records of %s cannot be stored as %s; kept in rejections", len(bad), short, token, kind)
            await retrying(f"insert of {len(bad)} sink rejections ({token})",
                           lambda: self.sink.insert_records("rejection", bad, token + "/rejected"), table=short)
            METRICS.inc("agentlog_sink_rejected_total", len(bad), table=short)
        METRICS.inc("agentlog_sink_batches_total", table=short)
        METRICS.inc("agentlog_sink_rows_total", rows, table=short)
        oldest_ms = min((m.timestamp for m in messages if m.timestamp), default=None)
        if oldest_ms is not None:
            METRICS.set("agentlog_sink_lag_seconds", max(0.0, time.time() - oldest_ms / 1000), table=short)
        if self.consumer is not None:
            with contextlib.suppress(Exception):  # lag tooling only; the sink resumes from sink_offsets
                await self.consumer.commit({tp: hi + 1})

    async def _take(self, tp: TopicPartition, messages: Sequence[Any]) -> None:
        buf = self._buffers.setdefault(tp, _Buffer())
        for m in messages:
            pending = self._pending.get(tp)
            if pending is not None and m.offset < pending[0]:
                continue
            buf.messages.append(m)
            if pending is not None and m.offset >= pending[1]:
                batch = [x for x in buf.messages if x.offset <= pending[1]]
                rest = [x for x in buf.messages if x.offset > pending[1]]
                await self.flush(tp, batch, lo=pending[0], hi=pending[1], marked=True)
                del self._pending[tp]
                buf = self._buffers[tp] = _Buffer(rest)
        if tp not in self._pending and len(buf.messages) >= self.settings.sink_batch_rows:
            await self._flush_buffer(tp)

    async def _flush_buffer(self, tp: TopicPartition) -> None:
        buf = self._buffers.pop(tp, None)
        if buf is None or not buf.messages:
            return
        await self.flush(tp, buf.messages, lo=buf.messages[0].offset, hi=buf.messages[-1].offset, marked=False)

    async def run(self, *, started: Callable[[], Awaitable[None]] | None = None) -> None:
        s = self.settings
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap,
            group_id=f"{s.topic_prefix}.audit-sink",
            client_id=f"{s.worker_id}-sink",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=s.sink_batch_rows,
            session_timeout_ms=int(s.session_timeout_s * 1000),
            rebalance_timeout_ms=int(s.rebalance_timeout_s * 1000),
        )
        self.consumer.subscribe(list(self.kinds), listener=self._listener())
        await self.consumer.start()
        try:
            if started is not None:
                await started()
            poll_ms = max(50, int(s.sink_flush_s * 1000 / 2))
            while True:
                data = await self.consumer.getmany(timeout_ms=poll_ms, max_records=s.sink_batch_rows)
                for tp, messages in data.items():
                    if tp.topic in self.kinds:
                        await self._take(tp, messages)
                now = time.monotonic()
                for tp, buf in list(self._buffers.items()):
                    if tp not in self._pending and buf.messages and now - buf.since >= s.sink_flush_s:
                        await self._flush_buffer(tp)
        finally:
            await self.consumer.stop()


def install(wiring: Wiring) -> None:
    """Open (and migrate) the audit store and start the sink as a task of the worker app.

    Faust is touched only here: the sink is an asyncio task the app starts and cancels,
    not an agent, so the app's consumer group commit does not wait for it.
    """
    wiring.store = open_owned(wiring.settings)
    sink = AuditSink(wiring.settings, wiring.store)

    @wiring.app.task  # type: ignore[untyped-decorator]  # faust's App.task is @no_type_check
    async def audit_sink() -> None:
        await sink.run()
