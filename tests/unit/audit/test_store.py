"""Store lifecycle: migrations, one owner per chdb directory, the worker query endpoint, the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentlog.audit.migrations import migrate
from agentlog.audit.rows import COLUMNS, committed_rows, rows_for
from agentlog.audit.server import handle_query_request, query_via_worker
from agentlog.audit.store import Store, open_store, owner_file, read_owner
from agentlog.schemas.errors import StoreError
from tests.unit.audit.data import audit_batches

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-c", "from agentlog.cli import main; main()"]

HOLDER = """
import sys, time
from agentlog.audit.store import open_store
from agentlog.audit.migrations import migrate
s = open_store(sys.argv[1]); migrate(s)
print("ready", flush=True)
sys.stdin.readline()
s.close()
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLOG_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def test_migrate_is_idempotent_and_recorded(store_url):
    first = migrate(store_url)
    assert first[:2] == ["0001_audit_tables", "0002_immutable_tables"]
    assert migrate(store_url) == []
    with open_store(store_url) as s:
        ledger = s.query("SELECT version, name FROM schema_migrations ORDER BY version").rows
        tables = {r[0] for r in s.query("SHOW TABLES").rows}
    from agentlog.audit.migrations import MIGRATIONS_DIR

    assert ledger == [(int(p.name[:4]), p.stem) for p in sorted(MIGRATIONS_DIR.glob("[0-9]*.sql"))]
    assert set(COLUMNS) <= tables


def test_migrate_applies_across_a_gap_and_fills_it_later(tmp_path):
    """Migrations land from parallel branches (0003 before 0002 is merged): each missing version is applied."""
    mig = tmp_path / "mig"
    mig.mkdir()
    (mig / "schema_migrations.sql").write_text(
        (REPO / "infra/clickhouse/migrations/schema_migrations.sql").read_text())
    (mig / "0001_a.sql").write_text("CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = MergeTree ORDER BY x;")
    (mig / "0003_c.sql").write_text("CREATE TABLE IF NOT EXISTS c (x UInt8) ENGINE = MergeTree ORDER BY x;")
    url = f"chdb://{tmp_path / 'ch'}"
    assert migrate(url, directory=mig) == ["0001_a", "0003_c"]
    (mig / "0002_b.sql").write_text("CREATE TABLE IF NOT EXISTS b (x UInt8) ENGINE = MergeTree ORDER BY x;")
    assert migrate(url, directory=mig) == ["0002_b"]
    with open_store(url) as s:
        assert {r[0] for r in s.query("SHOW TABLES").rows} >= {"a", "b", "c"}


def test_migrate_refuses_an_edited_migration(tmp_path):
    mig = tmp_path / "mig"
    mig.mkdir()
    (mig / "schema_migrations.sql").write_text(
        (REPO / "infra/clickhouse/migrations/schema_migrations.sql").read_text())
    (mig / "0001_t.sql").write_text("CREATE TABLE IF NOT EXISTS t (a UInt8) ENGINE = MergeTree ORDER BY a;")
    url = f"chdb://{tmp_path / 'ch'}"
    assert migrate(url, directory=mig) == ["0001_t"]
    (mig / "0001_t.sql").write_text("CREATE TABLE IF NOT EXISTS t (a UInt16) ENGINE = MergeTree ORDER BY a;")
    with pytest.raises(StoreError) as e:
        migrate(url, directory=mig)
    assert e.value.code == "migration_drift"


def test_columns_match_the_ddl(store):
    for table, names in COLUMNS.items():
        ddl = [r[0] for r in store.query(f"DESCRIBE TABLE {table}").rows]
        assert set(names) <= set(ddl), table


def test_rows_are_deterministic_and_strip_transport_keys():
    recs = audit_batches()["committed"]
    assert committed_rows(recs) == committed_rows([dict(r) for r in recs])
    verdict = audit_batches()["verdict"][0]
    _, names, a = rows_for("verdict", [verdict])
    _, _, b = rows_for("verdict", [{**verdict, "_position": {"partition": 3, "offset": 9}}])
    assert a == b  # the sink's Kafka position never changes a row or its dedup key
    with pytest.raises(StoreError) as e:
        rows_for("nonsense", [])
    assert e.value.code == "unknown_record_kind"
    with pytest.raises(StoreError) as e:
        rows_for("committed", [{"doc": {}, "stateHash": "0" * 64}])
    assert e.value.code == "bad_record"
    format_1 = {k: v for k, v in recs[0].items() if k != "stateHash"}  # a record an agentlog before 0.2 wrote
    with pytest.raises(StoreError) as e:
        rows_for("committed", [*recs[1:], format_1])
    assert e.value.code == "log_format_unsupported"
    assert str(e.value).endswith("re-ingest its runs with `agentlog publish` from an export made with that version")


def test_one_process_shares_one_client_per_directory(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    a, b = open_store(url), open_store(url + "/")  # two spellings of one directory
    try:
        assert a.client is b.client
        other = f"chdb://{tmp_path / 'other'}"
        with pytest.raises(StoreError) as e:
            open_store(other)
        assert e.value.code == "store_busy"
        a.close()
        assert b.query("SELECT 1").rows == [(1,)]  # still open: b holds a reference
    finally:
        a.close()
        b.close()
    _assert_released(tmp_path)


def _assert_released(tmp_path):
    """The directory's owner file is gone and another directory may be opened in this process."""
    assert not owner_file(tmp_path / "ch").exists()
    with open_store(f"chdb://{tmp_path / 'other'}") as c:
        assert c.query("SELECT 2").rows == [(2,)]


def test_a_fork_runs_statements_beside_its_parent_and_holds_the_directory_like_a_handle(tmp_path):
    """Store.fork: its own chdb connection on the same engine (the sink's lanes), counted as a handle."""
    url = f"chdb://{tmp_path / 'ch'}"
    a = open_store(url)
    fork = a.fork()
    try:
        assert fork.client is not a.client and fork.engine is a.engine
        a.command("CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x")
        fork.insert("t", [[1], [2]], ["x"])
        assert a.query("SELECT sum(x) FROM t").rows == [(3,)]
        # two statements at once, one per connection (each blocks its own client only)
        done: list[int] = []
        heavy = "SELECT count() FROM numbers(2000000) WHERE SHA256(toString(number)) = 'x'"
        threads = [threading.Thread(target=lambda s=s: done.append(s.query(heavy).rows[0][0])) for s in (a, fork)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert done == [0, 0]
        a.close()
        assert fork.query("SELECT count() FROM t").rows == [(2,)]  # the fork keeps the engine open
        assert owner_file(tmp_path / "ch").exists()
    finally:
        a.close()
        fork.close()
    _assert_released(tmp_path)


def test_second_process_gets_store_locked_naming_the_owner(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=_env(), cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert read_owner(url)["pid"] == holder.pid
        with pytest.raises(StoreError) as e:
            open_store(url)
        assert e.value.code == "store_locked"
        msg = str(e.value)
        assert f"pid {holder.pid}" in msg and "\n" not in msg and "endpoint" in msg
        # the CLI says the same in one line, exit 2
        cli = subprocess.run([*CLI, "sql", "SELECT 1"], capture_output=True,
                             text=True, env=_env(AGENTLOG_CLICKHOUSE_URL=url), cwd=REPO)
        assert cli.returncode == 2, cli.stderr
        assert cli.stderr.startswith("error[store_locked]:") and str(holder.pid) in cli.stderr
    finally:
        holder.communicate("\n", timeout=60)
    assert read_owner(url) is None  # the owner file goes when the owner closes
    with open_store(url) as s:  # and the directory is free again
        assert s.query("SELECT count() FROM schema_migrations").rows[0][0] >= 1


def test_stale_owner_file_is_taken_over(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owner_file(tmp_path / "ch").write_text(json.dumps({"pid": int(dead.stdout), "cmd": "crashed worker"}))
    with open_store(url) as s:
        assert read_owner(url)["pid"] == os.getpid()
        assert s.query("SELECT 1").rows == [(1,)]


class _Handler(BaseHTTPRequestHandler):
    store = None

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status, payload = handle_query_request(self.store, body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def serving_store(loaded_store):
    """The loaded store behind an HTTP endpoint, advertised in its owner file like the worker does."""
    handler = type("H", (_Handler,), {"store": loaded_store})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    loaded_store.set_query_url(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield loaded_store
    finally:
        server.shutdown()
        server.server_close()


def test_handle_query_request_shapes(loaded_store):
    status, out = handle_query_request(loaded_store, {"query": "usage", "params": {"run_id": "run-1"}})
    assert status == 200 and out["columns"][0] == "run_id" and out["rows"][0][:3] == ["run-1", "anthropic", "claude-x"]
    status, out = handle_query_request(loaded_store, {"query": "run-timeline", "params": {"run_id": "run-1"}})
    assert status == 200 and out["rows"][0][1] == "2025-01-15T10:00:00"
    json.dumps(out)  # everything JSON-serialisable
    assert handle_query_request(loaded_store, {"sql": "DROP TABLE events"})[1]["error"]["code"] == "read_only"
    assert handle_query_request(loaded_store, {"query": "nope"})[0] == 400
    assert handle_query_request(loaded_store, {"nothing": 1})[1]["error"]["code"] == "bad_request"
    assert handle_query_request(loaded_store, {"query": "usage", "params": ["x"]})[1]["error"]["code"] == "bad_request"


def test_query_via_worker_and_cli_through_the_owner(serving_store):
    url = serving_store.url
    out = query_via_worker(url, {"query": "rejections", "params": {"run_id": "run-1"}})
    assert out["rows"] == [["sequence_gap", 2, 1, "2025-01-15T10:00:00.100000", "2025-01-15T10:00:00.101000"]]
    with pytest.raises(StoreError) as e:
        query_via_worker(url, {"sql": "ALTER TABLE events DELETE WHERE 1"})
    assert e.value.code == "read_only"
    # another process cannot open the directory, so the CLI goes through the endpoint
    env = _env(AGENTLOG_CLICKHOUSE_URL=url)
    cli = subprocess.run([*CLI, "query", "usage", "--param", "run_id=run-llm",
                          "--json"], capture_output=True, text=True, env=env, cwd=REPO)
    assert cli.returncode == 0, cli.stderr
    got = json.loads(cli.stdout)
    assert sorted(r[2] for r in got["rows"]) == ["claude-x", "gpt-y", "m-small"]
    bad = subprocess.run([*CLI, "sql", "DROP TABLE events"],
                         capture_output=True, text=True, env=env, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error[read_only]:")
    csv_out = subprocess.run([*CLI, "query", "run-timeline", "-p", "run_id=run-1",
                              "--csv"], capture_output=True, text=True, env=env, cwd=REPO)
    assert csv_out.returncode == 0, csv_out.stderr
    lines = csv_out.stdout.strip().splitlines()
    assert lines[0].startswith("sequence,event_time,type") and len(lines) == 21


def test_query_via_worker_without_owner_is_none(tmp_path):
    assert query_via_worker(f"chdb://{tmp_path / 'nobody'}", {"sql": "SELECT 1"}) is None


def test_cli_opens_the_directory_when_no_worker_owns_it(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    with open_store(url) as s:
        migrate(s)
        for kind, records in audit_batches().items():
            s.insert_records(kind, records)
    cli = subprocess.run([*CLI, "query", "failures", "--json"],
                         capture_output=True, text=True, env=_env(AGENTLOG_CLICKHOUSE_URL=url), cwd=REPO)
    assert cli.returncode == 0, cli.stderr
    assert {r[0] for r in json.loads(cli.stdout)["rows"]} == {"worker-b", "worker-c"}


def test_stored_doc_and_payload_are_exactly_the_jcs_bytes():
    """The doc column is the hash-chain preimage: an auditor re-hashes it, so it must be RFC 8785 to the byte."""
    from agentlog.schemas.canonical import chain_hash, jcs

    odd = {"eventId": 'e"\\\n\x01\x7f€😀', "runId": "r\u2028", "type": "t", "sequence": 2**53 - 1,
           "timestamp": "2025-01-01T00:00:00Z", "nodeId": "ü", "causationId": "a\\b",
           "payload": {"f": 1.0, "g": 1e21, "😀": 1, "\ue000": 2, "s": "\u0007"}}
    recs = audit_batches()["committed"] + [{"doc": odd, "prevHash": "0" * 64, "hash": chain_hash("0" * 64, odd),
                                            "source": {}, "stateHash": "0" * 64}]
    names, cols = committed_rows(recs)
    docs, payloads = cols[names.index("doc")], cols[names.index("payload")]
    assert docs == [jcs(r["doc"]).decode() for r in recs]
    assert payloads == [jcs(r["doc"]["payload"]).decode() for r in recs]
    assert chain_hash("0" * 64, json.loads(docs[-1])) == recs[-1]["hash"]


CLUSTER_DDL = Path(__file__).resolve().parent / "cluster_ddl"


def test_cluster_ddl_is_the_single_node_ddl_rewritten_statement_by_statement(store):
    """Each migration's cluster form equals the cluster DDL that cluster stores applied (tests/unit/audit/cluster_ddl).

    The cluster DDL cannot run without Keeper here, so every derived statement is also checked with
    ClickHouse's own parser.
    """
    import hashlib

    from agentlog.audit.migrations import _CLUSTER_FILE_CHECKSUMS, MIGRATIONS_DIR, _statements, cluster_migration

    expected = sorted(p.name for p in CLUSTER_DDL.glob("*.sql"))
    assert len(expected) == 7 and set(expected) <= {p.name for p in MIGRATIONS_DIR.glob("*.sql")}  # 0001-0006, ledger
    for name in expected:
        derived = _statements(cluster_migration(MIGRATIONS_DIR / name))
        written = _statements((CLUSTER_DDL / name).read_text())
        assert len(derived) == len(written), name
        for got, want in zip(derived, written, strict=True):
            assert got == want, (name, want.splitlines()[0])
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):  # later migrations too: each has a cluster form that parses
        for stmt in _statements(cluster_migration(path)):
            store.query("SELECT formatQuery({q:String})", {"q": stmt})  # raises on a syntax error
    assert {v: (hashlib.sha256((CLUSTER_DDL / f"{p.stem}.sql").read_bytes()).hexdigest(),
                hashlib.sha256(cluster_migration(p).encode()).hexdigest())
            for p in sorted(MIGRATIONS_DIR.glob("000[1-6]_*.sql")) for v in [int(p.name[:4])]} == _CLUSTER_FILE_CHECKSUMS


def test_cluster_statements_refuse_what_they_cannot_rewrite():
    from agentlog.audit.migrations import cluster_statements

    for stmt in ("ALTER TABLE events ADD COLUMN x UInt8", "CREATE TABLE IF NOT EXISTS t (a UInt8) ENGINE = Memory",
                 "CREATE MATERIALIZED VIEW IF NOT EXISTS v TO nowhere AS\nSELECT 1 AS a FROM events"):
        with pytest.raises(StoreError) as e:
            cluster_statements(stmt, tables={"events"}, version=7)
        assert e.value.code == "cluster_ddl_unsupported", stmt


def test_upgrade_from_0001_keeps_every_row_once(tmp_path):
    """A store built by 0001 (ReplacingMergeTree, duplicates not yet merged) moves to 0002 without loss."""
    only_0001 = tmp_path / "mig0001"
    only_0001.mkdir()
    for name in ("schema_migrations.sql", "0001_audit_tables.sql"):
        (only_0001 / name).write_text((REPO / "infra/clickhouse/migrations" / name).read_text())
    url = f"chdb://{tmp_path / 'ch'}"
    with open_store(url) as s:
        assert migrate(s, directory=only_0001) == ["0001_audit_tables"]
        for _ in range(2):  # today's sink redelivered every batch once: duplicates wait for a merge
            for kind, records in audit_batches().items():
                table, names, cols = rows_for(kind, records)
                keep = [i for i, n in enumerate(names) if n != "state_hash"]  # 0001 has no state_hash
                s.insert(table, [cols[i] for i in keep], [names[i] for i in keep], column_oriented=True)
        engine = s.query("SELECT engine FROM system.tables WHERE name = 'events' AND database = currentDatabase()")
        assert engine.rows == [("ReplacingMergeTree",)]
        assert s.query("SELECT count() FROM events").rows[0][0] == 2 * len(audit_batches()["committed"])

        assert migrate(s) == ["0002_immutable_tables", "0003_sink_ranges", "0004_checkpoints",
                              "0005_handoff_rollups", "0006_drop_state_digests"]
        assert not s.query("EXISTS TABLE state_digests").rows[0][0]
        expected = {"events": "committed", "transitions": "transition", "violations": "violation",
                    "rejections": "rejection", "snapshots": "snapshot", "replay_verdicts": "verdict"}
        for table, kind in expected.items():
            engine = s.query("SELECT engine FROM system.tables WHERE name = {t:String} "
                             "AND database = currentDatabase()", {"t": table}).rows
            assert engine == [("MergeTree",)], table
            assert s.query(f"SELECT count() FROM {table}").rows[0][0] == len(audit_batches()[kind]), table
            assert s.query(f"SELECT count() FROM {table}_0001").rows[0][0] == 2 * len(audit_batches()[kind])
        # the rollups were backfilled from the rows already there
        usage = sum(1 for r in audit_batches()["committed"] if r["doc"]["type"] == "provider.usage")
        assert s.query("SELECT sum(calls) FROM usage_hourly").rows[0][0] == usage
        assert s.query("SELECT sum(events) FROM run_rollup").rows[0][0] == len(audit_batches()["committed"])
        # 0005's transition rollups too: one step per transition but the first of its dispatch
        steps = s.query("SELECT count() - uniqExact(parent_run_id, dispatch_id) FROM transitions").rows[0][0]
        assert steps > 0 and s.query("SELECT sum(weight) FROM handoff_steps").rows[0][0] == steps
        failed = [r for r in audit_batches()["transition"] if r["phase"] in ("dispatch.failed", "child.failed",
                                                                            "child.cancelled")]
        assert (s.query("SELECT sum(n) FROM (SELECT uniqExactMerge(transitions) AS n FROM worker_failures "
                        "GROUP BY worker_id, phase, error_code)").rows[0][0] == len(failed) > 0)
        assert (s.query("SELECT worker_id, uniqExactMerge(dispatches) FROM worker_dispatches GROUP BY worker_id "
                        "ORDER BY worker_id").rows
                == s.query("SELECT worker_id, uniqExact(dispatch_id) FROM transitions GROUP BY worker_id "
                           "ORDER BY worker_id").rows)
        assert migrate(s) == []


class _ClusterOnOneNode(Store):
    """A chdb store that runs the cluster DDL as its single-node equivalent (no Keeper, no cluster here).

    ``ON CLUSTER`` is dropped, ``Replicated<Engine>('<path>', '<replica>', args)`` becomes
    ``<Engine>(args)`` and ``Distributed(... <t>_local ...)`` a ``Merge`` over ``<t>_local``, so the
    runner's own decisions (which engine a table has, whether it is empty, what to drop) are what
    is tested, on ClickHouse itself.
    """

    def command(self, sql, parameters=None, *, settings=None):
        sql = re.sub(r" ON CLUSTER '[^']*'", "", sql)
        sql = re.sub(r"Replicated(\w*MergeTree)\('[^']*',\s*'[^']*'(?:,\s*)?", r"\1(", sql)
        sql = re.sub(r"Distributed\('[^']*',\s*currentDatabase\(\),\s*(\w+)[^)]*\)+",
                     r"Merge(currentDatabase(), '^\1$')", sql)
        return super().command(sql, parameters, settings=settings)


def test_a_fresh_cluster_migrates_through_0002_and_a_cluster_with_rows_is_refused(tmp_path):
    with open_store(f"chdb://{tmp_path / 'ch'}") as real:
        node = _ClusterOnOneNode(real._engine, real.url)
        assert migrate(node, cluster=True) == [
            "0001_audit_tables", "0002_immutable_tables", "0003_sink_ranges", "0004_checkpoints",
            "0005_handoff_rollups", "0006_drop_state_digests"]
        engines = dict(real.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase()").rows)
        assert engines["events_local"] == "MergeTree" and engines["sink_ranges_local"] == "MergeTree"
        assert "state_digests" not in engines and "state_digests_local" not in engines
        # the table over events_local was re-created from the new one: it has 0002's extracted columns
        assert "model" in {r[0] for r in real.query("DESCRIBE TABLE events").rows}
        assert migrate(node, cluster=True) == []

    with open_store(f"chdb://{tmp_path / 'ch2'}") as real:
        node = _ClusterOnOneNode(real._engine, real.url)
        mig = tmp_path / "only-0001"
        mig.mkdir()
        for name in ("schema_migrations.sql", "0001_audit_tables.sql"):
            (mig / name).write_text((REPO / "infra/clickhouse/migrations" / name).read_text())
        migrate(node, directory=mig, cluster=True)
        table, names, cols = rows_for("committed", audit_batches()["committed"])
        keep = [i for i, n in enumerate(names) if n != "state_hash"]  # 0001 has no state_hash
        real.insert("events_local", [cols[i] for i in keep], [names[i] for i in keep], column_oriented=True)
        with pytest.raises(StoreError) as e:
            migrate(node, cluster=True)
        assert e.value.code == "manual_upgrade"
        assert real.query("SELECT count() FROM events_local").rows[0][0] == len(audit_batches()["committed"])


def test_a_cluster_whose_ledger_holds_the_cluster_files_checksums_reports_no_drift(tmp_path):
    """A cluster migrated by running the cluster DDL files as they are (their sha256 in its ledger) is up to date."""
    with open_store(f"chdb://{tmp_path / 'ch'}") as real:
        node = _ClusterOnOneNode(real._engine, real.url)
        assert len(migrate(node, directory=CLUSTER_DDL)) == 6  # the files run as written: their checksums recorded
        assert migrate(node, cluster=True) == []
        real.insert("schema_migrations", [[5, "0005_handoff_rollups", "0" * 64]], ["version", "name", "checksum"])
        with pytest.raises(StoreError) as e:
            migrate(node, cluster=True)
        assert e.value.code == "migration_drift"


def test_checkpoints_land_in_their_table_and_verify_from_it(store):
    """A checkpoint row keeps the exact record, so an auditor can re-check it from the table."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentlog.core.checkpoint import key_id, sign_checkpoint, verify_checkpoint

    key = Ed25519PrivateKey.generate()
    cps = [sign_checkpoint(key, run_id="r1", sequence=s, head_hash=f"{s:064x}", state_hash="b" * 64) for s in (9, 19)]
    store.insert_records("checkpoint", [{**c, "_position": {"partition": 0, "offset": i}} for i, c in enumerate(cps)])
    rows = store.query("SELECT sequence, key_id, head_hash, doc FROM checkpoints WHERE run_id = {r:String} "
                       "ORDER BY sequence", {"r": "r1"}).rows
    assert [(r[0], r[1], r[2]) for r in rows] == [(9, key_id(key), f"{9:064x}"), (19, key_id(key), f"{19:064x}")]
    assert [json.loads(r[3]) for r in rows] == cps
    assert all(verify_checkpoint(json.loads(r[3]), {key_id(key): key.public_key()}) is None for r in rows)


# --- one owner per chdb directory, held by an flock the kernel drops with the process ------------------------

SINK_HOLDER = """
import sys
from agentlog.audit.store import open_store
s = open_store(sys.argv[1], role=sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
"""


def _holder(url: str, role: str = "audit-sink") -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", SINK_HOLDER, url, role], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    assert holder.stdout.readline().strip() == "ready"
    return holder


def test_a_sigkilled_owner_frees_the_directory_at_once(tmp_path):
    url = f"chdb://{tmp_path / 'ch'}"
    holder = _holder(url)
    assert read_owner(url)["pid"] == holder.pid
    holder.kill()
    holder.wait(timeout=30)
    # its owner file is still there, naming a dead pid; the lock went with the process
    assert json.loads(owner_file(tmp_path / "ch").read_text())["pid"] == holder.pid
    assert read_owner(url) is None
    with open_store(url) as s:
        assert s.query("SELECT 1").rows == [(1,)]


def test_an_owner_file_naming_a_live_stranger_does_not_lock(tmp_path):
    """A recycled pid: the record names a live process that holds no lock, so it owns nothing."""
    url = f"chdb://{tmp_path / 'ch'}"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner_file(tmp_path / "ch").write_text(json.dumps({"pid": stranger.pid, "cmd": "agentlog worker"}))
        assert read_owner(url) is None
        with open_store(url) as s:
            assert read_owner(url)["pid"] == os.getpid()
            assert s.query("SELECT 1").rows == [(1,)]
    finally:
        stranger.kill()
        stranger.wait(timeout=30)


def test_a_second_sink_worker_refuses_at_once_naming_the_owner(tmp_path):
    from agentlog.audit.migrations import open_owned
    from agentlog.schemas.errors import StoreLockedError
    from agentlog.streams.settings import Settings

    settings = Settings(home=tmp_path, clickhouse_url=f"chdb://{tmp_path / 'ch'}")
    holder = _holder(settings.store_url)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreLockedError) as e:
            open_owned(settings, wait_s=60)
        assert time.monotonic() - t0 < 10  # not the 60 s a short-lived opener is waited for
        assert e.value.code == "store_locked" and e.value.owner["pid"] == holder.pid
        assert f"pid {holder.pid}" in str(e.value) and "--role process" in str(e.value)
    finally:
        holder.communicate("\n", timeout=60)
    with open_owned(settings, wait_s=5) as store:  # the owner left: this one owns it now
        assert read_owner(settings)["role"] == "audit-sink" and store.path == str(tmp_path / "ch")


class _Column(list):
    """A column whose end can be watched (a weak reference to it)."""


def test_an_insert_leaves_its_data_to_reference_counting(store):
    """The client's insert context is a reference cycle; the worker's collector reaches cycles only at its rare full
    collection (agentlog.worker.gcpause), so the data of every insert must not hang on it."""
    import gc
    import weakref

    table, names, cols = rows_for("committed", audit_batches()["committed"])
    columns = [_Column(c) for c in cols]
    watched = [weakref.ref(c) for c in columns]
    gc.disable()
    try:
        assert store.insert(table, columns, names, column_oriented=True) == len(cols[0])
        del columns
        assert [w() for w in watched if w() is not None] == []
    finally:
        gc.enable()
