"""A batch that outlives its partitions writes no table (:mod:`agentlog.worker.fence`).

The fence is driven directly (its revocation wait, its assignment) and through
:meth:`Batch.commit` / ``batch._commit`` on the in-memory ports (:mod:`agentlog.worker.memory`),
as in ``test_batch_commit``. The real rebalance (two worker processes, real Kafka) is
``tests/integration/worker/test_rebalance_fence.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentlog.metrics import METRICS
from agentlog.worker.batch import Batch, _commit
from agentlog.worker.fence import Fence, Fenced, wait_bound
from agentlog.worker.memory import MemoryEvent, TopicPartition, event, memory_wiring, parts
from agentlog.worker.positions import DurablePositions

_tp = TopicPartition


class LoggedPositions(DurablePositions):
    """The agents' positions, each one published also logged."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def advance(self, table: str, topic: str, partition: int, position: int, generation: Any) -> None:
        self.log.append(f"position {topic}[{partition}]={position}")
        super().advance(table, topic, partition, position, generation)


async def _batch(log: list[str], fence: Fence, partition: int = 3, *, hold: bool = False) -> Batch:
    """A batch of one output and one key in each sequencer table, holding ``ingest[partition]`` up to 11."""
    wiring = memory_wiring(tables=("index", "runs"), hold=hold)
    wiring.fence = fence
    wiring.positions = LoggedPositions(log)
    b = Batch(wiring)
    await b.send("log", "r", b"out")
    for table, key in (("index", "r/e"), ("runs", "r")):
        b.set(table, partition, key, 1)
    b.advanced("runs", "ingest", partition, 11)
    return b


def _written(b: Batch) -> list[str]:
    """What the batch sent and what the broker acknowledged, in order."""
    return parts(b.wiring).producer.lines(strip="agentlog.")


async def _commit_releasing(b: Batch, on_ack: list[Callable[[], None]]) -> None:
    """``b.commit()`` with every acknowledgement given by hand; after the i-th, ``on_ack[i]()`` runs."""
    producer = parts(b.wiring).producer
    committing = asyncio.ensure_future(b.commit())
    acks = iter(on_ack)
    while not committing.done():
        await asyncio.sleep(0)
        if producer.release():
            next(acks, lambda: None)()
    await committing


def test_before_the_first_assignment_and_for_owned_partitions_nothing_is_fenced():
    fence = Fence()
    assert fence.unowned([("ingest", 3)]) == []
    fence.assigned([_tp("ingest", 3), _tp("ingest", 4)])
    assert fence.unowned([("ingest", 3), ("ingest", 4)]) == []
    assert fence.unowned([("ingest", 5), ("ingest", 3), ("ingest", 5)]) == [("ingest", 5)]


def test_a_revocation_waits_for_the_agents_work_then_owns_nothing_until_the_next_assignment():
    async def scenario() -> list[str]:
        log: list[str] = []
        fence = Fence(bound_s=5.0)
        fence.assigned([_tp("ingest", 3)])
        done = asyncio.Event()

        async def settle() -> None:
            await done.wait()
            log.append("settled")

        fence.register(settle)
        revoking = asyncio.ensure_future(fence.revoked())
        await asyncio.sleep(0.01)
        assert not revoking.done()
        assert fence.unowned([("ingest", 3)]) == []  # the batch being waited for may still write
        done.set()
        assert await revoking is True
        log.append("revoked")
        assert fence.unowned([("ingest", 3)]) == [("ingest", 3)]
        fence.assigned([_tp("ingest", 3)])
        assert fence.unowned([("ingest", 3)]) == []
        return log

    assert asyncio.run(scenario()) == ["settled", "revoked"]


def test_a_revocation_waits_no_longer_than_its_bound():
    async def scenario() -> None:
        fence = Fence(bound_s=0.05)
        fence.assigned([_tp("ingest", 3)])
        fence.register(lambda: asyncio.sleep(10))
        assert await asyncio.wait_for(fence.revoked(), 2) is False
        assert fence.unowned([("ingest", 3)]) == [("ingest", 3)]

    asyncio.run(scenario())


def test_a_member_the_group_dropped_does_not_wait_its_batch_is_fenced_at_once():
    """Its partitions are someone else's already: waiting would let the late table write through."""

    async def scenario() -> None:
        dropped = False
        fence = Fence(bound_s=5.0, dropped=lambda: dropped)
        fence.assigned([_tp("ingest", 3)])
        fence.register(lambda: asyncio.sleep(10))  # a batch in progress
        dropped = True
        assert await asyncio.wait_for(fence.revoked(), 0.5) is False  # the bound is 5 s: it did not wait
        assert fence.unowned([("ingest", 3)]) == [("ingest", 3)]  # whatever the batch does next is fenced

    asyncio.run(scenario())


def test_before_the_first_assignment_a_member_without_a_generation_is_not_fenced():
    async def scenario() -> None:
        fence = Fence(bound_s=0.2, dropped=lambda: True)  # aiokafka's generation is -1 before the first join too
        settled: list[str] = []

        async def settle() -> None:
            settled.append("settled")

        fence.register(settle)
        assert await fence.revoked() is True
        assert settled == ["settled"]

    asyncio.run(scenario())


def test_the_bound_is_at_most_half_the_rebalance_timeout():
    assert wait_bound(5.0, 10.0) == 5.0
    assert wait_bound(5.0, 6.0) == 3.0
    assert wait_bound(1.0, 60.0) == 1.0
    assert wait_bound(0.0, 10.0) == 0.0


def test_a_batch_of_a_partition_that_moved_writes_no_table_and_no_position():
    async def scenario() -> tuple[list[str], Batch]:
        log: list[str] = []
        fence = Fence()
        fence.assigned([_tp("ingest", 4)])  # partition 3 went to another worker
        batch = await _batch(log, fence)
        with pytest.raises(Fenced, match=r"ingest\[3\]"):
            await batch.commit()
        return log, batch

    log, batch = asyncio.run(scenario())
    # its outputs were sent (a redelivery resends the same bytes), no table
    assert _written(batch) == ["write log r=out", "acked log[0]"]
    assert log == []  # no position
    assert all(not t.data for t in batch.wiring.tables.values())  # type: ignore[attr-defined]


def test_a_partition_lost_between_stages_stops_the_batch_before_the_next_stage():
    async def scenario() -> tuple[list[str], Batch]:
        log: list[str] = []
        fence = Fence()
        fence.assigned([_tp("ingest", 3)])
        batch = await _batch(log, fence, hold=True)
        with pytest.raises(Fenced):
            # the outputs are acknowledged, then the index stage, and then the partition is gone
            await _commit_releasing(batch, [lambda: None, lambda: fence.assigned([])])
        return log, batch

    log, batch = asyncio.run(scenario())
    # index written (a run record behind its index is folded again on redelivery), runs and the position not
    assert _written(batch) == ["write log r=out", "acked log[0]", 'write index "r/e"=1', "acked index[3]"]
    assert log == []
    assert batch.wiring.tables["index"].data == {"r/e": 1}  # type: ignore[attr-defined]
    assert batch.wiring.tables["runs"].data == {}  # type: ignore[attr-defined]


def test_a_fenced_batch_is_not_a_failure_the_agent_goes_on():
    async def scenario() -> list[str]:
        log: list[str] = []
        fence = Fence()
        fence.assigned([_tp("ingest", 4)])
        after: list[str] = []

        async def note(batch: Any) -> None:
            after.append("after")

        fenced = METRICS.get("agentlog_batches_fenced_total", agent="fence-test")
        moved = await _batch(log, fence, partition=3)
        await _commit(moved, "fence-test", None, note)  # fenced: no raise, no after hook
        assert METRICS.get("agentlog_batches_fenced_total", agent="fence-test") == fenced + 1
        kept = await _batch(log, fence, partition=4)
        await _commit(kept, "fence-test", None, note)
        written.extend(_written(moved) + _written(kept))
        return log + after

    written: list[str] = []
    log = asyncio.run(scenario())
    assert written.count('write index "r/e"=1') == 1
    assert log[-2:] == ["position ingest[4]=11", "after"]


def test_records_taken_before_a_rebalance_are_dropped_for_partitions_that_moved():
    fence = Fence()
    events: list[MemoryEvent] = [event("ingest", 3, 0), event("ingest", 4, 0), event("ingest", 3, 1)]
    assert fence.owned_events(events) is events  # before the first assignment: everything
    fence.assigned([_tp("ingest", 4)])
    assert [e.message.partition for e in fence.owned_events(events)] == [4]
