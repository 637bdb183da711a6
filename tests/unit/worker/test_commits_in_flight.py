"""Commits in flight (#13 session 8): handled batches are made durable in the background, in groups, in order.

:class:`processors.worker.batch._Commits` is driven with a committer whose durability step the
test controls (``Gated``); :meth:`Batch.commit_group` with batches whose producer is a recording
stand-in. The real worker's batches (real Kafka, SIGKILLs) are covered by ``tests/integration/worker``
and ``tests/faults/test_worker_crashes.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from processors.worker.batch import Batch, _Commits
from processors.worker.fence import Fence
from processors.worker.tables import MemoryTable


def _batch(name: str, writes: dict[tuple[str, str], Any] | None = None, waiting: Any = None) -> Any:
    b = object.__new__(Batch)
    b.name = name  # type: ignore[attr-defined]
    b._writes = {k: (0, v) for k, v in (writes or {}).items()}
    b._waiting = waiting
    b.partition = 0
    return b


class Gated(_Commits):
    """A committer whose durability step is logged and, while ``gate`` is clear, held."""

    def __init__(self, limit: int, log: list[str], before: Any = None, after: Any = None,
                 fail_on: str | None = None) -> None:
        super().__init__(limit, "test", before, after)
        self.log = log
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_on = fail_on

    async def _make_durable(self, group: list[Any]) -> None:  # type: ignore[override]
        names = "+".join(b.name for b in group)
        self.log.append(f"start {names}")
        await self.gate.wait()
        if self.fail_on is not None and self.fail_on in names:
            raise RuntimeError("broker said no")
        self.log.append(f"durable {names}")


async def _a_committing_b_waiting(log: list[str], **kwargs: Any) -> Gated:
    """A committer whose first batch (``a``) is being made durable, held, while ``b`` waits for the next group."""
    commits = Gated(8, log, **kwargs)
    commits.gate.clear()
    await commits.commit(_batch("a"))
    await asyncio.sleep(0.01)  # a's commit has started, and is held
    await commits.commit(_batch("b"))
    return commits


def test_the_agent_goes_on_while_a_batch_commits_and_batches_handled_meanwhile_commit_as_one_group():
    async def scenario() -> list[str]:
        log: list[str] = []
        commits = Gated(8, log)
        commits.gate.clear()
        await commits.commit(_batch("a"))
        log.append("a handed over")  # the agent was not held by a's commit
        await asyncio.sleep(0.01)  # a's commit has started, and is held
        await commits.commit(_batch("b"))
        await commits.commit(_batch("c"))
        log.append("b, c handed over")
        commits.gate.set()
        await commits.drain()
        return log

    assert asyncio.run(scenario()) == ["a handed over", "start a", "b, c handed over", "durable a",
                                       "start b+c", "durable b+c"]


def test_at_most_limit_batches_wait_then_the_agent_waits_for_the_committer():
    async def scenario() -> None:
        log: list[str] = []
        commits = Gated(2, log)
        commits.gate.clear()
        await commits.commit(_batch("a"))
        await commits.commit(_batch("b"))
        third = asyncio.ensure_future(commits.commit(_batch("c")))
        await asyncio.sleep(0.01)
        assert not third.done()  # three waiting > limit 2: the agent's next batch is held
        commits.gate.set()
        await third
        assert "durable c" in log[-1] or "durable b+c" in log  # it was let go once the committer caught up
        await commits.drain()
        assert not commits.overlay

    asyncio.run(scenario())


def test_limit_zero_commits_each_batch_inline():
    async def scenario() -> list[str]:
        log: list[str] = []
        commits = Gated(0, log)
        await commits.commit(_batch("a"))
        log.append("a handed over")
        return log

    assert asyncio.run(scenario()) == ["start a", "durable a", "a handed over"]


def test_hooks_run_around_each_group_batch_by_batch_in_order():
    async def scenario() -> list[str]:
        log: list[str] = []

        async def before(batch: Any) -> None:
            log.append(f"before {batch.name}")

        async def after(batch: Any) -> None:
            log.append(f"after {batch.name}")

        commits = Gated(8, log, before, after)
        commits.gate.clear()
        await commits.commit(_batch("a"))
        await asyncio.sleep(0.01)
        await commits.commit(_batch("b"))
        await commits.commit(_batch("c"))
        commits.gate.set()
        await commits.drain()
        return log

    assert asyncio.run(scenario()) == ["before a", "start a", "durable a", "after a", "before b", "before c",
                                       "start b+c", "durable b+c", "after b", "after c"]


def test_a_failed_commit_makes_nothing_after_it_durable_and_the_next_batch_raises_it():
    async def scenario() -> list[str]:
        log: list[str] = []
        commits = await _a_committing_b_waiting(log, fail_on="a")
        commits.gate.set()
        await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError, match="broker said no"):
            commits.raise_if_failed()  # what the agent's next batch does first
        with pytest.raises(RuntimeError, match="broker said no"):
            await commits.commit(_batch("c"))
        with pytest.raises(RuntimeError):
            await commits.drain()
        commits.restart()  # Faust's supervisor restarts the agent: it starts clean
        commits.raise_if_failed()
        assert not commits.overlay
        return log

    assert asyncio.run(scenario()) == ["start a"]


def test_abandon_cuts_the_commit_short_and_nothing_waiting_is_made_durable():
    async def scenario() -> list[str]:
        log: list[str] = []
        commits = await _a_committing_b_waiting(log)
        await commits.abandon()
        commits.gate.set()
        await asyncio.sleep(0.01)
        assert not commits.overlay
        return log

    assert asyncio.run(scenario()) == ["start a"]


def test_later_batches_read_the_writes_still_waiting_last_write_first_until_they_are_durable():
    async def scenario() -> None:
        table = MemoryTable("runs")
        table.data.update({"k": "durable", "only-durable": 1})
        log: list[str] = []
        commits = Gated(8, log)
        commits.gate.clear()
        commits_overlay = commits.overlay

        def reader(writes: dict[tuple[str, str], Any] | None = None) -> Any:
            b = _batch("r", writes, commits_overlay)
            b.wiring = SimpleNamespace(tables={"runs": table})
            return b

        await commits.commit(_batch("a", {("runs", "k"): "a", ("runs", "x"): "a"}))
        await asyncio.sleep(0.01)
        await commits.commit(_batch("b", {("runs", "k"): "b", ("runs", "gone"): None}))
        current = reader({("runs", "own"): "mine"})
        assert current.get("runs", "k") == "b"
        assert current.get("runs", "x") == "a"
        assert current.get("runs", "own") == "mine"
        assert current.get("runs", "only-durable") == 1
        assert current.get("runs", "gone") is None
        commits.gate.set()
        await asyncio.sleep(0.01)
        # a is durable (its writes are the table's now) but b is not: b's write of k is still read
        table.data.update({"k": "b", "x": "a"})
        await commits.drain()
        assert not commits.overlay
        assert current.get("runs", "k") == "b"

    asyncio.run(scenario())


class RecordingOutbox:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    async def flush(self) -> None:
        self.log.append(f"flush {self.name}")

    async def wait(self) -> None:
        self.log.append(f"acked {self.name}")

    async def add(self, topic: str, partition: int, key: bytes, value: bytes | None, on_acked: Any = None) -> None:
        self.log.append(f"write {topic} {key.decode()}={value.decode() if value is not None else None}")


def test_a_group_is_made_durable_as_one_batch_outputs_then_table_stages_in_order_then_positions():
    log: list[str] = []
    tables = {name: MemoryTable(name) for name in ("index", "heads", "runs")}
    advanced: list[tuple[str, int]] = []
    positions = SimpleNamespace(advance=lambda table, topic, partition, position, generation:
                                advanced.append((topic, position)))
    wiring = SimpleNamespace(tables=tables, positions=positions, fence=Fence())

    def batch(name: str, writes: dict[tuple[str, str], Any], position: int) -> Batch:
        b = _batch(name, writes)
        b.wiring = wiring
        b._outbox = RecordingOutbox(log, name)
        b._positions = {("heads", "ingest", 0): position}
        b._generation = 1
        return b

    a = batch("a", {("runs", "r1"): 1, ("heads", "r1"): 1, ("index", "r1/e1"): 1}, 10)
    b = batch("b", {("runs", "r1"): 2, ("index", "r1/e2"): 2}, 20)
    asyncio.run(Batch.commit_group([a, b]))
    assert log == ["flush a", "flush b", "acked a", "acked b",
                   'write index "r1/e1"=1', 'write index "r1/e2"=2', "flush b", "acked b",
                   'write heads "r1"=1', 'write runs "r1"=2', "flush b", "acked b"]  # r1's run state once, its last value
    assert advanced == [("ingest", 10), ("ingest", 20)]
    assert tables["runs"].data == {"r1": 2}


def test_settle_waits_until_every_waiting_batch_is_durable():
    async def scenario() -> list[str]:
        log: list[str] = []
        commits = await _a_committing_b_waiting(log)
        settle = asyncio.ensure_future(commits.settle())  # what a rebalance's revocation waits for
        await asyncio.sleep(0.01)
        assert not settle.done()
        commits.gate.set()
        await settle
        log.append("settled")
        return log

    assert asyncio.run(scenario()) == ["start a", "durable a", "start b", "durable b", "settled"]


def test_tables_are_written_in_stages_index_alone_then_heads_with_runs_then_the_rest_one_by_one():
    from processors.worker.batch import _stages

    written = dict.fromkeys(["runs", "spans", "index", "heads", "other", "links", "closed"])
    assert _stages(written) == [["closed"], ["index"], ["heads", "runs"], ["links"], ["spans"], ["other"]]
    assert _stages(dict.fromkeys(["runs"])) == [["runs"]]
    assert _stages({}) == []
