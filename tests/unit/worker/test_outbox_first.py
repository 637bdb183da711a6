"""A batch's keyring records are acknowledged before any other record of it is handed over.

A log record sealed under a new data key must never be durable without that key's record: a crash would
leave content no key opens. The outbox sends the keyring's batches first and waits for them.
"""

from __future__ import annotations

import asyncio

import pytest

from agentlog.worker.batch import Outbox
from agentlog.worker.memory import MemoryProducer, Refused

KEYRING, LOG = "p.keyring", "p.log"


async def _outbox_run(producer: MemoryProducer) -> None:
    outbox = Outbox(producer, {KEYRING: [0], LOG: [0]}, frozenset({KEYRING}))
    await outbox.add(LOG, 0, b"run-a", b"sealed under an old key")
    await outbox.add(KEYRING, 0, b"run-b", b"run-b's key")
    await outbox.add(LOG, 0, b"run-b", b"sealed under run-b's key")
    await outbox.flush()
    await outbox.wait()


def test_the_log_is_handed_over_only_once_the_keyring_is_acknowledged():
    producer = MemoryProducer()
    asyncio.run(_outbox_run(producer))
    kinds = [(entry[0], entry[1]) for entry in producer.log]
    assert kinds.index(("acked", KEYRING)) < kinds.index(("sent", LOG))
    assert [entry[4] for entry in producer.log if entry[0] == "sent" and entry[1] == LOG] == [
        b"sealed under an old key", b"sealed under run-b's key"]


def test_a_keyring_batch_that_fails_sends_no_log_record():
    producer = MemoryProducer()
    producer.refuse = {KEYRING}
    with pytest.raises(Refused):
        asyncio.run(_outbox_run(producer))
    assert not [entry for entry in producer.log if entry[1] == LOG]


def test_without_keyring_records_nothing_waits():
    producer = MemoryProducer(hold=True)  # nothing is acknowledged until released

    async def run() -> None:
        outbox = Outbox(producer, {KEYRING: [0], LOG: [0]}, frozenset({KEYRING}))
        await outbox.add(LOG, 0, b"run-a", b"v")
        await asyncio.wait_for(outbox.flush(), 1.0)  # handed over at once: no barrier to wait for

    asyncio.run(run())
    assert [entry[0] for entry in producer.log] == ["sent"]
