"""Which runs the worker asks to close, and how often (no broker: the tracker alone)."""

from __future__ import annotations

import asyncio

from agentlog.core.lifetimes import close_request
from agentlog.streams.settings import Settings
from agentlog.worker.lifetimes import Lifetimes
from agentlog.worker.memory import MemoryWorker, memory_wiring
from agentlog.worker.owned import Owned
from agentlog.worker.tables import MemoryTable, encode


def _lifetimes() -> Lifetimes:
    return Lifetimes(memory_wiring(Settings(run_grace_s=10.0, run_idle_s=100.0)), Owned())


def test_a_run_is_asked_for_once_when_due_and_again_only_if_its_request_was_not_taken():
    lt = _lifetimes()
    lt.track(0, "done", {"next": 5, "hash": "h", "ts": 1_000_000, "end": True}, now_s=0)
    lt.track(1, "open", {"next": 2, "hash": "h", "ts": 1_000_000, "end": False}, now_s=0)
    assert lt.due_now({0, 1}, now_s=1005.0) == []
    assert lt.due_now({0, 1}, now_s=1010.0) == [("done", 0, 5, "completed")]
    assert lt.due_now({1}, now_s=1010.0) == []  # only the partitions asked about
    lt.asked("done")
    assert lt.due_now({0, 1}, now_s=5000.0) == [("open", 1, 2, "expired")]  # asked once, however long it waits
    lt.unask("done")  # the run moved on or the send failed
    assert ("done", 0, 5, "completed") in lt.due_now({0, 1}, now_s=5000.0)
    lt.asked("done")
    lt.track(0, "done", {"next": 6, "hash": "h2", "ts": 2_000_000, "end": True})  # a straggler: timed anew
    assert lt.due_now({0}, now_s=2005.0) == []
    assert lt.due_now({0}, now_s=2010.0) == [("done", 0, 6, "completed")]
    lt.forget("done")
    assert lt.due_now({0}, now_s=9999.0) == [] and len(lt) == 1


def _record(next_seq: int, *, end: bool) -> dict:
    return {"state": {}, "next": next_seq, "head": "h", "since": 0, "ts": 1_000_000, "end": end}


def test_the_runs_in_flight_are_read_back_from_the_runs_table_other_values_aside():
    runs = MemoryTable("run-state")
    runs.put(2, "r1", _record(3, end=True))
    runs.put(2, "r2", _record(1, end=False))
    runs.put(2, "\x00other\x1fingest\x1f2", 17)  # not a run's record
    lt = _lifetimes()
    assert asyncio.run(lt.rescan(2, runs, now_s=0)) == 2
    assert sorted(lt.due_now({2}, now_s=1_000_000)) == [("r1", 2, 3, "completed"), ("r2", 2, 1, "expired")]


def test_a_sweep_asks_for_the_runs_its_partitions_restored_on_their_own_ingest_partition_once(tmp_path):
    worker = MemoryWorker(memory_wiring(Settings(home=tmp_path, run_grace_s=10.0, run_idle_s=100.0), partitions=4))
    lifetimes = worker.sequencer().lifetimes
    changelog = worker.wiring.tables["runs"].changelog
    # What the partitions' earlier owners committed: a run due to close in each of partitions 1 and 2.
    worker.log.append(changelog, encode("r1"), encode(_record(3, end=True)), 2)
    worker.log.append(changelog, encode("r2"), encode(_record(4, end=True)), 1)

    async def go() -> None:
        await worker.take("sequencer", [2])  # this worker's sequencer holds ingest partition 2 only
        await lifetimes.sweep()
        await lifetimes.sweep()  # asked once

    asyncio.run(go())
    assert worker.values("ingest") == [close_request("r1", 3, "completed")]
    assert worker.values("ingest", 2) == worker.values("ingest")  # in the run's own partition
