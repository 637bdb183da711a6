"""A batch that outlives its partitions writes no table (:mod:`processors.worker.fence`).

The fence is driven directly (its revocation wait, its assignment) and through
:meth:`Batch.commit` / ``batch._commit`` with a recording producer stand-in, as in
``test_batch_commit``. The real rebalance (two worker processes, real Kafka) is
``tests/integration/worker/test_rebalance_fence.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from processors.metrics import METRICS
from processors.worker.batch import Batch, _commit
from processors.worker.fence import Fence, Fenced, wait_bound
from processors.worker.tables import MemoryTable


def _tp(topic: str, partition: int) -> Any:
    return SimpleNamespace(topic=topic, partition=partition)


class Recording:
    """An outbox that logs what the batch does, and may run ``on_ack`` when a stage is acknowledged."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.on_ack: Any = None

    async def flush(self) -> None:
        self.log.append("flush")

    async def wait(self) -> None:
        self.log.append("acked")
        if self.on_ack is not None:
            self.on_ack()

    async def add(self, topic: str, partition: int, key: bytes, value: bytes | None, on_acked: Any = None) -> None:
        self.log.append(f"write {topic} {key.decode()}")


def _batch(log: list[str], fence: Fence, partition: int = 3) -> Batch:
    tables = {name: MemoryTable(name) for name in ("index", "heads", "runs")}
    positions = SimpleNamespace(advance=lambda table, topic, part, position, generation:
                                log.append(f"position {topic}[{part}]={position}"))
    b = object.__new__(Batch)
    b.wiring = SimpleNamespace(tables=tables, positions=positions, fence=fence)  # type: ignore[assignment]
    b._outbox = Recording(log)  # type: ignore[assignment]
    b._writes = {("index", "r/e"): (partition, 1), ("heads", "r"): (partition, 1), ("runs", "r"): (partition, 1)}
    b._positions = {("heads", "ingest", partition): 11}
    b._generation = 1
    return b


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
    log: list[str] = []
    fence = Fence()
    fence.assigned([_tp("ingest", 4)])  # partition 3 went to another worker
    batch = _batch(log, fence)
    with pytest.raises(Fenced, match=r"ingest\[3\]"):
        asyncio.run(batch.commit())
    assert log == ["flush", "acked"]  # its outputs were sent (a redelivery resends the same bytes), no table
    assert all(not t.data for t in batch.wiring.tables.values())


def test_a_partition_lost_between_stages_stops_the_batch_before_the_next_stage():
    log: list[str] = []
    fence = Fence()
    fence.assigned([_tp("ingest", 3)])
    batch = _batch(log, fence)
    acks = iter([lambda: None, lambda: fence.assigned([])])  # the outputs, then the index stage
    batch._outbox.on_ack = lambda: next(acks, lambda: None)()  # type: ignore[attr-defined]
    with pytest.raises(Fenced):
        asyncio.run(batch.commit())
    # index written (a head behind its index is repaired on redelivery), heads/runs and the position not
    assert log == ["flush", "acked", 'write index "r/e"', "flush", "acked"]


def test_a_fenced_batch_is_not_a_failure_the_agent_goes_on():
    async def scenario() -> list[str]:
        log: list[str] = []
        fence = Fence()
        fence.assigned([_tp("ingest", 4)])
        after: list[str] = []

        async def note(batch: Any) -> None:
            after.append("after")

        fenced = METRICS.get("agentlog_batches_fenced_total", agent="fence-test")
        await _commit(_batch(log, fence, partition=3), "fence-test", None, note)  # fenced: no raise, no after hook
        assert METRICS.get("agentlog_batches_fenced_total", agent="fence-test") == fenced + 1
        await _commit(_batch(log, fence, partition=4), "fence-test", None, note)
        return log + after

    log = asyncio.run(scenario())
    assert log.count('write index "r/e"') == 1
    assert log[-2:] == ["position ingest[4]=11", "after"]


def test_records_taken_before_a_rebalance_are_dropped_for_partitions_that_moved():
    def event(partition: int) -> Any:
        return SimpleNamespace(message=SimpleNamespace(topic="ingest", partition=partition))

    fence = Fence()
    events = [event(3), event(4), event(3)]
    assert fence.owned_events(events) is events  # before the first assignment: everything
    fence.assigned([_tp("ingest", 4)])
    assert [e.message.partition for e in fence.owned_events(events)] == [4]
