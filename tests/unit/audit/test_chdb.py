"""ClickHouse through chdb and clickhouse-connect: the embedded engine the audit store runs on.

Each step runs in its own Python process: chdb allows one directory per process, and reopening
the directory in a fresh process is exactly what a restarted worker does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WRITE = """
import sys, clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
client.command("CREATE TABLE IF NOT EXISTS events (run_id String, seq UInt64, kind LowCardinality(String)) "
               "ENGINE = MergeTree ORDER BY (run_id, seq)")
client.insert("events", [["r1", 0, "run.started"], ["r1", 1, "variable.changed"], ["r2", 0, "run.started"]],
              column_names=["run_id", "seq", "kind"])
client.close()
"""

READ = """
import json, sys, clickhouse_connect
client = clickhouse_connect.get_client(dsn="chdb://" + sys.argv[1])
rows = client.query("SELECT run_id, count(), max(seq) FROM events WHERE kind = {k:String} OR seq > 0 "
                    "GROUP BY run_id ORDER BY run_id", parameters={"k": "run.started"}).result_rows
engine = client.query("SELECT engine FROM system.tables WHERE name = 'events'").result_rows
print(json.dumps({"rows": [list(r) for r in rows], "engine": engine[0][0]}))
client.close()
"""


def _run(code: str, directory: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_mergetree_round_trip_survives_a_new_process(tmp_path: Path) -> None:
    directory = tmp_path / "ch"
    _run(WRITE, directory)
    out = json.loads(_run(READ, directory).strip().splitlines()[-1])
    assert out == {"engine": "MergeTree", "rows": [["r1", 2, 1], ["r2", 1, 0]]}
