"""A fresh store migrates without a word and without empty copies; a store with rows keeps its old tables."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlog.audit.migrations import migrate
from agentlog.audit.rows import rows_for
from agentlog.audit.store import open_store
from tests.unit.audit.data import audit_batches

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[3]
#: The tables 0001 creates with an engine that 0002 changes.
MOVED = ("events", "transitions", "violations", "rejections", "snapshots", "state_digests", "replay_verdicts")


def _only_0001(tmp_path: Path) -> Path:
    mig = tmp_path / "mig0001"
    mig.mkdir()
    for name in ("schema_migrations.sql", "0001_audit_tables.sql"):
        (mig / name).write_text((REPO / "infra/clickhouse/migrations" / name).read_text())
    return mig


def test_a_fresh_store_migrates_silently_and_keeps_no_old_tables(tmp_path: Path) -> None:
    # A process of its own, as `agentlog infra up` and the sink run it: what a user would see on the terminal.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOG_")}
    code = ("import sys; from agentlog.audit.migrations import migrate; "
            "print(len(migrate(sys.argv[1])), 'applied')")
    done = subprocess.run([sys.executable, "-c", code, f"chdb://{tmp_path / 'ch'}"], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "6 applied\n"
    assert "moved" not in done.stderr and "kept" not in done.stderr, done.stderr
    with open_store(f"chdb://{tmp_path / 'ch'}") as s:
        tables = [r[0] for r in s.query("SHOW TABLES").rows]
        engines = dict(s.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase()").rows)
    assert "events" in tables and not [t for t in tables if t.endswith(("_0001", "_new"))], tables
    assert {engines[t] for t in MOVED if t != "state_digests"} == {"MergeTree"}


def test_an_old_store_moves_the_tables_with_rows_and_drops_the_empty_ones(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open_store(f"chdb://{tmp_path / 'ch'}") as s:
        assert migrate(s, directory=_only_0001(tmp_path)) == ["0001_audit_tables"]
        table, names, cols = rows_for("committed", audit_batches()["committed"])
        keep = [i for i, n in enumerate(names) if n != "state_hash"]  # 0001 has no state_hash
        s.insert(table, [cols[i] for i in keep], [names[i] for i in keep], column_oriented=True)

        with caplog.at_level(logging.DEBUG, logger="agentlog.audit"):
            migrate(s)
        tables = {r[0] for r in s.query("SHOW TABLES").rows}
        assert {t for t in tables if t.endswith("_0001")} == {"events_0001"}
        assert s.query("SELECT count() FROM events_0001").rows[0][0] == len(audit_batches()["committed"])
    moved = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in moved] == [
        f"audit table events moved to the new engine ({len(audit_batches()['committed'])} rows); "
        "the old one is kept as events_0001"]
