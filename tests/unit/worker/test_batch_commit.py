"""A batch's commit: outputs, then tables in stages, then positions, before the agent takes its next batch.

:meth:`Batch.commit` is driven with a recording producer stand-in; :func:`batched_agent` with a
stand-in for Faust's stream and app (no broker), to see the hooks, failures and the fence's wait
around each batch. The real worker's batches (real Kafka, SIGKILLs) are covered by
``tests/integration/worker`` and ``tests/faults/test_worker_crashes.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from processors.worker import batch as batch_module
from processors.worker.batch import Batch, SourceRecord, _commit, _stages, batched_agent
from processors.worker.fence import Fence
from processors.worker.tables import MemoryTable
from processors.worker.wiring import Wiring
from streams.settings import Settings


def _batch(name: str, writes: dict[tuple[str, str], Any] | None = None) -> Any:
    b = object.__new__(Batch)
    b.name = name  # type: ignore[attr-defined]
    b._writes = {k: (0, v) for k, v in (writes or {}).items()}
    b.partition = 0
    return b


class RecordingOutbox:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    async def flush(self) -> None:
        self.log.append(f"flush {self.name}")

    async def wait(self) -> None:
        self.log.append(f"acked {self.name}")

    async def add(self, topic: str, partition: int, key: bytes, value: bytes | None, on_acked: Any = None) -> None:
        self.log.append(f"write {topic} {key.decode()}={value.decode() if value is not None else None}")


def test_a_batch_is_made_durable_outputs_then_table_stages_in_order_then_positions():
    log: list[str] = []
    tables = {name: MemoryTable(name) for name in ("index", "heads", "runs")}
    advanced: list[tuple[str, int]] = []
    positions = SimpleNamespace(advance=lambda table, topic, partition, position, generation:
                                advanced.append((topic, position)))
    b = _batch("a", {("runs", "r1"): 2, ("heads", "r1"): 2, ("index", "r1/e1"): 1, ("index", "r1/e2"): 2})
    b.wiring = SimpleNamespace(tables=tables, positions=positions, fence=Fence())
    b._outbox = RecordingOutbox(log, "a")
    b._positions = {("heads", "ingest", 0): 20}
    b._generation = 1
    asyncio.run(b.commit())
    assert log == ["flush a", "acked a",
                   'write index "r1/e1"=1', 'write index "r1/e2"=2', "flush a", "acked a",
                   'write heads "r1"=2', 'write runs "r1"=2', "flush a", "acked a"]
    assert advanced == [("ingest", 20)]
    assert tables["runs"].data == {"r1": 2}


class AckingOutbox:
    """Acknowledges each record at :meth:`wait` with the next offset; the ``refuse``-th wait fails."""

    def __init__(self, refuse: int = 0) -> None:
        self.waits, self.refuse, self.offset = 0, refuse, 100
        self.pending: list[tuple[int, Any]] = []

    async def flush(self) -> None:
        pass

    async def wait(self) -> None:
        self.waits += 1
        if self.waits == self.refuse:
            raise RuntimeError("broker said no")
        for partition, on_acked in self.pending:
            self.offset += 1
            if on_acked is not None:
                on_acked(partition, self.offset, None)
        self.pending.clear()

    async def add(self, topic: str, partition: int, key: bytes, value: bytes | None, on_acked: Any = None) -> None:
        self.pending.append((partition, on_acked))


def test_a_stage_reaches_the_local_copy_only_once_its_changelog_records_are_acknowledged():
    """A crash (here a refused stage) leaves the local copy a prefix of the changelog, never ahead of it."""
    tables = {name: MemoryTable(name) for name in ("index", "heads", "runs")}
    b = _batch("a", {("runs", "r1"): 2, ("heads", "r1"): 2, ("index", "r1/e1"): 1})
    b.wiring = SimpleNamespace(tables=tables, positions=None, fence=Fence())
    b._outbox = AckingOutbox(refuse=3)  # the outputs, the index stage, then heads + runs: refused
    b._positions = {}
    b._generation = 1
    with pytest.raises(RuntimeError, match="broker said no"):
        asyncio.run(b.commit())
    assert tables["index"].data == {"r1/e1": 1}
    assert tables["index"].offsets == {0: 101}  # marked as holding the changelog up to its acknowledged record
    assert tables["heads"].data == tables["runs"].data == {}
    assert tables["heads"].offsets == tables["runs"].offsets == {}


def test_tables_are_written_in_stages_index_alone_then_heads_with_runs_then_the_rest_one_by_one():
    written = dict.fromkeys(["runs", "spans", "index", "heads", "other", "links", "closed"])
    assert _stages(written) == [["closed"], ["index"], ["heads", "runs"], ["links"], ["spans"], ["other"]]
    assert _stages(dict.fromkeys(["runs"])) == [["runs"]]
    assert _stages({}) == []


def test_a_batch_reads_its_own_writes_first_then_the_table():
    table = MemoryTable("runs")
    table.data.update({"k": "durable", "only-durable": 1, "gone": "x", "p/1": 1, "p/2": 2})
    b = _batch("r", {("runs", "k"): "mine", ("runs", "gone"): None, ("runs", "p/3"): 3, ("runs", "p/2"): None,
                     ("heads", "p/4"): 4})
    b.wiring = SimpleNamespace(tables={"runs": table})
    assert b.get("runs", "k") == "mine"
    assert b.get("runs", "only-durable") == 1
    assert b.get("runs", "gone") is None  # deleted by the batch, still in the table until it is durable
    assert b.get("runs", "absent") is None
    assert b.keys_from("runs", "p/") == ["p/1", "p/3"]  # another table's pending key is not this one's


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


# batched_agent with stand-ins for Faust's stream and app.

def _event(offset: int) -> Any:
    return SimpleNamespace(value=b"x", message=SimpleNamespace(topic="ingest", partition=0, offset=offset, tp="p0"))


class Ticks:
    """Faust's stream as the loop sees it: these ticks, then nothing until ``end`` is set."""

    def __init__(self, *ticks: list[Any]) -> None:
        self.ticks = ticks
        self.end = asyncio.Event()

    def take_events(self, max_events: int, within: float) -> Any:
        async def ticks() -> Any:
            for tick in self.ticks:
                yield tick
            await self.end.wait()

        return ticks()


def _agent(monkeypatch: pytest.MonkeyPatch, handle: Any, before: Any = None, after: Any = None) -> tuple[Any, Fence]:
    """Register one agent on a stand-in wiring; its records go straight to ``handle`` (no hole to heal)."""

    async def in_order(batch: Any, table: str, msg: Any, value: bytes, handle: Any) -> None:
        await handle(batch, SourceRecord(msg.topic, msg.partition, msg.offset, 0, value))

    monkeypatch.setattr(batch_module, "in_order", in_order)
    monkeypatch.setattr(batch_module, "BATCH_QUIET_S", 0.010)
    monkeypatch.setattr(batch_module, "BATCH_WITHIN_S", 1.0)
    registered: list[Any] = []
    fence = Fence(bound_s=5.0)
    app = SimpleNamespace(rebalancing=False, consumer=None, consumer_generation_id=1,
                          producer=SimpleNamespace(_ensure_producer=lambda: None),
                          agent=lambda topic, name, concurrency: registered.append)
    wiring = Wiring(settings=Settings(), app=app, fence=fence,  # type: ignore[arg-type]
                    positions=SimpleNamespace(consumes=lambda topic, table: None),  # type: ignore[arg-type]
                    topics={"ingest": SimpleNamespace(get_topic_name=lambda: "ingest")}, tables={})
    batched_agent(wiring, "ingest", name="test-agent", table="heads", handle=handle,  # type: ignore[arg-type]
                  before_commit=before, after_commit=after)
    return registered[0], fence


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
        stream = Ticks([_event(0)], [_event(1)])
        running = asyncio.ensure_future(agent(stream))
        await asyncio.sleep(0.05)
        assert log == ["handled 0", "before [0]"]  # the second tick is there, and waits for the first batch
        gate.set()
        await asyncio.sleep(0.05)
        stream.end.set()
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
        stream = Ticks([_event(0)])
        running = asyncio.ensure_future(agent(stream))
        await asyncio.sleep(0.05)
        revoking = asyncio.ensure_future(fence.revoked())
        await asyncio.sleep(0.05)
        assert not revoking.done()  # the batch in progress is not durable yet
        release.set()
        assert await revoking is True
        log.append("revoked")
        assert await asyncio.wait_for(fence.revoked(), 0.5) is True  # no batch in progress: at once
        stream.end.set()
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
            await asyncio.wait_for(agent(Ticks([_event(0)], [_event(1)])), 2)
        assert await asyncio.wait_for(fence.revoked(), 0.5) is True  # nothing left in progress
        return log

    assert asyncio.run(scenario()) == ["handled 0"]


# heal_stalled: which partitions are read again.

class StallConsumer:
    """Faust's consumer as the stall check sees it: one partition, its high watermark and read offset."""

    def __init__(self, tp: Any, high: int, read: int | None) -> None:
        self.tp, self.high = tp, high
        self._committed_offset: dict[Any, int] = {}
        self._read_offset: dict[Any, int | None] = {tp: read} if read is not None else {}
        self.sought: list[tuple[Any, int]] = []

    def assignment(self) -> list[Any]:
        return [self.tp]

    def highwater(self, tp: Any) -> int:
        return self.high

    async def seek(self, tp: Any, offset: int) -> None:
        self.sought.append((tp, offset))


def _stall_wiring(consumer: StallConsumer, handled: int) -> Any:
    from processors.worker.batch import position_key

    heads = MemoryTable("heads")
    heads.data[position_key("ingest", 0)] = handled
    positions = SimpleNamespace(topics=lambda: {"ingest"}, tables_for=lambda topic: ["heads"])
    return SimpleNamespace(app=SimpleNamespace(consumer=consumer, rebalancing=False), positions=positions,
                           tables={"heads": heads})


@pytest.mark.parametrize(("read", "fetched", "sought"), [
    (None, 100, True), (39, 100, True), (40, 100, False), (90, 100, False), (None, 60, False), (None, None, False)],
    ids=["nothing delivered", "delivered only what was handled", "one record queued", "a backlog queued",
         "not all fetched yet", "fetch position unknown"])
def test_a_partition_is_read_again_only_when_records_left_aiokafka_and_never_reached_the_agent(
        read, fetched, sought, monkeypatch):
    """Records Faust handed to its stream are a backlog, records aiokafka has not handed over yet not fetched."""
    from aiokafka import TopicPartition

    monkeypatch.setattr(batch_module.internals, "fetch_position", lambda consumer, tp: fetched)
    tp = TopicPartition("ingest", 0)
    consumer = StallConsumer(tp, high=100, read=read)
    wiring = _stall_wiring(consumer, handled=40)
    seen: dict[Any, int] = {}
    asyncio.run(batch_module.heal_stalled(wiring, seen))  # the first look only notes the position
    assert consumer.sought == []
    asyncio.run(batch_module.heal_stalled(wiring, seen))  # no progress for one interval
    assert consumer.sought == ([(tp, 40)] if sought else [])


def test_a_stage_marks_each_partition_as_holding_its_last_acknowledged_record_and_writes_it_in_one_go():
    tables = {name: MemoryTable(name) for name in ("index", "heads", "runs")}
    b = _batch("a")
    b._writes = {("index", "r1/e1"): (0, 1), ("index", "r2/e1"): (1, 1), ("index", "r1/e2"): (0, 2),
                 ("index", "r2/e2"): (1, None)}
    b.wiring = SimpleNamespace(tables=tables, positions=None, fence=Fence())
    b._outbox = AckingOutbox()
    b._positions = {}
    b._generation = 1
    written: list[tuple[int, list[str]]] = []
    put_many = tables["index"].put_many
    tables["index"].put_many = lambda partition, items: (  # type: ignore[method-assign]
        written.append((partition, [key for key, _, _ in items])), put_many(partition, items))
    asyncio.run(b.commit())
    # Partition 0's two records are acknowledged first (offsets 101, 102), then partition 1's (103, 104).
    assert tables["index"].offsets == {0: 102, 1: 104}
    assert written == [(0, ["r1/e1", "r1/e2"]), (1, ["r2/e1", "r2/e2"])]
    assert tables["index"].data == {"r1/e1": 1, "r1/e2": 2, "r2/e1": 1}


def test_a_keyed_record_goes_to_the_partition_the_producers_default_partitioner_picks():
    from aiokafka.partitioner import DefaultPartitioner

    outbox = batch_module.Outbox(SimpleNamespace(), {"t": [0, 1, 2, 3], "u": [0, 1, 2, 3, 4, 5, 6]})
    for i in range(2000):
        key = f"run-{i}-\u00e9".encode()
        for topic, parts in (("t", [0, 1, 2, 3]), ("u", [0, 1, 2, 3, 4, 5, 6])):
            expected = DefaultPartitioner()(key, parts, parts)
            assert outbox.chosen(topic, key) == expected
            assert asyncio.run(outbox.partition_for(topic, key)) == expected
    assert outbox.chosen("t", None) is None and outbox.chosen("unknown", b"k") is None
