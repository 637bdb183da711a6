"""The worker's tables on local RocksDB (:class:`agentlog.worker.txstate.StateTable`), without a broker.

What a restart relies on: a value written by partition is read back by partition (not by
"the current event's"), a deleted key is gone, a prefix lists a run's keys, and the changelog
offset a partition's copy reflects is what its restore reads on from. The databases are reopened
from disk by a second table, as a restarted worker's would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentlog.worker.tables import MemoryTable, RocksBudget, encode
from agentlog.worker.txlog import LogRecord
from agentlog.worker.txstate import StateTable, plain_opener


def _table(tmp_path: Path, name: str = "seq-index", opened: dict[Path, Any] | None = None) -> StateTable:
    """A table under ``tmp_path``; ``opened``: where each database it opens is noted (to write behind its back)."""

    def opener(path: Path) -> Any:
        db = plain_opener(path)
        if opened is not None:
            opened[path] = db
        return db

    return StateTable(name, f"unit-worker-{name}-changelog", tmp_path, opener=opener)


def test_keys_live_in_their_partition_survive_a_reopen_and_deletes_are_gone(tmp_path):
    table = _table(tmp_path)
    table.put(1, "run-a\x1fe1", [0, "h0", 1, 10])
    table.put(1, "run-a\x1fe2", [1, "h1", 1, 11])
    table.put(1, "run-ab\x1fe1", [0, "x", 1, 12])  # shares "run-a" as a prefix, not "run-a\x1f"
    table.put(2, "run-b\x1fe1", [0, "y", 2, 3])
    assert table.get(1, "run-a\x1fe2") == [1, "h1", 1, 11]
    assert table.get(2, "run-a\x1fe2") is None  # another partition's database
    assert list(table.keys_from(1, "run-a\x1f")) == ["run-a\x1fe1", "run-a\x1fe2"]
    table.put(1, "run-a\x1fe1", None)
    table.persisted(1, 41)
    table.close_all()  # what a stopping worker's runtime does: its databases are closed

    again = _table(tmp_path)  # a restarted worker, same disk
    assert again.get(1, "run-a\x1fe1") is None
    assert again.get(1, "run-a\x1fe2") == [1, "h1", 1, 11]
    assert list(again.keys_from(1, "run-a\x1f")) == ["run-a\x1fe2"]
    # The restore reads the changelog from just after this offset.
    assert (again.restored_to(1), again.tail_start(1)) == (41, 42)
    assert (again.restored_to(2), again.tail_start(2)) == (None, 0)


def test_a_restore_applies_the_changelogs_bytes_and_notes_the_last_offset(tmp_path):
    table = _table(tmp_path)
    table.put(0, "run-a\x1fe1", [0, "h0", 1, 10])
    tail = [LogRecord(5, 0, encode("run-a\x1fe2"), encode([1, "h1", 1, 11])),
            LogRecord(6, 0, encode("run-a\x1fe1"), None)]  # a tombstone
    assert table.restore(0, tail) == 2
    assert table.get(0, "run-a\x1fe1") is None
    assert table.get(0, "run-a\x1fe2") == [1, "h1", 1, 11]
    assert list(table.keys_from(0, "")) == ["run-a\x1fe2"]
    assert table.tail_start(0) == 7


def test_the_memory_table_is_the_same_port():
    table = MemoryTable("t")
    table.put(0, "a\x1f1", 1)
    table.put(0, "a\x1f2", 2)
    table.put(0, "a\x1f1", None)
    assert table.get(0, "a\x1f2") == 2 and table.get(0, "a\x1f1") is None
    assert list(table.keys_from(0, "a\x1f")) == ["a\x1f2"]


def test_values_are_cached_decoded_and_forgotten_when_a_restore_wrote_behind_the_cache(tmp_path):
    opened: dict[Path, Any] = {}
    table = _table(tmp_path, "run-state", opened)
    table.put(0, "run", {"next": 1})
    assert table.get(0, "run") == {"next": 1}
    [db] = opened.values()
    db.put(encode("run"), encode({"next": 7}))  # the database written behind the table's back
    assert table.get(0, "run") == {"next": 1}  # what this process last wrote, until told otherwise
    table.forget_cached()
    assert table.get(0, "run") == {"next": 7}
    table.restore(0, [LogRecord(0, 0, encode("run"), encode({"next": 9}))])  # a restore tells the cache itself
    assert table.get(0, "run") == {"next": 9}
    table.put(0, "run", None)
    assert table.get(0, "run") is None


def test_the_budget_reports_what_its_shared_cache_holds(tmp_path):
    budget = RocksBudget(8)
    [(name, labels, empty)] = list(budget.series())
    assert (name, labels) == ("agentlog_state_cache_bytes", {})
    db = budget.open(tmp_path / "db", None)
    for i in range(20_000):  # memtable memory is charged to the shared cache as it grows
        db.put(f"key-{i}".encode(), b"v" * 100)
    [(_, _, used)] = list(budget.series())
    assert used > empty and used > 1_000_000
    db.close()
