"""Every use of a Faust or aiokafka private attribute, in one place.

We lean on a handful of internals that neither library documents. Each is used
through a function here, so an upgrade that renames or removes one breaks this
module (and ``tests/unit/streams/test_internals.py``, which checks every name on
the installed versions) instead of failing silently somewhere in the worker.
``pyproject.toml`` pins upper bounds on both libraries for the same reason:
raise a bound only after that test passes on the new version.

This module imports neither library: it works on the objects it is handed, so
:mod:`streams.reader` (aiokafka only) and :mod:`processors.worker` (Faust) can
both use it without ``streams`` depending on Faust.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: (owner, attribute) pairs this module touches, checked by the upgrade test.
FAUST_APP_INTERNALS = ("_new_consumer",)
FAUST_CONSUMER_INTERNALS = ("_filter_committable_offsets", "_committed_offset", "_acked", "_acked_index")
AIOKAFKA_CONSUMER_INTERNALS = ("_client",)
AIOKAFKA_CLIENT_INTERNALS = ("add_topic",)
FAUST_PRODUCER_INTERNALS = ("_ensure_producer",)


def kafka_producer(producer: Any) -> Any:
    """The ``AIOKafkaProducer`` under Faust's producer (``app.producer``), started with the app.

    Faust exposes per-record ``send`` only; the worker hands a batch's records over as whole
    aiokafka batches (``create_batch`` / ``send_batch``, public aiokafka API) through the same
    client, so they share its connection, idempotence and acks settings.
    """
    return producer._ensure_producer()


async def load_topic_metadata(consumer: Any, topic: str) -> None:
    """Make a group-less aiokafka consumer fetch metadata for ``topic``.

    A consumer without a group tracks no topics, so ``partitions_for_topic`` knows
    nothing until its client is told to add the topic (aiokafka has no public call
    for that; ``topics()`` fetches metadata into a copy the consumer never reads).
    """
    await consumer._client.add_topic(topic)


def committed_offset(consumer: Any, tp: Any) -> int | None:
    """The offset Faust's consumer last committed for ``tp`` (None when it has not)."""
    offset: int | None = consumer._committed_offset.get(tp)
    return offset


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
    new_consumer = app._new_consumer

    def _new_consumer() -> Any:
        consumer = new_consumer()
        chosen = make_filter(consumer)

        def _filter_committable_offsets(tps: Iterable[Any]) -> Mapping[Any, int]:
            return chosen(tps)

        consumer._filter_committable_offsets = _filter_committable_offsets
        return consumer

    app._new_consumer = _new_consumer
