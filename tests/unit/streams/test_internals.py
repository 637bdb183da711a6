"""Every Faust/aiokafka internal that ``agentlog.streams.internals`` touches still exists on the installed versions.

Fails loudly on an upgrade that renames or removes one (raise the upper bounds in
pyproject.toml only once this passes on the new version). No broker: objects are built, never started.
"""

from __future__ import annotations

import asyncio
import inspect

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faust.transport.consumer import Consumer

from agentlog.streams import internals


def _app() -> faust.App:
    return faust.App("internals-check", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)


def test_faust_app_internals_exist():
    app = _app()
    for name in internals.FAUST_APP_INTERNALS:
        assert callable(getattr(app, name, None)), f"faust.App.{name} is gone"


def test_faust_consumer_internals_exist_and_commits_go_through_the_filter():
    consumer = _app().consumer
    for name in internals.FAUST_CONSUMER_INTERNALS:
        assert hasattr(consumer, name), f"Faust's consumer has no {name}"
    # Every commit path must still ask the filter what to commit, or replacing it changes nothing.
    assert "self._filter_committable_offsets(" in inspect.getsource(Consumer)
    tp = TopicPartition("t", 0)
    consumer._committed_offset[tp] = 41
    consumer._acked[tp].append(1)
    consumer._acked_index[tp].add(1)
    assert internals.committed_offset(consumer, tp) == 41
    assert internals.read_offset(consumer, tp) is None and tp not in consumer._read_offset
    consumer._read_offset[tp] = 40
    assert internals.read_offset(consumer, tp) == 40
    # A record below the read offset is dropped, not delivered: a seek back must move the read offset too.
    assert "offset >= r_offset" in inspect.getsource(Consumer) and "self._read_offset[" in inspect.getsource(Consumer.seek)
    internals.forget_acks(consumer, tp)
    assert tp not in consumer._acked and tp not in consumer._acked_index


def test_the_commit_filter_is_replaced_per_consumer_instance():
    app = _app()
    asked = []

    def make_filter(consumer):
        def committable(tps):
            asked.append((consumer, list(tps)))
            return {"tp": 7}

        return committable

    internals.replace_commit_filter(app, make_filter)
    consumer = app.consumer
    assert consumer._filter_committable_offsets(["x"]) == {"tp": 7}
    assert asked == [(consumer, ["x"])]
    assert _app().consumer._filter_committable_offsets.__func__ is Consumer._filter_committable_offsets


def test_aiokafka_consumer_internals_exist():
    async def scenario():
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        for name in internals.AIOKAFKA_CONSUMER_INTERNALS:
            assert hasattr(consumer, name), f"AIOKafkaConsumer has no {name}"

    asyncio.run(scenario())



def test_the_worker_consumer_long_polls_for_the_wait_we_set():
    app = _app()
    internals.set_fetch_max_wait(app, 100)
    thread = app.consumer._thread
    for name in internals.FAUST_CONSUMER_THREAD_INTERNALS:
        assert callable(getattr(thread, name, None)), f"Faust's consumer thread has no {name}"
    for name in internals.FAUST_CONSUMER_THREAD_STATE:
        assert hasattr(thread, name), f"Faust's consumer thread has no {name}"
    # The hard-coded wait we override, and aiokafka building its fetcher from the attribute at start.
    assert "fetch_max_wait_ms=1500" in inspect.getsource(type(thread)._create_worker_consumer)
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)

    async def scenario():
        kafka = thread._create_worker_consumer(app.transport)  # built, never started: no broker needed
        assert isinstance(kafka, AIOKafkaConsumer)
        assert kafka._fetch_max_wait_ms == 100
        # What the stall check reads: the position aiokafka hands records from, once assigned and sought.
        tp = TopicPartition("t", 0)
        consumer = app.consumer
        assert internals.fetch_position(consumer, tp) is None  # no aiokafka consumer yet
        thread._consumer = kafka
        assert internals.fetch_position(consumer, tp) is None  # not assigned
        kafka._subscription.assign_from_user([tp])
        assert internals.fetch_position(consumer, tp) is None  # assigned, no position yet
        kafka._subscription.subscription.assignment.state_value(tp).seek(7)
        assert internals.fetch_position(consumer, tp) == 7
        other = _app()  # another app in the process keeps Faust's own wait
        assert other.consumer._thread._create_worker_consumer(other.transport)._fetch_max_wait_ms == 1500

    asyncio.run(scenario())


def test_the_membership_probe_reads_the_generation_aiokafka_resets_when_the_group_drops_the_member():
    from aiokafka.consumer.group_coordinator import BaseCoordinator, GroupCoordinator
    from aiokafka.protocol.commit import OffsetCommitRequest
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    app = _app()
    dropped = internals.membership_probe(app)
    assert dropped() is False  # no consumer yet
    thread = app.consumer._thread
    assert dropped() is False  # not started: no aiokafka consumer yet
    # Where each step of the path is made, on the installed versions.
    consumer_attr, kafka_attr, coordinator_attr = internals.GROUP_COORDINATOR_PATH
    assert hasattr(app.consumer, consumer_attr)
    assert f"self.{kafka_attr} = self._create_consumer(" in inspect.getsource(AIOKafkaConsumerThread.on_start)
    assert f"self.{coordinator_attr} = GroupCoordinator(" in inspect.getsource(AIOKafkaConsumer.start)
    assert internals.NO_GENERATION == OffsetCommitRequest.DEFAULT_GENERATION_ID
    reset = inspect.getsource(GroupCoordinator.reset_generation)
    assert "self.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID" in reset
    assert "reset_generation()" in inspect.getsource(GroupCoordinator._do_heartbeat)  # UnknownMemberId
    assert issubclass(GroupCoordinator, BaseCoordinator)

    class Coordinator:
        generation = 7

    setattr(thread, kafka_attr, type("Kafka", (), {coordinator_attr: Coordinator()})())
    assert dropped() is False
    Coordinator.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID
    assert dropped() is True


def test_faust_producer_gives_its_aiokafka_producer_with_the_batch_api():
    async def scenario():
        producer = _app().producer
        for name in internals.FAUST_PRODUCER_INTERNALS:
            assert callable(getattr(producer, name, None)), f"Faust's producer has no {name}"
        # Not started, there is no client yet (Faust creates it in on_start, as here: no broker needed).
        producer._producer = producer._new_producer()
        kafka = internals.kafka_producer(producer)
        assert isinstance(kafka, AIOKafkaProducer)
        assert kafka is internals.kafka_producer(producer)  # the app's one client, not a new one per call
        builder = kafka.create_batch()
        assert builder.append(key=b"k", value=b"v", timestamp=None).offset == 0
        assert callable(kafka.send_batch)

    asyncio.run(scenario())


def test_the_records_faust_clears_on_resuming_flow_are_reported_by_partition():
    """``app.flow_control.resume()`` empties the channel queues; we learn each partition's first dropped offset."""
    from faust.events import Event
    from faust.types.tuples import Message
    from mode.utils.queues import FlowControlQueue

    async def scenario():
        app = _app()
        flow = app.flow_control
        for name in internals.FLOW_CONTROL_INTERNALS:
            assert hasattr(flow, name), f"mode's FlowControlEvent has no {name}"
        queues = [FlowControlQueue(flow_control=flow, clear_on_resume=True) for _ in range(2)]
        for name in internals.FLOW_QUEUE_INTERNALS:
            assert hasattr(queues[0], name), f"mode's FlowControlQueue has no {name}"
        kept = FlowControlQueue(flow_control=flow)  # not cleared on resume: not reported either

        def event(topic: str, partition: int, offset: int) -> Event:
            message = Message(topic, partition, offset, 0.0, 0, {}, b"k", b"v", None)
            return Event(app, b"k", b"v", {}, message)

        for offset in (14, 12, 13):
            queues[0].put_nowait(event("t", 1, offset))
        queues[1].put_nowait(event("t", 0, 7))
        kept.put_nowait(event("t", 2, 3))
        reported = []
        internals.on_flow_queues_cleared(app, reported.append)
        flow.resume()
        assert [q.qsize() for q in queues] == [0, 0] and kept.qsize() == 1  # still mode's own clear
        assert reported == [{TopicPartition("t", 1): 12, TopicPartition("t", 0): 7}]
        flow.suspend()
        flow.resume()  # nothing queued: nothing reported
        assert len(reported) == 1

    asyncio.run(scenario())


# --- plain (offset, key, value) records out of aiokafka's fetch buffer -------------------------------------

def _batch(base_offset: int, records: list[tuple[bytes | None, bytes]], *, producer_id: int = -1,
           transactional: bool = False, control: bool = False, corrupt: bool = False) -> bytes:
    """One v2 record batch as the broker returns it (a control batch's attribute bit and CRC set by hand)."""
    import struct

    from aiokafka.record._crecords.cutil import crc32c_cython
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=int(transactional),
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=[("h", b"x")])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if control:
        struct.pack_into(">h", data, 21, struct.unpack_from(">h", data, 21)[0] | 0x20)
    struct.pack_into(">I", data, 17, crc32c_cython(bytes(data[21:])))
    if corrupt:
        data[-1] ^= 0xFF
    return bytes(data)


_ABORT, _COMMIT = b"\x00\x00\x00\x00", b"\x00\x00\x00\x01"


def _transactional_log() -> tuple[bytes, list[tuple[int, int]]]:
    """Plain records, a committed transaction, an aborted one (with its markers), and more plain records."""
    parts = [
        _batch(0, [(b"a", b"v0"), (None, b"v1")]),
        _batch(2, [(b"a", b"v2"), (b"b", b"v3")], producer_id=7, transactional=True),
        _batch(4, [(_COMMIT, b"\x00\x00\x00\x00\x00\x00")], producer_id=7, transactional=True, control=True),
        _batch(5, [(b"a", b"aborted-5"), (b"a", b"aborted-6")], producer_id=8, transactional=True),
        _batch(7, [(_ABORT, b"\x00\x00\x00\x00\x00\x00")], producer_id=8, transactional=True, control=True),
        _batch(8, [(b"c", b"v8"), (b"a", b"")]),
    ]
    return b"".join(parts), [(8, 5)]


def _drain(buffer: bytes, aborted: list[tuple[int, int]], *, plain: bool, start: int = 0,
           isolation: str = "read_committed") -> tuple[list, int]:
    """What ``fetched_records`` (the path ``getmany`` takes) gives for one fetched response, and the position after."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.consumer.fetcher import Fetcher, FetchResult, PartitionRecords
    from aiokafka.consumer.subscription_state import SubscriptionState
    from aiokafka.record.memory_records import MemoryRecords

    async def scenario():
        client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
        subscription = SubscriptionState()
        fetcher = Fetcher(client, subscription, isolation_level=isolation)
        try:
            for name in internals.AIOKAFKA_FETCH_INTERNALS[1:2]:
                assert hasattr(fetcher, name), f"aiokafka's Fetcher has no {name}"
            if plain:
                started = type("Started", (), {"_fetcher": fetcher})()  # what a started consumer holds
                assert internals.plain_fetched_records(started) is True
                assert internals.plain_fetched_records(started) is True  # twice: still one hook
            tp = TopicPartition("t", 0)
            subscription.assign_from_user({tp})
            assignment = subscription.subscription.assignment
            assignment.state_value(tp).seek(start)
            records = PartitionRecords(tp, MemoryRecords(buffer), aborted, start, None, None, True,
                                       fetcher._isolation_level)  # as Fetcher._proc_fetch_request builds them
            result = FetchResult(tp, partition_records=records, assignment=assignment, backoff=0)
            assert hasattr(result, "_partition_records") and hasattr(records, "_consumer_record")
            fetcher._records[tp] = result
            got = await fetcher.fetched_records([tp])
            return got.get(tp, []), assignment.state_value(tp).position
        finally:
            await fetcher.close()
            await client.close()

    return asyncio.run(scenario())


def test_plain_records_are_what_the_public_records_carry_with_transactions_honoured():
    buffer, aborted = _transactional_log()
    for isolation in ("read_committed", "read_uncommitted"):
        for start in (0, 3, 8, 9):
            public, public_position = _drain(buffer, aborted, plain=False, start=start, isolation=isolation)
            plain, plain_position = _drain(buffer, aborted, plain=True, start=start, isolation=isolation)
            assert all(type(r).__name__ == "ConsumerRecord" for r in public)
            assert plain == [(r.offset, r.key, r.value) for r in public]
            assert plain_position == public_position == 10
    committed, _ = _drain(buffer, aborted, plain=True)
    # Control batches skipped, the aborted transaction dropped, everything else in offset order.
    assert committed == [(0, b"a", b"v0"), (1, None, b"v1"), (2, b"a", b"v2"), (3, b"b", b"v3"),
                         (8, b"c", b"v8"), (9, b"a", b"")]
    uncommitted, _ = _drain(buffer, aborted, plain=True, isolation="read_uncommitted")
    assert [r[2] for r in uncommitted if r[0] in (5, 6)] == [b"aborted-5", b"aborted-6"]


def test_plain_records_still_fail_on_a_corrupt_batch():
    from aiokafka.errors import CorruptRecordException

    buffer = _batch(0, [(b"a", b"v0")]) + _batch(1, [(b"a", b"v1")], corrupt=True)
    for plain in (False, True):
        with pytest.raises(CorruptRecordException):
            _drain(buffer, [], plain=plain)


def test_the_plain_hook_sits_where_aiokafka_builds_and_calls_it():
    """The fetcher stores each response's records by ``self._records[tp] = FetchResult(``, and the batch walk
    builds every record through ``self._consumer_record(`` : the two places the hook relies on."""
    from aiokafka.consumer.fetcher import Fetcher, PartitionRecords

    assert "self._records[tp] = FetchResult(" in inspect.getsource(Fetcher._proc_fetch_request)
    assert "self._consumer_record(tp, record)" in inspect.getsource(PartitionRecords._unpack_records)
    assert "self._fetcher = Fetcher(" in inspect.getsource(AIOKafkaConsumer.start)
    assert inspect.getsource(Fetcher.__init__).count("self._records = ") == 1

    async def not_started():
        # No fetcher yet (or an aiokafka without this buffer): nothing changes, and the caller is told so.
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        for name in internals.AIOKAFKA_FETCH_INTERNALS[:1]:
            assert hasattr(consumer, name), f"AIOKafkaConsumer has no {name}"
        assert internals.plain_fetched_records(consumer) is False

    asyncio.run(not_started())


def test_the_consumer_loop_we_replace_is_the_one_it_was_written_against():
    import hashlib

    app = _app()
    consumer = app.consumer
    for name in internals.FAUST_DRAIN_INTERNALS:
        assert hasattr(consumer, name), f"Faust's consumer has no {name}"
    source = inspect.getsource(Consumer._drain_messages)
    assert hashlib.sha256(source.encode()).hexdigest() == internals.FAUST_DRAIN_SOURCE_SHA256, (
        "Faust's Consumer._drain_messages changed: compare it with agentlog.streams.internals._drain_in_line, then re-pin")
    assert "self.wait_first(\n" in source and "callback(message), self.suspend_flow.wait()" in source
    from faust.transport.consumer import CONSUMER_FETCHING
    assert CONSUMER_FETCHING == "FETCHING"  # the diag flag the replacement sets by its value
    # The Fetcher service runs the consumer's loop through the instance, so a per-instance method is the one run.
    from faust.transport.consumer import Fetcher
    assert "_drain_messages(self)" in inspect.getsource(Fetcher)
    replaced = _app()
    internals.deliver_in_line(replaced)  # before Faust makes its consumer, as the worker does
    assert replaced.consumer._drain_messages.__func__ is internals._drain_in_line
    assert consumer._drain_messages.__func__ is Consumer._drain_messages  # another app keeps Faust's loop


def test_a_callback_that_does_not_suspend_runs_to_its_end_in_line():
    ran = []

    async def callback(x):
        ran.append(x)
        return x

    async def scenario():
        tasks = len(asyncio.all_tasks())
        assert internals.step_or_finish(callback(1)) is None
        assert ran == [1] and len(asyncio.all_tasks()) == tasks  # no task was made

    asyncio.run(scenario())


def test_a_callback_that_suspends_finishes_as_it_would_have_when_awaited():
    async def scenario():
        gate: asyncio.Future = asyncio.get_running_loop().create_future()
        seen = []

        async def callback():
            seen.append("before")
            await asyncio.sleep(0)  # a bare yield to the loop
            value = await gate
            seen.append(value)
            return value * 2

        rest = internals.step_or_finish(callback())
        assert rest is not None and seen == ["before"]
        task = asyncio.ensure_future(rest)
        await asyncio.sleep(0.01)
        assert not task.done()
        gate.set_result(21)
        assert await task == 42 and seen == ["before", 21]

    asyncio.run(scenario())


def test_a_suspended_callback_is_cancelled_inside_and_its_errors_propagate():
    async def scenario():
        cleaned = []

        async def blocked():
            try:
                await asyncio.Event().wait()
            finally:
                cleaned.append("finally")

        task = asyncio.ensure_future(internals.step_or_finish(blocked()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned == ["finally"]

        async def fails_later():
            await asyncio.sleep(0)
            raise ValueError("bad record")

        with pytest.raises(ValueError, match="bad record"):
            await internals.step_or_finish(fails_later())

        async def fails_at_once():
            raise KeyError("at once")

        with pytest.raises(KeyError):
            internals.step_or_finish(fails_at_once())

        async def catches():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                return "handled"

        task = asyncio.ensure_future(internals.step_or_finish(catches()))
        await asyncio.sleep(0)
        task.cancel()
        assert await task == "handled"  # a coroutine that swallows the cancellation ends as it chose

    asyncio.run(scenario())
