"""The contract of :class:`agentlog.worker.txlog.RecordLog`: one suite, run against every implementation.

A subclass provides ``make_log`` (a fresh log, the input partition count 2) and ``topics`` (an input topic and two
output topics that exist); :mod:`tests.unit.worker.test_txlog_memory` runs it in memory,
:mod:`tests.integration.worker.test_txlog_kafka` on the session broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentlog.worker.txlog import Fenced, RecordLog

Body = Callable[[RecordLog, str, str, str], Awaitable[None]]


async def tail(log: RecordLog, topic: str, partition: int, start: int) -> list[Any]:
    """:meth:`RecordLog.read` of one partition."""
    return (await log.read({(topic, partition): start}))[(topic, partition)]


async def _successor_commits(successor: Any, zombie: Any, ingest: str, out: str) -> None:
    """The fencing writer commits ``after`` to ``out`` and input position 2 of ``ingest``; both writers close."""
    async with successor.transaction() as tx:
        after = await tx.send(out, None, b"after", 0)
        tx.consumed(ingest, 0, 2)
    await after
    await zombie.close()
    await successor.close()


class LogContract:
    """What every :class:`RecordLog` guarantees: atomic records + positions, committed reads, fencing."""

    def make_log(self) -> RecordLog:
        raise NotImplementedError

    def topics(self) -> tuple[str, str, str]:
        raise NotImplementedError

    def run(self, body: Body) -> None:
        async def main() -> None:
            log = self.make_log()
            try:
                await body(log, *self.topics())
            finally:
                await log.close()

        asyncio.run(main())

    def test_committed_records_are_read_in_order_at_the_offsets_sent(self) -> None:
        async def body(log: RecordLog, ingest: str, out: str, changelog: str) -> None:
            writer = await log.writer(0)
            async with writer.transaction() as tx:
                a = await tx.send(out, b"k", b"one", 1)
                b = await tx.send(out, b"k", b"two", 1)
                tx.consumed(ingest, 0, 7)
            where = [await a, await b]
            await writer.close()
            read = await tail(log, out, 1, 0)
            assert [(r.offset, r.key, r.value) for r in read] == [(w.offset, b"k", v)
                                                                  for w, v in zip(where, (b"one", b"two"), strict=True)]
            assert where[1].offset == where[0].offset + 1
            assert await log.position(ingest, 0) == 7

        self.run(body)

    def test_read_from_an_offset_returns_the_tail(self) -> None:
        async def body(log: RecordLog, ingest: str, out: str, changelog: str) -> None:
            writer = await log.writer(0)
            sent = []
            for value in (b"a", b"b", b"c"):
                async with writer.transaction() as tx:
                    sent.append(await tx.send(changelog, b"k", value, 0))
            offsets = [(await s).offset for s in sent]
            await writer.close()
            assert [r.value for r in await tail(log, changelog, 0, offsets[1])] == [b"b", b"c"]
            assert await tail(log, changelog, 0, offsets[2] + 1) == []

        self.run(body)

    def test_an_aborted_transaction_leaves_no_record_and_no_position(self) -> None:
        async def body(log: RecordLog, ingest: str, out: str, changelog: str) -> None:
            writer = await log.writer(1)
            with pytest.raises(RuntimeError, match="handling failed"):
                async with writer.transaction() as tx:
                    await tx.send(out, b"k", b"lost", 0)
                    tx.consumed(ingest, 1, 5)
                    raise RuntimeError("handling failed")
            async with writer.transaction() as tx:
                kept = await tx.send(out, b"k", b"kept", 0)
                tx.consumed(ingest, 1, 3)
            await kept
            await writer.close()
            assert [r.value for r in await tail(log, out, 0, 0)] == [b"kept"]
            assert await log.position(ingest, 1) == 3

        self.run(body)

    def test_a_newer_writer_fences_the_older_one(self) -> None:
        async def body(log: RecordLog, ingest: str, out: str, changelog: str) -> None:
            zombie = await log.writer(0)
            async with zombie.transaction() as tx:
                first = await tx.send(out, None, b"before", 0)
                tx.consumed(ingest, 0, 1)
            await first
            successor = await log.writer(0)
            with pytest.raises(Fenced):
                async with zombie.transaction() as tx:
                    await tx.send(out, None, b"zombie", 0)
                    tx.consumed(ingest, 0, 9)
            await _successor_commits(successor, zombie, ingest, out)
            assert [r.value for r in await tail(log, out, 0, 0)] == [b"before", b"after"]
            assert await log.position(ingest, 0) == 2

        self.run(body)

    def test_a_writer_fenced_in_the_middle_of_a_transaction_commits_none_of_it(self) -> None:
        async def body(log: RecordLog, ingest: str, out: str, changelog: str) -> None:
            zombie = await log.writer(0)
            successor = None
            with pytest.raises(Fenced):
                async with zombie.transaction() as tx:
                    landed = await tx.send(out, None, b"zombie", 0)
                    successor = await log.writer(0)  # a new owner opens the partition's writer meanwhile
                    with contextlib.suppress(Fenced):
                        await landed  # refused where the record is handed over at once; after that, the producer
                        # knows it is fenced, and so is whatever the zombie goes on to send and its commit
                    for p in (0, 1):
                        await tx.send(changelog, None, b"zombie", p)
                    tx.consumed(ingest, 0, 9)
            assert successor is not None
            await _successor_commits(successor, zombie, ingest, out)
            assert [r.value for r in await tail(log, out, 0, 0)] == [b"after"]
            assert await tail(log, changelog, 0, 0) == await tail(log, changelog, 1, 0) == []
            assert await log.position(ingest, 0) == 2

        self.run(body)

    def test_writers_of_other_partitions_do_not_fence_each_other(self) -> None:
        async def body(log: RecordLog, ingest: str, out: str, changelog: str) -> None:
            w0, w1 = await log.writer(0), await log.writer(1)
            sent: list[Any] = []
            for writer, partition in ((w0, 0), (w1, 1)):
                async with writer.transaction() as tx:
                    sent.append(await tx.send(out, None, f"p{partition}".encode(), 0))
                    tx.consumed(ingest, partition, 4)
            for s in sent:
                await s
            await w0.close()
            await w1.close()
            assert sorted(r.value for r in await tail(log, out, 0, 0) if r.value) == [b"p0", b"p1"]
            assert (await log.position(ingest, 0), await log.position(ingest, 1)) == (4, 4)

        self.run(body)

    def test_one_read_takes_several_partitions_each_from_its_offset(self) -> None:
        async def body(log: RecordLog, ingest: str, out: str, changelog: str) -> None:
            writer = await log.writer(0)
            sent = []
            async with writer.transaction() as tx:
                for topic, partition, value in ((out, 0, b"o0"), (out, 1, b"o1"), (changelog, 0, b"c0"),
                                                (changelog, 0, b"c1")):
                    sent.append(await tx.send(topic, None, value, partition))
            second_c = (await sent[3]).offset
            await writer.close()
            read = await log.read({(out, 0): 0, (out, 1): 0, (changelog, 0): second_c, (changelog, 1): 0})
            assert {where: [r.value for r in records] for where, records in read.items()} == {
                (out, 0): [b"o0"], (out, 1): [b"o1"], (changelog, 0): [b"c1"], (changelog, 1): []}

        self.run(body)
