"""The publisher SDK: how an agent host writes the events of a run to the ingest topic.

A run handle assigns what a host should never get wrong by hand — a time-ordered
eventId, a contiguous sequence, the causation link, an RFC 3339 timestamp — and
validates each event against the contract *before* it leaves the process, so a bad
event is an exception at the call site instead of a rejection record downstream.

Delivery guarantee
------------------
* ``emit`` returns once the record is in the publisher's in-memory batch for its
  partition (handed to the producer when full, after ``linger_ms``, or at ``flush``).
  It is not yet durable; a process crash at this point loses it.
* ``flush`` (and ``close`` / leaving ``async with``) waits until every buffered
  record is acknowledged by all in-sync replicas (``acks="all"``) and raises
  :class:`PublishError` listing every record that could not be delivered. When
  ``flush`` returns without raising, everything emitted before it is on the broker.
* ``emit_and_wait`` returns only after the broker acknowledged that one record.
* The producer is idempotent (``enable_idempotence=True``): its internal retries
  never write a record twice and keep per-partition order, so within one
  Publisher the events of a run land on their partition in sequence order, once.
  Across Publisher instances (a host restart re-sending events) duplicates are
  possible; the sequencer drops them by ``(runId, sequence)`` / ``eventId``.
* A failed delivery leaves a hole in the run's sequence; :class:`PublishError`
  carries the failed docs so the host can re-send them unchanged with
  :meth:`Publisher.resend` (same eventId and sequence, so a record that did land
  after all is dropped as a duplicate).

Decisions
---------
Acknowledged is not committed: the sequencer decides each record a moment later, and
writes it to the log or to ``rejections`` (a sequence gap, a dangling causation, …).
With ``Publisher(track_decisions=True)``, ``await pub.decisions()`` waits for the answer
on every record sent since the last call (:class:`Decision`); ``publish_docs(wait=True)``
does the same for a batch of ready-made docs. A worker must be running to decide.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.partitioner import murmur2

from agentlog.schemas.cachekey import RECIPE_IDS, cache_key
from agentlog.schemas.errors import AgentlogError, ConfigError, ContractError, InfraError
from agentlog.schemas.validate import validate_doc, validate_minted
from agentlog.streams.admin import ensure_topics
from agentlog.streams.codec import encode_avro, encode_json
from agentlog.streams.reader import Marks, TopicTail, end_marks
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings, load_settings
from agentlog.streams.topics import topic_name

Wire = Literal["avro", "json"]
T = TypeVar("T")

# Shared by the SDK and the bench baseline. linger lets a burst of emits share a batch
# (the throughput lever); 5 ms is below what an LLM-driven host notices.
DEFAULT_LINGER_MS = 5
DEFAULT_MAX_BATCH_BYTES = 512 * 1024
# Headroom over max_event_bytes for the Avro envelope and record overhead.
_REQUEST_OVERHEAD = 64 * 1024


class PublishError(AgentlogError):
    """Some emitted events were not acknowledged by the broker.

    ``failed`` holds ``(doc, exception)`` pairs; re-send the docs unchanged with
    ``Publisher.resend`` once the broker is healthy (``agentlog infra status``).
    """

    code = "publish_failed"

    def __init__(self, message: str, failed: list[tuple[dict[str, Any], BaseException]]) -> None:
        super().__init__(message)
        self.failed = failed


# --- ids and timestamps -------------------------------------------------------------------


class _UUIDv7:
    """RFC 9562 UUIDv7: 48-bit Unix ms, then random bits; monotonic within this process.

    Within one millisecond the 12-bit ``rand_a`` field is used as a counter seeded at a
    random value, so ids minted by one process sort in mint order (RFC 9562 §6.2, method 1).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0

    def __call__(self, now_ms: int | None = None) -> str:
        ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        rand = int.from_bytes(os.urandom(10), "big")  # 16 bits of counter seed + 62 of rand_b
        with self._lock:
            if ms <= self._last_ms:
                ms = self._last_ms
                self._counter += 1
                if self._counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                    ms += 1
                    self._counter = (rand >> 64) & 0x7FF
            else:
                self._counter = (rand >> 64) & 0x7FF  # seed in the lower half: leave room to count up
            self._last_ms = ms
            counter = self._counter
        value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | (rand & _RAND_B)
        h = f"{value:032x}"  # str(uuid.UUID(int=...)) costs as much again; this is the same text
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_RAND_B = (1 << 62) - 1
uuid7 = _UUIDv7()


def uuid7_time_ms(event_id: str) -> int:
    """The Unix-ms timestamp embedded in a UUIDv7."""
    return uuid.UUID(event_id).int >> 80


def rfc3339_ms(ms: int) -> str:
    """``2025-01-02T03:04:05.678Z`` — UTC, millisecond precision, ``Z`` suffix."""
    seconds, millis = divmod(ms, 1000)
    global _ts_cache
    cached = _ts_cache  # one read: another thread may swap the tuple
    if cached[0] != seconds:  # strftime is most of the cost; a host emits many events per second
        cached = (seconds, datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S."))
        _ts_cache = cached
    return f"{cached[1]}{millis:03d}Z"


_ts_cache: tuple[int, str] = (-1, "")


def _causation_id(caused_by: str | dict[str, Any] | None) -> str | None:
    if caused_by is None or isinstance(caused_by, str):
        return caused_by
    try:
        event_id: str = caused_by["eventId"]
        return event_id
    except (KeyError, TypeError) as e:
        raise ContractError(
            "caused_by must be an eventId or a doc returned by emit", code="invalid_envelope"
        ) from e


# --- the sequencer's decisions -------------------------------------------------------------

#: Where the sequencer answers for an ingest record: a committed log record or a rejection, each
#: naming the record's ingest position in its ``source``.
DECISION_TOPICS = ("log", "rejections")

#: How long a wait for decisions goes on without a new one before it gives up: a running worker
#: decides a record in well under a second, and one that is starting takes a few seconds to join.
DECISION_TIMEOUT_S = 30.0

Outcome = Literal["accepted", "rejected", "already_committed"]

#: The rejection reason of an event whose eventId the run's log holds already (an earlier send of it).
ALREADY_COMMITTED = "duplicate_event_id"


@dataclass(frozen=True, slots=True)
class Decision:
    """The sequencer's answer for one record sent to the ingest topic, found by the record's position.

    ``accepted``: committed to the log. ``rejected``: on the rejections topic with ``reason`` and
    ``detail``. ``already_committed``: refused as ``duplicate_event_id`` — its eventId is in the
    run's log already, from an earlier send (a re-published file), so nothing new is committed;
    the store does not compare the two docs, an eventId names one event.
    ``doc`` is the doc sent, where the caller knows it (:meth:`Publisher.decisions`).
    """

    partition: int
    offset: int
    outcome: Outcome
    reason: str | None = None
    detail: str | None = None
    doc: dict[str, Any] | None = None


class DecisionTimeout(AgentlogError):
    """No decision arrived for some records sent: no worker is running, or it is far behind.

    ``decided`` holds the decisions that did arrive (by ``(partition, offset)``), ``undecided``
    the positions still without one. The records stay on the ingest topic and a worker decides
    them when it runs; start one (``agentlog worker``) and read the outcome from the log and
    the rejections topic, or wait longer.
    """

    code = "no_decision"

    def __init__(self, message: str, decided: dict[tuple[int, int], Decision],
                 undecided: list[tuple[int, int]]) -> None:
        super().__init__(message)
        self.decided = decided
        self.undecided = undecided


def read_decision(short_name: str, value: dict[str, Any], ingest_topic: str) -> Decision | None:
    """The decision a ``log`` or ``rejections`` record states for an ``ingest_topic`` record; None: not one."""
    source = value.get("source")
    if not isinstance(source, dict) or source.get("topic") != ingest_topic:
        return None  # e.g. a rejected OTLP span: its source is no ingest record
    partition, offset = source.get("partition"), source.get("offset")
    if type(partition) is not int or type(offset) is not int:
        return None
    if short_name == "log":
        return Decision(partition, offset, "accepted")
    reason = value.get("reason")
    reason = reason if isinstance(reason, str) else None
    detail = value.get("detail")
    return Decision(partition, offset, "already_committed" if reason == ALREADY_COMMITTED else "rejected",
                    reason, detail if isinstance(detail, str) else None)


async def wait_decisions(
    settings: Settings,
    sent: Iterable[tuple[int, int]],
    *,
    since: Marks,
    ingest_topic: str,
    timeout_s: float = DECISION_TIMEOUT_S,
    on_progress: Callable[[int], None] | None = None,
) -> dict[tuple[int, int], Decision]:
    """The sequencer's decision for each ``(partition, offset)`` of ``ingest_topic`` in ``sent``.

    Reads ``log`` and ``rejections`` from ``since`` — their end offsets taken before the records
    were sent (:func:`agentlog.streams.reader.end_marks`), so no history is scanned — until every
    position has a decision. A decision seen twice (the worker redelivered its input) counts once:
    the first is kept. ``on_progress(n)`` is called with the number decided as it grows.

    Raises:
        DecisionTimeout: ``timeout_s`` passed without a new decision while some were undecided.
    """
    wanted = set(sent)
    decided: dict[tuple[int, int], Decision] = {}
    if not wanted:
        return decided
    loop = asyncio.get_running_loop()
    async with TopicTail(settings, since) as tail:
        last_news = loop.time()
        while len(decided) < len(wanted):
            quiet = loop.time() - last_news
            if quiet >= timeout_s:
                undecided = sorted(wanted - decided.keys())
                raise DecisionTimeout(
                    f"no decision arrived for {len(undecided)} of {len(wanted)} events sent to {ingest_topic} "
                    f"in {timeout_s:g}s; a worker must be running to decide them (`agentlog worker`). They stay "
                    "on the topic and are decided when one runs", decided, undecided)
            before = len(decided)
            for short, _, _, value in await tail.poll(min(timeout_s - quiet, 1.0)):
                decision = read_decision(short, value, ingest_topic)
                if decision is None:
                    continue
                position = (decision.partition, decision.offset)
                if position in wanted and position not in decided:
                    decided[position] = decision
            if len(decided) > before:
                last_news = loop.time()
                if on_progress is not None:
                    on_progress(len(decided))
    return decided


# --- the async publisher --------------------------------------------------------------------


class Publisher:
    """An idempotent producer bound to the ingest topic; hands out run handles.

    Use as ``async with Publisher(settings) as pub:``. Keyword-only options:
    ``bootstrap`` overrides ``settings.kafka_bootstrap``; ``topic`` overrides the full
    topic name (default ``<prefix>.ingest``); ``wire`` picks Avro (default, what the
    store prefers) or JCS JSON; ``ensure`` creates missing catalogue topics at start;
    ``track_decisions`` remembers where each record landed, so :meth:`decisions` can wait
    for the sequencer's answer on every record sent.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        bootstrap: str | None = None,
        topic: str | None = None,
        wire: Wire = "avro",
        linger_ms: int = DEFAULT_LINGER_MS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        ensure: bool = True,
        client_id: str = "agentlog-publisher",
        track_decisions: bool = False,
    ) -> None:
        if wire not in ("avro", "json"):
            raise ConfigError(f"wire must be 'avro' or 'json', not {wire!r}")
        settings = settings or load_settings()
        if bootstrap:
            settings = settings.replace(kafka_bootstrap=bootstrap)
        self.settings = settings
        self.topic = topic or topic_name(settings, "ingest")
        self.wire: Wire = wire
        self._ensure = ensure
        self._producer = AIOKafkaProducer(
            **client_kwargs(settings),
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_batch_size=max_batch_bytes,
            max_request_size=settings.max_event_bytes + _REQUEST_OVERHEAD,
        )
        self._linger_s = linger_ms / 1000
        # Records are appended to one open batch per partition (aiokafka's BatchBuilder) and
        # the batch is handed to the producer whole: per record, send() costs several times
        # what appending does (metadata checks, a future and its metadata per record).
        self._open: dict[int, _OpenBatch] = {}
        self._submit_locks: dict[int, asyncio.Lock] = {}
        # One entry per submitted batch: its delivery future and its docs; settled ones are
        # pruned in bulk, failures remembered per doc for ``flush``.
        self._pending: list[tuple[asyncio.Future[Any], list[dict[str, Any]]]] = []
        self._failed: list[tuple[dict[str, Any], BaseException]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._partitions: int | None = None
        # With track_decisions: each record sent (doc, its batch's future, its offset in the batch)
        # and the decision topics' end offsets taken before it was sent (see ``decisions``).
        self._track = track_decisions
        self._tracked: list[tuple[dict[str, Any], asyncio.Future[Any], int]] = []
        self._marks: Marks | None = None
        self._started = False
        self._closed = False

    async def start(self) -> None:
        if self._started:
            return
        try:
            if self._ensure:
                await ensure_topics(self.settings)
            await self._producer.start()
        except KafkaConnectionError as e:
            raise InfraError(
                f"cannot reach Kafka at {self.settings.kafka_bootstrap} ({e}); run `agentlog infra up`"
            ) from e
        if self._track:
            try:
                self._marks = await end_marks(self.settings, DECISION_TOPICS)
            except BaseException:
                await self._producer.stop()
                raise
        self._started = True

    async def __aenter__(self) -> Publisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def run(self, run_id: str, *, start_sequence: int = 0, engine_version: str | None = None) -> Run:
        """A handle that emits the events of ``run_id`` from ``start_sequence`` on."""
        return Run(self, run_id, start_sequence=start_sequence, engine_version=engine_version)

    # -- sending --

    async def partition_of(self, run_id: str) -> int:
        """The partition the default (murmur2) partitioner picks for ``run_id`` on this topic."""
        if self._partitions is None:
            self._partitions = len(await self._producer.partitions_for(self.topic))
        h: int = murmur2(run_id.encode())
        return (h & 0x7FFFFFFF) % self._partitions

    async def send_doc(self, doc: dict[str, Any], *, partition: int | None = None,
                       payload_json: bytes | None = None) -> asyncio.Future[Any]:
        """Enqueue one already-validated doc (key = runId); return its delivery future.

        ``partition``, when given, must be ``partition_of(runId)`` (a run handle caches
        it); it only saves re-hashing the key. ``payload_json``, when given, must be
        ``jcs(doc["payload"])`` (validation computed it; the Avro record carries it as is).
        The future (shared by the records of one batch) settles when the record's batch
        is acknowledged; it is tracked, so ``flush`` reports its failure.
        """
        if not self._started or self._closed:
            raise InfraError("Publisher is not started (use `async with Publisher(...)`) or already closed")
        value = encode_avro(doc, payload_json) if self.wire == "avro" else encode_json(doc)
        if partition is None:
            partition = await self.partition_of(doc["runId"])
        return await self._append(partition, doc["runId"].encode(), value, doc)

    async def _append(self, partition: int, key: bytes, value: bytes, doc: dict[str, Any]) -> asyncio.Future[Any]:
        """Add one record to the partition's open batch; the batch's future is the record's."""
        while True:
            batch = self._open.get(partition)
            fresh = batch is None
            if batch is None:
                batch = self._open[partition] = self._new_batch(partition)
            appended = batch.builder.append(key=key, value=value, timestamp=None)
            if appended is not None:
                batch.docs.append(doc)
                if self._track:  # the record's offset is the batch's base offset plus this one
                    self._tracked.append((doc, batch.acked, appended.offset))
                return batch.acked
            if fresh:  # pragma: no cover - an empty builder takes any first record
                raise InfraError(f"a record of {len(value)} bytes does not fit an empty producer batch")
            # Full: send it. Other emitters may open the partition's next batch while this waits,
            # so look again afterwards rather than replacing whatever is open then.
            await self._submit(partition)

    def _new_batch(self, partition: int) -> _OpenBatch:
        batch = _OpenBatch(self._producer.create_batch(), asyncio.get_running_loop().create_future())
        # Sent after linger_ms at the latest, like the producer's own batches.
        batch.timer = asyncio.get_running_loop().call_later(self._linger_s, self._submit_soon, partition, batch)
        return batch

    def _submit_soon(self, partition: int, batch: _OpenBatch) -> None:
        if self._open.get(partition) is batch:
            task = asyncio.ensure_future(self._submit(partition))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _submit(self, partition: int) -> None:
        """Hand the partition's open batch to the producer (closed: no second linger there).

        Batches of a partition are submitted in the order they were opened: the batch is taken
        off ``_open`` and the partition's lock (first come, first served) entered with no await
        in between, so idempotent sequence numbers follow emit order.
        """
        batch = self._open.pop(partition, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        # Tracked from here on, so a flush that starts while this waits for the lock still waits for it.
        self._pending.append((batch.acked, batch.docs))
        if len(self._pending) >= self._prune_at:
            self._prune()
        lock = self._submit_locks.setdefault(partition, asyncio.Lock())
        try:
            async with lock:
                batch.builder.close()
                fut: asyncio.Future[Any] = await self._producer.send_batch(batch.builder, self.topic,
                                                                           partition=partition)
        except KafkaError as e:
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(e)
        except BaseException as e:  # cancelled (shutdown) or a bug: the batch's records are not delivered
            if not batch.acked.done():
                batch.acked.set_exception(InfraError(f"batch for {self.topic}[{partition}] not handed over: {e!r}"))
            raise
        _chain(fut, batch.acked)

    async def _submit_all(self) -> None:
        for partition in list(self._open):
            await self._submit(partition)

    _prune_at = 1024

    def _prune(self) -> None:
        """Drop settled batches, remembering failures per doc; keeps memory bounded for long-lived publishers."""
        still = []
        for fut, docs in self._pending:
            if not fut.done():
                still.append((fut, docs))
            elif not fut.cancelled() and (exc := fut.exception()) is not None:
                self._failed.extend((doc, exc) for doc in docs)
        self._pending = still
        self._prune_at = max(1024, 2 * len(still))

    async def resend(self, docs: Iterable[dict[str, Any]]) -> None:
        """Re-send docs that a ``PublishError`` reported, unchanged, and wait for them."""
        for doc in docs:
            await self.send_doc(validate_doc(doc, max_bytes=self.settings.max_event_bytes))
        await self.flush()

    async def flush(self) -> None:
        """Wait until every enqueued record is acknowledged; raise ``PublishError`` if any failed."""
        if self._started and not self._closed:
            await self._submit_all()
            if self._background:  # lingered batches being handed over right now
                await asyncio.gather(*list(self._background), return_exceptions=True)
            await self._producer.flush()
        # Every batch holding a record emitted before this call is in _pending by now (a batch is
        # tracked from the moment it leaves the open slot). Wait for those only: emitters that keep
        # going while this waits must not keep it from returning.
        waiting = [fut for fut, _ in self._pending]
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)
        self._prune()
        if self._failed:
            failed, self._failed = self._failed, []
            first = failed[0][1]
            raise PublishError(
                f"{len(failed)} event(s) were not acknowledged by Kafka (first: {first!r}); "
                "re-send them with Publisher.resend(e.failed docs)",
                failed,
            ) from first

    async def decisions(
        self, *, timeout_s: float = DECISION_TIMEOUT_S, on_progress: Callable[[int], None] | None = None,
    ) -> list[Decision]:
        """Flush, then wait for the sequencer's decision on every record sent since the last call.

        Needs ``Publisher(track_decisions=True)``. One :class:`Decision` per record, in the order
        sent, each with its ``doc``; a record that was not delivered has none (``flush`` raised
        ``PublishError`` for it). ``on_progress(n)``: the number decided so far, as it grows.

        Raises:
            DecisionTimeout: ``timeout_s`` passed without a new decision (no worker is running?);
                it holds the decisions that did arrive.
            PublishError: a record was not acknowledged by the broker.
        """
        if not self._track or self._marks is None:
            raise ConfigError("Publisher.decisions() needs Publisher(track_decisions=True), started")
        # The next call's records are sent after these end offsets, so its wait starts at them; the
        # records tracked until now are waited for from the offsets taken before they were sent.
        marks = await end_marks(self.settings, DECISION_TOPICS)
        tracked, self._tracked = self._tracked, []
        since, self._marks = self._marks, marks
        await self.flush()
        await asyncio.gather(*{acked for _, acked, _ in tracked}, return_exceptions=True)
        sent: dict[tuple[int, int], dict[str, Any]] = {}
        for doc, acked, offset_in_batch in tracked:
            if acked.cancelled() or acked.exception() is not None:
                continue
            batch = acked.result()  # the batch's RecordMetadata: its partition and base offset
            sent[(batch.partition, batch.offset + offset_in_batch)] = doc
        try:
            decided = await wait_decisions(self.settings, sent, since=since, ingest_topic=self.topic,
                                           timeout_s=timeout_s, on_progress=on_progress)
        except DecisionTimeout as e:
            e.decided = {position: replace(d, doc=sent[position]) for position, d in e.decided.items()}
            raise
        return [replace(decided[position], doc=doc) for position, doc in sent.items()]

    async def close(self) -> None:
        """Flush, then stop the producer. Raises ``PublishError`` after stopping if delivery failed."""
        if self._closed or not self._started:
            self._closed = True
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            await self._producer.stop()


class _OpenBatch:
    """A partition's batch being filled: the builder, its docs, and the future every record of it gets."""

    __slots__ = ("acked", "builder", "docs", "timer")

    def __init__(self, builder: Any, acked: asyncio.Future[Any]) -> None:
        self.builder = builder
        self.acked = acked
        self.docs: list[dict[str, Any]] = []
        self.timer: asyncio.TimerHandle | None = None


def _chain(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    """Settle ``target`` as ``source`` settles (a batch's delivery → the future its records were given)."""

    def settle(fut: asyncio.Future[Any]) -> None:
        if target.done():
            return
        if fut.cancelled():
            target.cancel()
        elif (exc := fut.exception()) is not None:
            target.set_exception(exc)
        else:
            target.set_result(fut.result())

    source.add_done_callback(settle)


class Run:
    """The events of one run: assigns eventId, sequence, causation and timestamp, validates, sends."""

    def __init__(
        self, publisher: Publisher, run_id: str, *, start_sequence: int = 0, engine_version: str | None = None
    ) -> None:
        self.publisher = publisher
        self.run_id = run_id
        self.engine_version = engine_version
        self._next_sequence = start_sequence
        self._partition: int | None = None
        # runId and engineVersion are the handle's: once one doc with them passed validate_doc,
        # docs whose other envelope fields the handle minted need only their caller's parts checked.
        self._envelope_checked = False
        # Sequence assignment and enqueue must happen as one step, or two concurrent emits
        # could share a number or enqueue out of order.
        self._lock = asyncio.Lock()

    @property
    def next_sequence(self) -> int:
        """The sequence the next successful emit will get."""
        return self._next_sequence

    def build(
        self,
        type: str,
        payload: Any,
        *,
        sequence: int,
        caused_by: str | dict[str, Any] | None = None,
        node_id: str | None = None,
        event_id: str | None = None,
        timestamp: str | None = None,
    ) -> dict[str, Any]:
        """The RunEventDoc ``emit`` would send at ``sequence`` (unvalidated)."""
        now_ms = time.time_ns() // 1_000_000
        doc: dict[str, Any] = {
            "eventId": event_id or uuid7(now_ms),
            "runId": self.run_id,
            "type": type,
            "payload": payload,
            "timestamp": timestamp or rfc3339_ms(now_ms),
            "sequence": sequence,
        }
        if node_id is not None:
            doc["nodeId"] = node_id
        if self.engine_version is not None:
            doc["engineVersion"] = self.engine_version
        causation = _causation_id(caused_by)
        if causation is not None:
            doc["causationId"] = causation
        return doc

    async def _enqueue(self, type: str, payload: Any, **kw: Any) -> tuple[dict[str, Any], asyncio.Future[Any]]:
        async with self._lock:
            doc = self.build(type, payload, sequence=self._next_sequence, **kw)
            max_bytes = self.publisher.settings.max_event_bytes
            payload_json: bytes | None = None
            if self._envelope_checked and kw.get("event_id") is None and kw.get("timestamp") is None:
                payload_json = validate_minted(doc, max_bytes=max_bytes)
            else:
                validate_doc(doc, max_bytes=max_bytes)
                self._envelope_checked = True
            if self._partition is None:
                self._partition = await self.publisher.partition_of(self.run_id)
            fut = await self.publisher.send_doc(doc, partition=self._partition, payload_json=payload_json)
            # Only now is the number spent: a ContractError or a refused enqueue leaves it free.
            self._next_sequence += 1
        return doc, fut

    async def emit(
        self,
        type: str,
        payload: Any,
        *,
        caused_by: str | dict[str, Any] | None = None,
        node_id: str | None = None,
        event_id: str | None = None,
        timestamp: str | None = None,
    ) -> dict[str, Any]:
        """Validate and enqueue one event; return the doc sent. Durable only after ``flush``."""
        doc, _ = await self._enqueue(
            type, payload, caused_by=caused_by, node_id=node_id, event_id=event_id, timestamp=timestamp
        )
        return doc

    async def emit_and_wait(self, type: str, payload: Any, **kw: Any) -> dict[str, Any]:
        """Like ``emit``, but return only after the broker acknowledged the record."""
        doc, fut = await self._enqueue(type, payload, **kw)
        if self._partition is not None:
            await self.publisher._submit(self._partition)  # no linger: the caller is waiting
        try:
            await fut
        except KafkaError as e:
            raise PublishError(f"event {doc['eventId']} was not acknowledged: {e}", [(doc, e)]) from e
        return doc

    async def flush(self) -> None:
        """Wait for every pending event of the publisher (this run's included); see ``Publisher.flush``."""
        await self.publisher.flush()

    # -- helpers for the event types the store interprets (SPEC §3) --

    async def llm_request(
        self,
        request: dict[str, Any],
        *,
        node_id: str,
        recipe: str = "v2",
        caused_by: str | dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``agent.invocation.started {request, cacheKey, recipe}``; pass the returned doc to ``llm_response``."""
        if recipe not in RECIPE_IDS:
            raise ContractError(f"unknown cache-key recipe {recipe!r}; known: {sorted(RECIPE_IDS)}")
        payload = {"request": request, "cacheKey": cache_key(request, recipe=recipe), "recipe": RECIPE_IDS[recipe]}
        return await self.emit("agent.invocation.started", payload, node_id=node_id, caused_by=caused_by)

    async def llm_response(
        self, started_doc: dict[str, Any], envelope: Any, usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """``agent.invocation.completed {cacheKey, envelope, usage?}`` caused by the started event."""
        payload: dict[str, Any] = {"cacheKey": started_doc["payload"]["cacheKey"], "envelope": envelope}
        if usage is not None:
            payload["usage"] = usage
        return await self.emit(
            "agent.invocation.completed", payload, caused_by=started_doc, node_id=started_doc.get("nodeId")
        )

    async def llm_refusal(self, started_doc: dict[str, Any], reason: str) -> dict[str, Any]:
        """``envelope.refusal {cacheKey, reason}`` caused by the started event."""
        payload = {"cacheKey": started_doc["payload"]["cacheKey"], "reason": reason}
        return await self.emit("envelope.refusal", payload, caused_by=started_doc, node_id=started_doc.get("nodeId"))

    async def tool_call(
        self,
        tool: str,
        args: Any,
        *,
        node_id: str,
        call_id: str | None = None,
        caused_by: str | dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``agent.toolCalled {callId, tool, args}``; pass the returned doc to ``tool_result``."""
        payload = {"callId": call_id or uuid7(), "tool": tool, "args": args}
        return await self.emit("agent.toolCalled", payload, node_id=node_id, caused_by=caused_by)

    async def tool_result(self, call_doc: dict[str, Any], result: Any) -> dict[str, Any]:
        """``agent.toolReturned {callId, result}`` caused by the call."""
        payload = {"callId": call_doc["payload"]["callId"], "result": result}
        return await self.emit("agent.toolReturned", payload, caused_by=call_doc, node_id=call_doc.get("nodeId"))

    async def usage(
        self,
        provider: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cost_cents: int | float | None = None,
        *,
        node_id: str | None = None,
        caused_by: str | dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``provider.usage {provider, model, inputTokens, outputTokens, costCents?}``."""
        payload: dict[str, Any] = {
            "provider": provider,
            "model": model,
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
        }
        if cost_cents is not None:
            payload["costCents"] = cost_cents
        return await self.emit("provider.usage", payload, node_id=node_id, caused_by=caused_by)


# --- pre-built documents (CLI `publish`) -------------------------------------------------------


#: Where a doc given to :func:`publish_docs` was refused: the contract check before sending, the
#: broker's delivery, or the sequencer.
Stage = Literal["validation", "delivery", "sequencer"]


@dataclass(frozen=True)
class Reject:
    """One document that was not published: its 0-based index, stable reason code and detail."""

    index: int
    code: str
    detail: str
    stage: Stage = "validation"


@dataclass(frozen=True)
class PublishSummary:
    """What became of the docs given to :func:`publish_docs`.

    ``sent``: records the broker acknowledged. ``rejected``: docs refused, each at its input index
    with the stage that refused it. ``decided``: whether the sequencer's decisions were waited for;
    then ``committed`` counts the docs it committed and ``already_committed`` lists the docs whose
    eventId its log held already (an earlier send of the same events: not an error).
    """

    sent: int
    rejected: list[Reject] = field(default_factory=list)
    topic: str = ""
    decided: bool = False
    committed: int = 0
    already_committed: list[Reject] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        """Committed by the sequencer when ``decided``; else acknowledged by the broker (``sent``)."""
        return self.committed if self.decided else self.sent

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "sent": self.sent,
            "decided": self.decided,
            "rejected": [r.__dict__ for r in self.rejected],
            "alreadyCommitted": [r.__dict__ for r in self.already_committed],
            "topic": self.topic,
        }


async def publish_docs(
    settings: Settings,
    docs: Iterable[dict[str, Any] | AgentlogError],
    *,
    wire: Wire = "avro",
    on_progress: Callable[[int], None] | None = None,
    wait: bool = False,
    timeout_s: float = DECISION_TIMEOUT_S,
    on_decided: Callable[[int, int], None] | None = None,
) -> PublishSummary:
    """Validate and publish ready-made RunEventDocs as they are (no ids or sequences assigned).

    An item may be an ``AgentlogError`` (e.g. a line that did not parse); it is
    reported as a reject at its index. Valid docs are sent; everything is flushed
    before returning; delivery failures are rejects with code ``publish_failed``.
    ``on_progress(n)``: n items handled so far.

    With ``wait``, the sequencer's decision on every doc sent is waited for too
    (:meth:`Publisher.decisions`): its rejections join ``rejected`` (stage ``sequencer``),
    and ``on_decided(n, sent)`` is called as the number decided grows.

    Raises:
        DecisionTimeout: with ``wait``, ``timeout_s`` passed without a new decision.
    """
    rejected: list[Reject] = []
    index_of: dict[int, int] = {}
    sent = 0
    async with Publisher(settings, wire=wire, track_decisions=wait) as pub:
        for i, item in enumerate(docs):
            if isinstance(item, AgentlogError):
                rejected.append(Reject(i, item.code, _detail(item)))
            else:
                try:
                    doc = validate_doc(item, max_bytes=settings.max_event_bytes)
                    index_of[id(doc)] = i
                    await pub.send_doc(doc)
                    sent += 1
                except AgentlogError as e:
                    rejected.append(Reject(i, e.code, _detail(e)))
            if on_progress is not None:
                on_progress(i + 1)
        try:
            await pub.flush()
        except PublishError as e:
            for doc, exc in e.failed:
                rejected.append(Reject(index_of.get(id(doc), -1), PublishError.code, repr(exc), "delivery"))
                sent -= 1
        if not wait:
            rejected.sort(key=lambda r: r.index)
            return PublishSummary(sent=sent, rejected=rejected, topic=pub.topic)
        progress = None if on_decided is None else (lambda n: on_decided(n, sent))
        decisions = await pub.decisions(timeout_s=timeout_s, on_progress=progress)
    committed, already = 0, []
    for d in decisions:
        index = index_of.get(id(d.doc), -1)
        if d.outcome == "accepted":
            committed += 1
        elif d.outcome == "already_committed":
            already.append(Reject(index, d.reason or ALREADY_COMMITTED, d.detail or "", "sequencer"))
        else:
            rejected.append(Reject(index, d.reason or "rejected", d.detail or "", "sequencer"))
    rejected.sort(key=lambda r: r.index)
    already.sort(key=lambda r: r.index)
    return PublishSummary(sent=sent, rejected=rejected, topic=pub.topic, decided=True, committed=committed,
                          already_committed=already)


def _detail(e: AgentlogError) -> str:
    return str(getattr(e, "detail", None) or e)


# --- the sync wrapper ------------------------------------------------------------------------


class SyncPublisher:
    """``Publisher`` for hosts without asyncio: the same API, blocking, backed by a private loop thread.

    ``with SyncPublisher(settings) as pub: run = pub.run("r1"); run.emit(...)``.
    """

    def __init__(self, settings: Settings | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentlog-publisher", daemon=True)
        self._thread.start()
        # The producer must be built on the loop that will drive it.
        self._pub: Publisher = self._call(self._make(settings, options))

    @staticmethod
    async def _make(settings: Settings | None, options: dict[str, Any]) -> Publisher:
        return Publisher(settings, **options)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def topic(self) -> str:
        return self._pub.topic

    def start(self) -> None:
        self._call(self._pub.start())

    def __enter__(self) -> SyncPublisher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, run_id: str, *, start_sequence: int = 0, engine_version: str | None = None) -> SyncRun:
        return SyncRun(self, self._pub.run(run_id, start_sequence=start_sequence, engine_version=engine_version))

    def flush(self) -> None:
        self._call(self._pub.flush())

    def resend(self, docs: Iterable[dict[str, Any]]) -> None:
        self._call(self._pub.resend(list(docs)))

    def decisions(self, *, timeout_s: float = DECISION_TIMEOUT_S) -> list[Decision]:
        """:meth:`Publisher.decisions`, blocking (needs ``SyncPublisher(track_decisions=True)``)."""
        return self._call(self._pub.decisions(timeout_s=timeout_s))

    def close(self) -> None:
        """Flush and stop; the loop thread ends even if delivery failed (the error is re-raised)."""
        if not self._loop.is_running():
            return
        try:
            self._call(self._pub.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


class SyncRun:
    """Blocking twin of :class:`Run`; every method has the same signature without ``await``."""

    def __init__(self, owner: SyncPublisher, run: Run) -> None:
        self._owner = owner
        self._run = run
        self.run_id = run.run_id

    @property
    def next_sequence(self) -> int:
        return self._run.next_sequence

    def __getattr__(self, name: str) -> Any:
        # Any: also plain attributes of the Run (``engine_version``, ``publisher``), returned as they are.
        method = getattr(self._run, name)
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            return method

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._owner._call(method(*args, **kwargs))

        blocking.__doc__ = method.__doc__
        return blocking
