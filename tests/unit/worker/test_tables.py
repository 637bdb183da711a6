"""The worker's tables on local RocksDB, through Faust's store, without a broker.

What a restart relies on: a value written by partition is read back by partition (not by
"the current event's"), a deleted key is gone, a prefix lists a run's keys, and the changelog
offset a partition holds is what Faust's recovery starts after. The store is reopened from disk
by a second app, as a restarted worker would.
"""

from __future__ import annotations

import asyncio

import faust
from faust.stores.rocksdb import Store
from faust.types import TP

from agentlog.streams import internals
from agentlog.worker.tables import LocalTable, MemoryTable, RocksBudget, encode, open_table


def _table(tmp_path, name: str = "seq-index") -> LocalTable:
    app = faust.App("tables-check", broker="kafka://127.0.0.1:1", store="rocksdb://", autodiscover=False,
                    datadir=str(tmp_path), key_serializer="json", value_serializer="json")
    return open_table(app, name, 4, RocksBudget(8))


def test_the_rocksdb_store_internals_we_use_exist():
    for name in internals.FAUST_ROCKSDB_STORE_INTERNALS:
        assert hasattr(Store, name) or name in Store.__annotations__, f"faust's RocksDB Store has no {name}"


def test_keys_live_in_their_partition_survive_a_reopen_and_deletes_are_gone(tmp_path):
    table = _table(tmp_path)
    table.put(1, "run-a\x1fe1", [0, "h0", 1, 10])
    table.put(1, "run-a\x1fe2", [1, "h1", 1, 11])
    table.put(1, "run-ab\x1fe1", [0, "x", 1, 12])  # shares "run-a" as a prefix, not "run-a\x1f"
    table.put(2, "run-b\x1fe1", [0, "y", 2, 3])
    table.put(1, "\x00position\x1fingest\x1f1", 13)
    assert table.get(1, "run-a\x1fe2") == [1, "h1", 1, 11]
    assert table.get(2, "run-a\x1fe2") is None  # another partition's database
    assert list(table.keys_from(1, "run-a\x1f")) == ["run-a\x1fe1", "run-a\x1fe2"]
    table.put(1, "run-a\x1fe1", None)
    table.persisted(1, 41)
    asyncio.run(table._table.data.stop())  # what a stopping worker's store does: its databases are closed

    again = _table(tmp_path)  # a restarted worker, same disk
    assert again.get(1, "run-a\x1fe1") is None
    assert again.get(1, "run-a\x1fe2") == [1, "h1", 1, 11]
    assert again.get(1, "\x00position\x1fingest\x1f1") == 13
    assert list(again.keys_from(1, "run-a\x1f")) == ["run-a\x1fe2"]
    # Faust's recovery reads the changelog from just after this offset.
    store = again._table.data
    assert store.persisted_offset(TP(again.changelog, 1)) == 41
    assert store.persisted_offset(TP(again.changelog, 2)) is None
    # What the local database holds is what the changelog carries: Faust's recovery writes those bytes.
    assert internals.table_db(again._table, 1).get(encode("run-a\x1fe2")) == encode([1, "h1", 1, 11])


def test_the_memory_table_is_the_same_port():
    table = MemoryTable("t")
    table.put(0, "a\x1f1", 1)
    table.put(0, "a\x1f2", 2)
    table.put(0, "a\x1f1", None)
    assert table.get(0, "a\x1f2") == 2 and table.get(0, "a\x1f1") is None
    assert list(table.keys_from(0, "a\x1f")) == ["a\x1f2"]


def test_values_are_cached_decoded_and_forgotten_when_recovery_wrote_behind_the_cache(tmp_path):
    table = _table(tmp_path, "run-state")
    table.put(0, "run", {"next": 1})
    assert table.get(0, "run") == {"next": 1}
    # Faust's recovery writes the database itself (the changelog's bytes), not through the table.
    internals.table_db(table._table, 0).put(encode("run"), encode({"next": 7}))
    assert table.get(0, "run") == {"next": 1}  # what this process last wrote, until told otherwise
    table.forget_cached()
    assert table.get(0, "run") == {"next": 7}
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
