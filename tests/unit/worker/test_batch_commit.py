"""A batch's commit: outputs, then tables in stages, then positions, before the agent takes its next batch.

:meth:`Batch.commit` and :func:`batched_agent` run on the in-memory ports (:mod:`agentlog.worker.memory`:
a producer that acknowledges on the next turn of the event loop, a stream of ticks, a runner that
keeps the agent), to see the order of sends and acknowledgements, the hooks, failures and the fence's
wait around each batch. The real worker's batches (real Kafka, SIGKILLs) are covered by
``tests/integration/worker`` and ``tests/faults/test_worker_crashes.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentlog.worker import batch as batch_module
from agentlog.worker.batch import Batch, SourceRecord, _commit, _stages, batched_agent, position_key
from agentlog.worker.fence import Fence
from agentlog.worker.memory import MemoryStream, Refused, TopicPartition, event, memory_wiring, parts
from agentlog.worker.wiring import Wiring


def _wiring(*tables: str) -> Wiring:
    return memory_wiring(tables=tables or ("index", "runs", "links"))


def _batch(wiring: Wiring, writes: dict[tuple[str, str], Any] | None = None, partition: int = 0) -> Batch:
    b = Batch(wiring)
    for (table, key), value in (writes or {}).items():
        b.set(table, partition, key, value)
    b.partition = partition
    return b


def _written(wiring: Wiring) -> list[str]:
    return parts(wiring).producer.lines(strip="agentlog.")


def test_a_batch_is_made_durable_outputs_then_table_stages_in_order_then_positions():
    async def scenario() -> Wiring:
        wiring = _wiring()
        wiring.positions.consumes("ingest", "runs")
        b = _batch(wiring, {("links", "c1"): 3, ("runs", "r1"): 2, ("index", "r1/e1"): 1, ("index", "r1/e2"): 2})
        await b.send("log", "r1", b"out")
        b.advanced("runs", "ingest", 0, 20)
        await b.commit()
        return wiring

    wiring = asyncio.run(scenario())
    # Each stage is sent only once the one before it is acknowledged (acknowledgements come a turn later).
    assert _written(wiring) == ["write log r1=out", "acked log[0]",
                                'write index "r1/e1"=1', 'write index "r1/e2"=2', "acked index[0]",
                                'write runs "r1"=2', 'write runs "\\u0000position\\u001fingest\\u001f0"=20',
                                "acked runs[0]", 'write links "c1"=3', "acked links[0]"]
    assert wiring.positions.committable("ingest", 0, 1) == 20
    # the position is written with the agent's table, in its stage: a restart resumes from it
    assert wiring.tables["runs"].data == {"r1": 2, position_key("ingest", 0): 20}  # type: ignore[attr-defined]


def test_a_stage_reaches_the_local_copy_only_once_its_changelog_records_are_acknowledged():
    """A crash (here a refused stage) leaves the local copy a prefix of the changelog, never ahead of it."""
    wiring = _wiring()
    tables: dict[str, Any] = wiring.tables
    b = _batch(wiring, {("runs", "r1"): 2, ("index", "r1/e1"): 1})
    parts(wiring).producer.refuse = {"runs"}  # the outputs, the index stage, then runs: refused
    with pytest.raises(Refused, match="the broker refused"):
        asyncio.run(b.commit())
    assert tables["index"].data == {"r1/e1": 1}
    assert tables["index"].offsets == {0: 0}  # marked as holding the changelog up to its acknowledged record
    assert tables["runs"].data == {}
    assert tables["runs"].offsets == {}


def test_tables_are_written_in_stages_closed_index_runs_links_then_the_rest_one_by_one():
    written = dict.fromkeys(["runs", "spans", "index", "other", "links", "closed"])
    assert _stages(written) == [["closed"], ["index"], ["runs"], ["links"], ["spans"], ["other"]]
    assert _stages(dict.fromkeys(["runs"])) == [["runs"]]
    assert _stages({}) == []


def test_a_batch_reads_its_own_writes_first_then_the_table():
    wiring = _wiring("runs", "other")
    table: Any = wiring.tables["runs"]
    table.data.update({"k": "durable", "only-durable": 1, "gone": "x", "p/1": 1, "p/2": 2})
    b = _batch(wiring, {("runs", "k"): "mine", ("runs", "gone"): None, ("runs", "p/3"): 3, ("runs", "p/2"): None,
                        ("other", "p/4"): 4})
    assert b.get("runs", "k") == "mine"
    assert b.get("runs", "only-durable") == 1
    assert b.get("runs", "gone") is None  # deleted by the batch, still in the table until it is durable
    assert b.get("runs", "absent") is None
    assert b.keys_from("runs", "p/") == ["p/1", "p/3"]  # another table's pending key is not this one's


def test_a_batch_lists_a_key_group_from_its_table_and_its_own_writes():
    wiring = _wiring("index", "runs")
    table: Any = wiring.tables["index"]
    table.data.update({"r\x1fe1": [0], "r\x1fe2": [1], "rr\x1fe1": [0], "s\x1fe1": [0]})
    b = _batch(wiring, {("index", "r\x1fe2"): None, ("index", "r\x1fe3"): [2], ("index", "rr\x1fe9"): [9],
                        ("runs", "r\x1fe4"): 4})
    assert b.keys_from("index", "r\x1f") == ["r\x1fe1", "r\x1fe3"]  # not rr's, not another table's
    b.set("index", 0, "r\x1fe3", None)
    b.set("index", 0, "r\x1fe2", [1])
    assert b.keys_from("index", "r\x1f") == ["r\x1fe1", "r\x1fe2"]
    assert b.keys_from("index", "r") == ["r\x1fe1", "r\x1fe2", "rr\x1fe1", "rr\x1fe9"]  # not a group: every write


class Stub:
    """A batch whose durability step is logged (and may fail)."""

    def __init__(self, name: str, log: list[str], error: BaseException | None = None) -> None:
        self.name, self.log, self.error = name, log, error

    async def commit(self) -> None:
        if self.error is not None:
            raise self.error
        self.log.append(f"durable {self.name}")


def _hooks(log: list[str]) -> tuple[Any, Any]:
    async def before(batch: Any) -> None:
        log.append(f"before {batch.name}")

    async def after(batch: Any) -> None:
        log.append(f"after {batch.name}")

    return before, after


def test_the_hooks_run_around_the_commit():
    log: list[str] = []
    asyncio.run(_commit(Stub("a", log), "test", *_hooks(log)))  # type: ignore[arg-type]
    assert log == ["before a", "durable a", "after a"]


def test_a_failed_commit_is_raised_and_its_after_hook_does_not_run():
    log: list[str] = []
    with pytest.raises(RuntimeError, match="broker said no"):
        asyncio.run(_commit(Stub("a", log, RuntimeError("broker said no")), "test", *_hooks(log)))  # type: ignore[arg-type]
    assert log == ["before a"]


# batched_agent on the in-memory ports: a stream of ticks, the agent run as the runner keeps it.

def _event(offset: int) -> Any:
    return event("ingest", 0, offset, b"x")


def _agent(monkeypatch: pytest.MonkeyPatch, handle: Any, before: Any = None, after: Any = None) -> tuple[Any, Fence]:
    """Register one agent on the in-memory ports; its records go straight to ``handle`` (no hole to heal)."""

    async def in_order(batch: Any, table: str, msg: Any, value: bytes, handle: Any) -> None:
        await handle(batch, SourceRecord(msg.topic, msg.partition, msg.offset, 0, value))

    monkeypatch.setattr(batch_module, "in_order", in_order)
    monkeypatch.setattr(batch_module, "BATCH_QUIET_S", 0.010)
    monkeypatch.setattr(batch_module, "BATCH_WITHIN_S", 1.0)
    wiring = memory_wiring(tables=("heads",))
    wiring.fence = Fence(bound_s=5.0)
    batched_agent(wiring, "ingest", name="test-agent", table="heads", handle=handle,
                  before_commit=before, after_commit=after)
    _, agent = parts(wiring).runner.agents["test-agent"]
    return agent, wiring.fence


def test_each_batch_is_durable_before_the_next_is_handled(monkeypatch):
    async def scenario() -> list[str]:
        log: list[str] = []
        gate = asyncio.Event()

        async def handle(batch: Any, record: SourceRecord) -> None:
            batch.collected.append(record.offset)
            log.append(f"handled {record.offset}")

        async def before(batch: Any) -> None:
            log.append(f"before {batch.collected}")
            await gate.wait()

        async def after(batch: Any) -> None:
            log.append(f"after {batch.collected}")

        agent, _ = _agent(monkeypatch, handle, before, after)
        stream = MemoryStream([_event(0)], [_event(1)])
        running = asyncio.ensure_future(agent(stream))
        await asyncio.sleep(0.05)
        assert log == ["handled 0", "before [0]"]  # the second tick is there, and waits for the first batch
        gate.set()
        await asyncio.sleep(0.05)
        stream.close()
        await running
        return log

    assert asyncio.run(scenario()) == ["handled 0", "before [0]", "after [0]", "handled 1", "before [1]", "after [1]"]


def test_a_revocation_waits_for_the_batch_in_progress_and_no_longer(monkeypatch):
    async def scenario() -> list[str]:
        log: list[str] = []
        release = asyncio.Event()

        async def handle(batch: Any, record: SourceRecord) -> None:
            log.append(f"handled {record.offset}")
            await release.wait()

        async def after(batch: Any) -> None:
            log.append("durable")

        agent, fence = _agent(monkeypatch, handle, after=after)
        stream = MemoryStream([_event(0)])
        running = asyncio.ensure_future(agent(stream))
        await asyncio.sleep(0.05)
        revoking = asyncio.ensure_future(fence.revoked())
        await asyncio.sleep(0.05)
        assert not revoking.done()  # the batch in progress is not durable yet
        release.set()
        assert await revoking is True
        log.append("revoked")
        assert await asyncio.wait_for(fence.revoked(), 0.5) is True  # no batch in progress: at once
        stream.close()
        await running
        return log

    assert asyncio.run(scenario()) == ["handled 0", "durable", "revoked"]


def test_a_failed_commit_crashes_the_agent_and_no_later_batch_is_handled(monkeypatch):
    async def scenario() -> list[str]:
        log: list[str] = []

        async def handle(batch: Any, record: SourceRecord) -> None:
            log.append(f"handled {record.offset}")

        async def fail(batch: Any) -> None:
            raise RuntimeError("broker said no")

        async def after(batch: Any) -> None:
            log.append("after")

        monkeypatch.setattr(Batch, "commit", fail)
        agent, fence = _agent(monkeypatch, handle, after=after)
        with pytest.raises(RuntimeError, match="broker said no"):  # Faust's supervisor restarts the agent
            await asyncio.wait_for(agent(MemoryStream([_event(0)], [_event(1)])), 2)
        assert await asyncio.wait_for(fence.revoked(), 0.5) is True  # nothing left in progress
        return log

    assert asyncio.run(scenario()) == ["handled 0"]


# heal_stalled: which partitions are read again.

def _stall_wiring(handled: int, high: int, read: int | None, fetched: int | None) -> tuple[Wiring, Any]:
    """One partition of ``ingest``: the agent's position, the broker's high watermark, Faust's and aiokafka's."""
    from agentlog.worker.batch import position_key

    wiring = memory_wiring(tables=("heads",))
    wiring.positions.consumes("ingest", "heads")
    wiring.tables["heads"].put(0, position_key("ingest", 0), handled)
    tp = TopicPartition("ingest", 0)
    source = parts(wiring).source
    source.assigned = {tp}
    source.highwaters[tp] = high
    if read is not None:
        source.read_offsets[tp] = read
    if fetched is not None:
        source.fetch_positions[tp] = fetched
    return wiring, tp


@pytest.mark.parametrize(("read", "fetched", "sought"), [
    (None, 100, True), (39, 100, True), (40, 100, False), (90, 100, False), (None, 60, False), (None, None, False)],
    ids=["nothing delivered", "delivered only what was handled", "one record queued", "a backlog queued",
         "not all fetched yet", "fetch position unknown"])
def test_a_partition_is_read_again_only_when_records_left_aiokafka_and_never_reached_the_agent(
        read, fetched, sought):
    """Records Faust handed to its stream are a backlog, records aiokafka has not handed over yet not fetched."""
    wiring, tp = _stall_wiring(handled=40, high=100, read=read, fetched=fetched)
    source = parts(wiring).source
    seen: dict[Any, int] = {}
    asyncio.run(batch_module.heal_stalled(wiring, seen))  # the first look only notes the position
    assert source.sought == []
    asyncio.run(batch_module.heal_stalled(wiring, seen))  # no progress for one interval
    assert source.sought == ([(tp, 40)] if sought else [])


def test_no_partition_is_read_again_while_the_group_settles():
    wiring, _ = _stall_wiring(handled=40, high=100, read=None, fetched=100)
    parts(wiring).membership.rebalancing = True
    seen: dict[Any, int] = {}
    for _ in range(3):
        asyncio.run(batch_module.heal_stalled(wiring, seen))
    assert parts(wiring).source.sought == [] and seen == {}


def test_a_stage_marks_each_partition_as_holding_its_last_acknowledged_record_and_writes_it_in_one_go():
    wiring = _wiring()
    tables: dict[str, Any] = wiring.tables
    b = _batch(wiring)
    b.set("index", 0, "r1/e1", 1)
    b.set("index", 1, "r2/e1", 1)
    b.set("index", 0, "r1/e2", 2)
    b.set("index", 1, "r2/e2", None)
    written: list[tuple[int, list[str]]] = []
    put_many = tables["index"].put_many
    tables["index"].put_many = lambda partition, items: (  # type: ignore[method-assign]
        written.append((partition, [key for key, _, _ in items])), put_many(partition, items))
    asyncio.run(b.commit())
    # Each partition's changelog holds its two records at offsets 0 and 1. The two batches are acknowledged
    # in one turn of the event loop (one produce response): both partitions are marked all the same.
    assert tables["index"].offsets == {0: 1, 1: 1}
    assert parts(wiring).broker.values("index", 1) == [b"1", None]  # the deleted key: a tombstone
    assert written == [(0, ["r1/e1", "r1/e2"]), (1, ["r2/e1", "r2/e2"])]
    assert tables["index"].data == {"r1/e1": 1, "r1/e2": 2, "r2/e1": 1}


def test_a_keyed_record_goes_to_the_partition_the_producers_default_partitioner_picks():
    from aiokafka.partitioner import DefaultPartitioner

    outbox = batch_module.Outbox(parts(memory_wiring()).producer, {"t": [0, 1, 2, 3], "u": [0, 1, 2, 3, 4, 5, 6]})
    for i in range(2000):
        key = f"run-{i}-\u00e9".encode()
        for topic, partitions in (("t", [0, 1, 2, 3]), ("u", [0, 1, 2, 3, 4, 5, 6])):
            expected = DefaultPartitioner()(key, partitions, partitions)
            assert outbox.chosen(topic, key) == expected
            assert asyncio.run(outbox.partition_for(topic, key)) == expected
    assert outbox.chosen("t", None) is None and outbox.chosen("unknown", b"k") is None
