"""Query safety, compactly, so the fault report covers it (tests/unit/audit has the full matrix).

Injection through named-query parameters finds nothing and changes nothing; every write,
DDL, multi-statement or settings escape through ``run_sql`` is refused with ``read_only``;
the store is intact afterwards.
"""

from __future__ import annotations

import pytest

from agentlog.audit.migrations import migrate
from agentlog.audit.queries import run_named, run_sql
from agentlog.audit.store import open_store
from agentlog.schemas.errors import StoreError
from tests.unit.audit.data import audit_batches

pytestmark = [pytest.mark.faults]

INJECTIONS = ["' OR 1=1 --", "x'); DROP TABLE events; --", "run-1' OR '1'='1", "run-1\\' OR 1=1 --",
              "{run_id:String}", "run-1\x00' OR 1=1"]
WRITES = ["INSERT INTO events (run_id) VALUES ('x')", "DROP TABLE events", "ALTER TABLE events DELETE WHERE 1",
          "TRUNCATE TABLE events", "CREATE TABLE evil (a UInt8) ENGINE = Memory", "SELECT 1; DROP TABLE events",
          "/* SELECT */ DROP TABLE events", "  -- c\n drop table events", "KILL QUERY WHERE 1",
          "SET readonly = 0", "SELECT * FROM file('/etc/hostname', 'LineAsString')",
          "SELECT count() FROM events SETTINGS readonly = 0"]


def test_injection_and_writes_are_refused(tmp_path, ledger):
    with open_store(f"chdb://{tmp_path / 'ch'}") as store:
        migrate(store)
        for kind, records in audit_batches().items():
            store.insert_records(kind, records)
        before = run_sql(store, "SELECT count() FROM events").rows[0][0]
        assert before > 0
        leaked = []
        for payload in INJECTIONS:
            for name, params in (("run-timeline", {"run_id": payload}), ("usage", {"run_id": payload}),
                                 ("causation-chain", {"run_id": "run-1", "event_id": payload})):
                try:
                    rows = run_named(store, name, params).rows
                except StoreError as e:
                    assert e.code == "bad_param", (payload, e)  # refused before reaching the engine
                    continue
                if rows:
                    leaked.append((name, payload, rows[:1]))
        assert leaked == []
        with pytest.raises(StoreError) as e:
            run_named(store, "run-timeline", {"run_id": "run-1", "limit": "1; DROP TABLE events"})
        assert e.value.code == "bad_param"
        refused = []
        for stmt in WRITES:
            with pytest.raises(StoreError) as e:
                run_sql(store, stmt)
            assert e.value.code == "read_only", (stmt, e.value)
            refused.append(stmt)
        assert run_sql(store, "SELECT count() FROM events").rows[0][0] == before
        assert "evil" not in {r[0] for r in run_sql(store, "SHOW TABLES").rows}
    ledger.record("query_safety", injections_tried=len(INJECTIONS) * 3, injections_leaked=len(leaked),
                  writes_tried=len(WRITES), writes_refused=len(refused))
