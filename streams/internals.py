"""Every use of a Faust or aiokafka private attribute, in one place.

We lean on a handful of internals that neither library documents. Each is used
through a function here, so an upgrade that renames or removes one breaks this
module (and ``tests/unit/streams/test_internals.py``, which checks every name on
the installed versions) instead of failing silently somewhere in the worker.
``pyproject.toml`` pins upper bounds on both libraries for the same reason:
raise a bound only after that test passes on the new version.

This module imports neither library: it works on the objects it is handed, so
:mod:`agentlog.streams.reader` (aiokafka only) and :mod:`agentlog.worker` (Faust) can
both use it without ``streams`` depending on Faust.
"""

from __future__ import annotations

import asyncio
import types
from collections import OrderedDict, namedtuple
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Mapping
from typing import Any

#: (owner, attribute) pairs this module touches, checked by the upgrade test.
FAUST_APP_INTERNALS = ("_new_consumer",)
FAUST_CONSUMER_INTERNALS = ("_filter_committable_offsets", "_committed_offset", "_acked", "_acked_index",
                            "_read_offset", "_thread")
AIOKAFKA_CONSUMER_INTERNALS = ("_fetch_max_wait_ms", "_subscription")
FAUST_CONSUMER_THREAD_INTERNALS = ("_create_worker_consumer",)
FAUST_CONSUMER_THREAD_STATE = ("_consumer",)
FAUST_PRODUCER_INTERNALS = ("_ensure_producer",)
#: mode's ``FlowControlEvent`` (``app.flow_control``) and the ``FlowControlQueue`` s it clears on resume.
FLOW_CONTROL_INTERNALS = ("_queues",)
FLOW_QUEUE_INTERNALS = ("_queue",)
#: aiokafka's fetched-records buffer (:func:`plain_fetched_records`): the started consumer's
#: fetcher, its per-partition buffer, a buffered ``FetchResult``'s records and the per-record hook they call.
AIOKAFKA_FETCH_INTERNALS = ("_fetcher", "_records", "_partition_records", "_consumer_record")
#: The path from Faust's consumer to aiokafka's group coordinator (:func:`membership_probe`):
#: the consumer thread, its started ``AIOKafkaConsumer``, that consumer's coordinator.
GROUP_COORDINATOR_PATH = ("_thread", "_consumer", "_coordinator")
#: Faust's consumer loop (:func:`deliver_in_line`): the method replaced and what the replacement reads.
FAUST_DRAIN_INTERNALS = ("_drain_messages", "callback", "getmany", "_read_offset", "_add_gap", "_commit_every",
                         "_n_acked", "suspend_flow", "diag", "consumer_stopped_errors")
#: SHA-256 of ``inspect.getsource(faust.transport.consumer.Consumer._drain_messages)`` on the version
#: :func:`deliver_in_line` was written against: an upgrade that changes Faust's loop fails the upgrade test
#: until the replacement has been compared with the new loop.
FAUST_DRAIN_SOURCE_SHA256 = "44a2500309e83c630493f6828af50166ec8d96a0b3e4fb2bab735f704ae93417"
#: aiokafka's generation of a member without one (``OffsetCommitRequest.DEFAULT_GENERATION_ID``): before
#: its first join, and after the group dropped it or it left.
NO_GENERATION = -1


def kafka_producer(producer: Any) -> Any:
    """The ``AIOKafkaProducer`` under Faust's producer (``app.producer``), started with the app.

    Faust exposes per-record ``send`` only; the worker hands a batch's records over as whole
    aiokafka batches (``create_batch`` / ``send_batch``, public aiokafka API) through the same
    client, so they share its connection, idempotence and acks settings.
    """
    return producer._ensure_producer()


#: A topic partition as Faust's store reads it (``tp.partition``; faust.types.TP has the same fields).
_TP = namedtuple("_TP", "topic partition")

#: Faust's RocksDB table store (``table.data``): its per-partition database and the options object it opens
#: them with (:func:`table_db`, :func:`use_rocksdb_opener`).
FAUST_ROCKSDB_STORE_INTERNALS = ("_db_for_partition", "rocksdb_options", "set_persisted_offset")


def table_db(table: Any, partition: int) -> Any:
    """The RocksDB database (a ``rocksdict.Rdict``) of ``table``'s ``partition``, opened if it is not.

    Faust's store reads and writes by "the current event's partition", which a batch of several
    partitions does not have; the worker names the partition itself (:mod:`agentlog.worker.tables`).
    """
    return table.data._db_for_partition(partition)


def set_persisted_offset(table: Any, partition: int, offset: int) -> None:
    """Record that ``table``'s local database holds its changelog up to ``offset`` (recovery starts after it)."""
    table.data.set_persisted_offset(_TP(table.changelog_topic.get_topic_name(), partition), offset)


def use_rocksdb_opener(table: Any, opener: Any) -> None:
    """Have ``table``'s RocksDB store open its databases with ``opener.open(path, read_only=...)``."""
    table.data.rocksdb_options = opener


def committed_offset(consumer: Any, tp: Any) -> int | None:
    """The offset Faust's consumer last committed for ``tp`` (None when it has not)."""
    offset: int | None = consumer._committed_offset.get(tp)
    return offset


def read_offset(consumer: Any, tp: Any) -> int | None:
    """The offset of the last record of ``tp`` Faust's consumer handed to the agents' streams (None: none yet).

    Records up to it are in the streams' buffers or handled; Faust drops a fetched record below it.
    """
    offset: int | None = consumer._read_offset.get(tp)
    return offset


def fetch_position(consumer: Any, tp: Any) -> int | None:
    """The offset of ``tp`` aiokafka hands Faust's consumer next (None: not known yet).

    aiokafka moves it as its fetcher returns records to Faust, not when it fetches them: every record
    below it has left aiokafka. Read from the event loop while aiokafka runs in Faust's consumer
    thread: one int, read whole.
    """
    kafka = consumer._thread._consumer
    subscription = kafka._subscription.subscription if kafka is not None else None
    state = subscription.assignment.state_value(tp) if subscription is not None else None
    position: int | None = state.position if state is not None and state.has_valid_position else None
    return position


def forget_acks(consumer: Any, tp: Any) -> None:
    """Drop Faust's ack bookkeeping for ``tp``; we commit our own positions, so it would only grow."""
    consumer._acked.pop(tp, None)
    consumer._acked_index.pop(tp, None)


CommitFilter = Callable[[Any], Mapping[Any, int]]


def replace_commit_filter(app: Any, make_filter: Callable[[Any], CommitFilter]) -> None:
    """Have every consumer ``app`` creates commit what ``make_filter(consumer)`` returns.

    Faust decides what to commit in ``Consumer._filter_committable_offsets(tps)``
    (every commit path goes through it: the commit timer, ``broker_commit_every``,
    the commit on shutdown). It is replaced per consumer *instance*, when Faust
    creates the consumer, so the class and other apps in the process are untouched.
    """

    def replace(consumer: Any) -> None:
        chosen = make_filter(consumer)

        def _filter_committable_offsets(tps: Iterable[Any]) -> Mapping[Any, int]:
            return chosen(tps)

        consumer._filter_committable_offsets = _filter_committable_offsets

    _on_new_consumer(app, replace)


def _on_new_consumer(app: Any, configure: Callable[[Any], None]) -> None:
    """Run ``configure(consumer)`` on every consumer ``app`` creates, before Faust starts it.

    Faust creates its consumer in ``App._new_consumer``; wrapping it per app instance leaves the
    class and other apps in the process untouched.
    """
    new_consumer = app._new_consumer

    def _new_consumer() -> Any:
        consumer = new_consumer()
        configure(consumer)
        return consumer

    app._new_consumer = _new_consumer


def on_flow_queues_cleared(app: Any, dropped: Callable[[dict[Any, int]], None]) -> None:
    """Call ``dropped({tp: first offset})`` with the records Faust throws away when it resumes flow.

    At the end of every recovery Faust resumes the stream partitions, awaits the seek to the
    committed offsets, and only then resumes flow control, which *clears* every channel queue
    (``clear_on_resume``). Records fetched while the seek was awaited sit in those queues and are
    dropped, while the consumer's read offset has moved past them: Faust never delivers them again
    (faust-streaming issue #596). A later record of the partition reveals the hole
    (:func:`agentlog.worker.batch.in_order` reads around it), but the last records before a quiet
    spell waited for the next record to come (seen in CI: the last 4 events of a run). The queued
    events are walked just before the clear, so the caller can seek each partition back to its first
    dropped record.
    """
    flow = app.flow_control
    clear = flow.clear

    def _clear() -> None:
        first: dict[Any, int] = {}
        for queue in list(flow._queues):
            for event in list(queue._queue):
                message = getattr(event, "message", None)
                tp, offset = getattr(message, "tp", None), getattr(message, "offset", None)
                if tp is not None and isinstance(offset, int) and offset < first.get(tp, offset + 1):
                    first[tp] = offset
        clear()
        if first:
            dropped(first)

    flow.clear = _clear


def set_fetch_max_wait(app: Any, ms: int) -> None:
    """Have the aiokafka consumer of every Faust consumer ``app`` creates long-poll at most ``ms``.

    Faust hard-codes ``fetch_max_wait_ms=1500`` for its worker consumer. aiokafka keeps one fetch
    in flight per broker and leaves out of it the partitions that still hold unconsumed records,
    so while a busy partition's records are being processed the fetch in flight may name only idle
    partitions, and the broker holds it for the whole wait before the busy partition can be fetched
    again: a delivery stall of up to 1.5 s (publish → log p99). The value is read when the
    consumer starts (its fetcher is built then), so setting it on the new, unstarted consumer works.
    """

    def shorten(consumer: Any) -> None:
        thread = consumer._thread
        create = thread._create_worker_consumer

        def _create_worker_consumer(transport: Any) -> Any:
            kafka = create(transport)
            kafka._fetch_max_wait_ms = ms
            return kafka

        thread._create_worker_consumer = _create_worker_consumer

    _on_new_consumer(app, shorten)


class _Stepped:
    """The rest of a coroutine that was stepped once and is suspended on ``pending`` (what it yielded).

    Awaiting this drives the coroutine on exactly as ``await coroutine`` would have from that point:
    each value the awaiting task resumes it with is sent in, each exception (a cancellation) thrown in.
    """

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro, self._pending = coro, pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._pending
        while True:
            try:
                value = yield pending
            except BaseException as e:  # noqa: BLE001 - every exception goes into the coroutine, as with ``await``
                try:
                    pending = coro.throw(e)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(value)
                except StopIteration as done:
                    return done.value


def step_or_finish(coro: Coroutine[Any, Any, Any]) -> Awaitable[Any] | None:
    """Run ``coro`` until it first suspends: None when it finished without suspending, else an awaitable
    of the rest (``asyncio.ensure_future`` makes it a task). An exception it raises in that first step propagates."""
    try:
        pending = coro.send(None)
    except StopIteration:
        return None
    return _Stepped(coro, pending)


def deliver_in_line(app: Any) -> None:
    """Have every consumer ``app`` creates hand a fetched record to the streams in line, not through four tasks.

    Faust's consumer loop (``Consumer._drain_messages``) gives each record to the streams with
    ``await self.wait_first(callback(record), self.suspend_flow.wait())``: the callback raced against a
    rebalance's flow stop, so a callback blocked on a full stream buffer cannot hold the loop through a
    rebalance. ``wait_first`` makes that four tasks per record (the two, and the service's stopped and
    crashed events) and cancels the three losers: on the worker's realistic workload about a quarter of
    its CPU an event (tests/bench/JOURNAL.md, "delivery in line"). Almost every callback finishes
    without suspending (it puts the record in a stream's queue), so here the loop first steps the
    callback in line; only a callback that suspends (flow stopped, a full queue, the producer's buffer)
    finishes under Faust's race, as before. Everything else is Faust's loop: read offsets, gaps,
    ``broker_commit_every``, a yield to the event loop every 100 records.

    Replaced per consumer instance, when Faust creates it; :data:`FAUST_DRAIN_SOURCE_SHA256` pins the
    loop it replaces (the upgrade test fails when Faust's changes).
    """

    def replace(consumer: Any) -> None:
        consumer._drain_messages = types.MethodType(_drain_in_line, consumer)

    _on_new_consumer(app, replace)


async def _drain_in_line(self: Any, fetcher: Any) -> None:
    """Faust's ``Consumer._drain_messages`` with the callback stepped in line (:func:`deliver_in_line`)."""
    callback, getmany = self.callback, self.getmany
    consumer_stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set
    read_offsets = self._read_offset
    suspend_flow = self.suspend_flow
    acks_enabled_for = self.app.topics.acks_enabled_for
    commit_every = self._commit_every
    fetching = "FETCHING"  # faust.transport.consumer.CONSUMER_FETCHING
    since_yield = 0
    try:
        while not (consumer_stopped() or fetcher_stopped()):
            self.diag.set_flag(fetching)
            records = getmany(timeout=1.0)
            await self.sleep(0)  # getmany can return at once for ever: let the loop run
            if not self.should_stop:
                async for tp, message in records:
                    since_yield += 1
                    if since_yield > 100:
                        await asyncio.sleep(0)
                        since_yield = 0
                    offset, read = message.offset, read_offsets.get(tp)
                    if read is not None and offset < read:
                        continue  # Faust drops a record below the read offset (a seek raced the fetch)
                    if read and offset - read > 1 and acks_enabled_for(message.topic):
                        await self._add_gap(tp, read + 1, offset)
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    rest = step_or_finish(callback(message)) if not suspend_flow.is_set() else callback(message)
                    if rest is not None:
                        await self.wait_first(rest, suspend_flow.wait())
                    read_offsets[tp] = offset
            self.diag.unset_flag(fetching)
    except self.consumer_stopped_errors:
        if not self.transport.app.should_stop:
            raise
    except asyncio.CancelledError:
        if not self.transport.app.should_stop:
            raise
    except Exception as exc:
        self.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        self.diag.unset_flag(fetching)


def membership_probe(app: Any) -> Callable[[], bool]:
    """A check of whether the group has dropped the member of the consumer ``app`` creates.

    aiokafka resets its coordinator's generation to ``-1`` when a heartbeat learns the group no
    longer knows the member (its session expired: the process stalled past
    ``AGENTLOG_SESSION_TIMEOUT_S``), or when it leaves the group (idle past ``max_poll_interval``),
    and then rejoins; the revocation Faust signals next comes after the group has moved on. Faust
    exposes the generation only once a join is done (``app.consumer_generation_id``), so the
    coordinator is read where aiokafka keeps it. Before the first join the generation is ``-1``
    too: the probe says "dropped" then, which is right (nothing is owned yet).
    """
    consumers: list[Any] = []
    _on_new_consumer(app, consumers.append)

    def dropped() -> bool:
        if not consumers:
            return False
        node: Any = consumers[-1]
        for name in GROUP_COORDINATOR_PATH:
            node = getattr(node, name, None)
            if node is None:
                return False
        return bool(node.generation == NO_GENERATION)

    return dropped


def _plain_record(tp: Any, record: Any) -> tuple[int, bytes | None, bytes | None]:
    """What :func:`plain_fetched_records` makes of one record: ``(offset, key, value)``."""
    return record.offset, record.key, record.value


class _PlainFetches(OrderedDict[Any, Any]):
    """aiokafka's per-partition buffer of fetched records, handing each record out as a plain tuple.

    The fetcher stores every response's records here as a ``FetchResult``; its ``PartitionRecords``
    walks the record batches (CRC check, control batches, aborted transactions: aiokafka's own code,
    unchanged) and calls ``self._consumer_record(tp, record)`` once per record. That call is replaced
    on the stored instance only.
    """

    def __setitem__(self, tp: Any, result: Any) -> None:
        records = getattr(result, "_partition_records", None)
        if records is not None:
            records._consumer_record = _plain_record
        super().__setitem__(tp, result)


def plain_fetched_records(consumer: Any) -> bool:
    """Have a *started* ``AIOKafkaConsumer``'s ``getmany`` give ``(offset, key, value)`` tuples per record.

    Why: a bounded read that only wants those three (re-derivation) would pay about 1.5–2 µs of
    CPU per record for aiokafka's ``ConsumerRecord`` (an 11-field dataclass and a
    ``tuple(headers)``, built in Python) and then its own tuple; measured on the bench's log, a
    public read costs 3.6–5.0 µs per record and this one 1.8–3.7. What is read, and how, is
    aiokafka's: the batches are walked by its ``PartitionRecords`` (CRC checks, control batches
    skipped, aborted transactions dropped under ``read_committed``), positions move as in a public
    read; only the object built per record differs. Deserializers are not applied (the reader sets none).

    Returns ``False`` and changes nothing when this aiokafka has no such buffer (not started, or an
    upgrade moved it): the caller then reads ``ConsumerRecord`` s as usual. Only for a consumer
    whose every caller expects the tuples (``agentlog.streams.reader.TopicReader``).
    """
    fetcher: Any = getattr(consumer, "_fetcher", None)
    buffered = getattr(fetcher, "_records", None)
    if isinstance(buffered, _PlainFetches):
        return True
    if type(buffered) is not OrderedDict:
        return False
    fetcher._records = _PlainFetches(buffered)
    return True
