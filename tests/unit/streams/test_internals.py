"""Every Faust/aiokafka internal that ``streams.internals`` touches still exists on the installed versions.

Fails loudly on an upgrade that renames or removes one (raise the upper bounds in
pyproject.toml only once this passes on the new version). No broker: objects are built, never started.
"""

from __future__ import annotations

import asyncio
import inspect

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faust.transport.consumer import Consumer

from streams import internals


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


def test_aiokafka_consumer_client_can_add_a_topic():
    async def scenario():
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        for name in internals.AIOKAFKA_CONSUMER_INTERNALS:
            assert hasattr(consumer, name), f"AIOKafkaConsumer has no {name}"
        client = consumer._client
        for name in internals.AIOKAFKA_CLIENT_INTERNALS:
            assert callable(getattr(client, name, None)), f"aiokafka client has no {name}"

    asyncio.run(scenario())



def test_the_worker_consumer_long_polls_for_the_wait_we_set():
    app = _app()
    internals.set_fetch_max_wait(app, 100)
    thread = app.consumer._thread
    for name in internals.FAUST_CONSUMER_THREAD_INTERNALS:
        assert callable(getattr(thread, name, None)), f"Faust's consumer thread has no {name}"
    # The hard-coded wait we override, and aiokafka building its fetcher from the attribute at start.
    assert "fetch_max_wait_ms=1500" in inspect.getsource(type(thread)._create_worker_consumer)
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)

    async def scenario():
        kafka = thread._create_worker_consumer(app.transport)  # built, never started: no broker needed
        assert isinstance(kafka, AIOKafkaConsumer)
        assert kafka._fetch_max_wait_ms == 100
        other = _app()  # another app in the process keeps Faust's own wait
        assert other.consumer._thread._create_worker_consumer(other.transport)._fetch_max_wait_ms == 1500

    asyncio.run(scenario())


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


def test_a_thread_frame_is_the_stack_that_thread_runs():
    import threading

    started, release = threading.Event(), threading.Event()

    def parked_in_a_named_function() -> None:
        started.set()
        release.wait(10)

    thread = threading.Thread(target=parked_in_a_named_function)
    thread.start()
    try:
        started.wait(10)
        frame = internals.thread_frame(thread.ident)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        assert "parked_in_a_named_function" in names
        assert internals.thread_frame(None) is None
    finally:
        release.set()
        thread.join()
