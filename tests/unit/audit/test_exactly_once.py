"""The audit sink's store side, on a real store (chdb; a ClickHouse server too when configured).

Two defences of exactly-once storage, without a broker: a re-formed range lands although its dedup tokens
are already taken by a part that no longer exists, and the ledger query finds gaps between ranges.
"""

from __future__ import annotations

from agentlog.audit.exactly_once import BlockingSink, ledger_gaps, token_for
from agentlog.audit.migrations import migrate
from agentlog.audit.rows import rows_for
from agentlog.audit.store import open_store
from agentlog.metrics import METRICS
from tests.unit.audit.conftest import store_url  # noqa: F401  (fixture: chdb, and a server when set)
from tests.unit.audit.data import audit_batches


def test_a_reformed_range_lands_once_although_its_tokens_outlived_their_part(store_url):  # noqa: F811
    """The state a SIGKILL can leave: the range's token is in the dedup log, its rows are not in the table.

    Set up with a part of other rows inserted under the tokens, then deleted (the dedup log keeps
    the tokens). Trusting the token drops the batch silently; the re-form path must not.
    """
    committed = audit_batches()["committed"]
    migrate(store_url)
    with open_store(store_url) as s:
        sink = BlockingSink(s)
        table, names, cols = rows_for("committed", committed)
        run_col = names.index("run_id")
        ghost = [["ghost"] * len(col) if i == run_col else col for i, col in enumerate(cols)]
        token = token_for("p.log", 1, 0, len(committed) - 1)
        for taken in (token, f"{token}/reform-1"):
            s.insert(table, ghost, names, column_oriented=True, dedup_token=taken)
        s.command("ALTER TABLE events DELETE WHERE run_id = 'ghost'", settings={"mutations_sync": 2})

        def count() -> int:
            return int(s.query("SELECT count() FROM events").rows[0][0])

        assert count() == 0
        sink.insert_rows(table, names, cols, token)  # trusting the token: ClickHouse drops it, no error
        assert count() == 0, "the trap is not set: the dedup log forgot the token"

        dropped = METRICS.get("agentlog_sink_dropped_tokens_total", table="events")
        assert sink.insert_rows(table, names, cols, token, reform=True) == len(committed)
        assert count() == len(committed)
        assert METRICS.get("agentlog_sink_dropped_tokens_total", table="events") == dropped + 1  # reform-1 was taken
        # re-formed again (another crash): everything is there, nothing is added
        assert sink.insert_rows(table, names, cols, token, reform=True) == 0
        assert count() == len(committed)
        assert s.query("SELECT count() FROM (SELECT run_id, sequence FROM events GROUP BY run_id, sequence "
                       "HAVING count() > 1)").rows[0][0] == 0


def test_ledger_gaps_are_found_and_overlaps_are_not_gaps(store_url):  # noqa: F811
    migrate(store_url)
    with open_store(store_url) as s:
        sink = BlockingSink(s)
        assert ledger_gaps(s) == []
        for topic, partition, lo, hi in [("p.log", 0, 0, 9), ("p.log", 0, 10, 19), ("p.log", 0, 25, 30),
                                         ("p.log", 1, 0, 9), ("p.log", 1, 5, 12), ("p.log", 1, 13, 13),
                                         ("p.log", 1, 13, 13), ("p.snapshots", 0, 7, 8)]:
            sink.mark(topic, partition, lo, hi)
        assert ledger_gaps(s) == [("p.log", 0, 20, 24)]
        assert sink.last_range("p.log", 0) == (25, 30)
        assert sink.last_range("p.log", 1) == (13, 13)
        assert sink.last_range("p.log", 2) is None


def test_records_stored_at_another_offset_are_dropped_by_key_wherever_each_run_stands(store_url):  # noqa: F811
    """The natural-key filter bounds its lookup by each run's own range in the batch (for throughput).

    Two runs far apart in sequence: a record the log holds twice (stored by an earlier batch) and
    a repeat inside the batch are dropped; the stored history outside each run's range neither
    hides a new key nor comes back from the lookup.
    """
    migrate(store_url)
    with open_store(store_url) as s:
        sink = BlockingSink(s)

        def events(pairs: list[tuple[str, int]]) -> tuple[str, tuple[str, ...], list[list[object]]]:
            return rows_for("committed", [
                {"doc": {"eventId": f"{r}-{q}", "runId": r, "type": "variable.changed", "sequence": q,
                         "timestamp": "2026-01-01T00:00:00.000Z", "payload": {"q": q}},
                 "prevHash": "0" * 64, "hash": f"{q:064x}", "stateHash": "ab" * 32,
                 "source": {"topic": "p.ingest", "partition": 0, "offset": q, "timestampMs": 0}}
                for r, q in pairs])

        stored = [("a", q) for q in range(0, 10)] + [("b", q) for q in range(1000, 1010)]
        assert sink.insert_rows(*events(stored), token_for("p.log", 0, 0, 19)) == 20
        # a:9 and b:1005 again (at-least-once), b:1010 twice in the batch; a:10, b:1010, b:1011 are new
        batch = [("a", 9), ("a", 10), ("b", 1005), ("b", 1010), ("b", 1010), ("b", 1011)]
        table, names, cols = events(batch)
        assert sink._new_rows(table, names, cols) == [1, 3, 5]
        assert sink.insert_rows(table, names, cols, token_for("p.log", 0, 20, 25)) == 3
        assert s.query("SELECT count(), uniqExact(run_id, sequence) FROM events").rows[0] == (23, 23)
