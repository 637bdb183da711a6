"""The audit schema's versioned migrations, and opening the store the way the worker's sink does.

Migrations are SQL files under ``infra/clickhouse/migrations`` (``NNNN_<change>.sql``), written
for one node (chdb or one ClickHouse server) and recorded with a checksum in ``schema_migrations``.
A cluster runs the same files rewritten by :func:`cluster_statements` (``migrate(..., cluster=True)``),
so the two variants cannot disagree on a column, a key or a view.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Collection
from importlib import resources
from pathlib import Path

from agentlog.audit.store import Store, open_store
from agentlog.schemas.errors import StoreError, StoreLockedError
from agentlog.streams.settings import Settings

__all__ = ["MIGRATIONS_DIR", "cluster_migration", "cluster_statements", "migrate",
           "migration_statements", "open_owned"]

log = logging.getLogger("agentlog.audit")

#: Package data of ``agentlog.infra`` (the repository's ``infra/clickhouse/migrations``).
MIGRATIONS_DIR = Path(str(resources.files("agentlog.infra"))) / "clickhouse" / "migrations"
_BOOTSTRAP = "schema_migrations.sql"
_LEDGER = "schema_migrations"
_MIGRATION_NAME = re.compile(r"^(\d{4})_[A-Za-z0-9_]+\.sql$")


def _statements(sql: str) -> list[str]:
    """Split a migration into statements, without comments, trailing blanks or empty lines.

    Migrations keep ``--`` and ``;`` out of string literals.
    """
    no_comments = re.sub(r"--[^\n]*", "", sql)
    out = []
    for s in no_comments.split(";"):
        lines = [line.rstrip() for line in s.strip().splitlines()]
        if stmt := "\n".join(line for line in lines if line):
            out.append(stmt)
    return out


def migration_statements(directory: Path | str | None = None) -> list[str]:
    """Every statement of the single-node migrations, in version order: the DDL a migrated store ran.

    Applied migrations never change (``migration_drift``), so this text is what the store holds;
    the rollup repair reads the views' SELECTs from it (:mod:`agentlog.audit.rollups`).
    """
    directory = Path(directory) if directory is not None else MIGRATIONS_DIR
    return [stmt for _, _, path in _migration_files(directory) for stmt in _statements(path.read_text("utf-8"))]


def _migration_files(directory: Path) -> list[tuple[int, str, Path]]:
    out = []
    for p in sorted(directory.glob("*.sql")):
        m = _MIGRATION_NAME.match(p.name)
        if m:
            out.append((int(m.group(1)), p.stem, p))
    versions = [v for v, _, _ in out]
    if len(versions) != len(set(versions)):
        raise StoreError(f"two migrations share a version number in {directory}", code="migration_conflict")
    return out


# --- the cluster variant, derived ---------------------------------------------------------------------------
#
# On a cluster (macros {cluster}, {shard}, {replica} defined on every node) each table <t> of the single-node
# DDL is <t>_local, a Replicated* engine with one replica set per shard, plus <t>, a Distributed table over
# it that the sink and the queries use unchanged. The views run on every shard, from <source>_local into
# <rollup>_local. The ledger is the one table replicated to every node, unsharded.

ON_CLUSTER_CLAUSE = "ON CLUSTER '{cluster}'"
_REPLICA_PATH = "'/clickhouse/tables/{shard}/{database}/%s', '{replica}'"
_LEDGER_REPLICA_PATH = "'/clickhouse/tables/all/{database}/%s', '{replica}'"

#: Sharding keys that are not the leading column of the table's sorting key, by (version, table).
#: Every other table is sharded by that leading column: every row of one sorting key is on one shard
#: (a ReplacingMergeTree's FINAL, evaluated per shard, stays exact), and the tables led by a run column
#: keep a run's rows, rollup rows included, on one shard, where the views and GROUP BY see all of them.
_SHARD_KEYS = {(1, "rejections"): "source_topic, source_partition"}

_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)(?=\s*\()")
_TABLE_ENGINE = re.compile(r"\bENGINE = (\w*MergeTree)(?:\(([^)]*)\))?")
_ORDER_BY = re.compile(r"\bORDER BY \(?\s*(\w+)")
_SETTINGS = re.compile(r"\nSETTINGS (.+)$", re.S)
_VIEW = re.compile(r"CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS\n")
_DROP_TABLE = re.compile(r"DROP TABLE IF EXISTS (\w+)$")
_SOURCE = re.compile(r"\b(FROM|JOIN)(\s+)(\w+)\b")
_MERGE_SOURCE = re.compile(r"(merge\(currentDatabase\(\),\s*'\^)(\w+)(\$'\))")


def cluster_statements(stmt: str, *, tables: Collection[str], version: int = 0) -> list[str]:
    """The statements a cluster runs for one single-node migration statement.

    * ``CREATE TABLE IF NOT EXISTS t (...) ENGINE = <E>MergeTree[(args)] ...`` becomes ``t_local``
      ``ON CLUSTER`` with ``Replicated<E>MergeTree('/clickhouse/tables/{shard}/{database}/t_local',
      '{replica}'[, args])`` (``non_replicated_deduplication_window`` dropped: a replicated table
      deduplicates inserts in its replicated log, ``replicated_deduplication_window``), followed by
      ``t`` as ``Distributed`` over ``t_local``, sharded by ``cityHash64`` of the leading column of the
      sorting key (``_SHARD_KEYS`` names the exceptions). The ledger ``schema_migrations`` is
      replicated to every node instead (zoo path under ``all``) and has no Distributed table.
    * ``CREATE MATERIALIZED VIEW IF NOT EXISTS v TO t AS <select>`` becomes the view ``ON CLUSTER``
      writing ``t_local``, its ``<select>`` reading ``<table>_local`` for every table of ``tables``
      (after ``FROM``/``JOIN`` and in ``merge(currentDatabase(), '^<table>$')``).
    * ``DROP TABLE IF EXISTS t`` drops ``t`` and, for a table of ``tables``, ``t_local``, each
      ``ON CLUSTER ... SYNC``.

    Args:
        stmt: one statement as :func:`_statements` returns it.
        tables: the tables the single-node migrations create (each is split into ``_local`` and
            Distributed), without the ledger.
        version: the migration's version (0 for the ledger bootstrap), for ``_SHARD_KEYS``.

    Raises:
        StoreError: ``cluster_ddl_unsupported`` for a statement with no cluster form here: extend
            this function (and its test against the expected cluster DDL) before adding such a migration.
    """
    if table := _TABLE.match(stmt):
        return _cluster_table(stmt, table, version)
    if view := _VIEW.match(stmt):
        name, target = view.groups()
        if target not in tables:
            raise StoreError(f"view {name} writes {target}, which no migration creates", code="cluster_ddl_unsupported")
        select = _SOURCE.sub(lambda m: m.group(0) + "_local" if m.group(3) in tables else m.group(0), stmt[view.end():])
        select = _MERGE_SOURCE.sub(lambda m: f"{m.group(1)}{m.group(2)}_local{m.group(3)}"
                                   if m.group(2) in tables else m.group(0), select)
        return [f"CREATE MATERIALIZED VIEW IF NOT EXISTS {name} {ON_CLUSTER_CLAUSE} TO {target}_local AS\n{select}"]
    if drop := _DROP_TABLE.match(stmt):
        name = drop.group(1)
        return [f"DROP TABLE IF EXISTS {n} {ON_CLUSTER_CLAUSE} SYNC"
                for n in ([name, f"{name}_local"] if name in tables else [name])]
    raise StoreError(f"no cluster form for this migration statement: {stmt.splitlines()[0]}",
                     code="cluster_ddl_unsupported")


def _cluster_table(stmt: str, header: re.Match[str], version: int) -> list[str]:
    name = header.group(1)
    engine = _TABLE_ENGINE.search(stmt)
    order = _ORDER_BY.search(stmt)
    if engine is None or order is None:
        raise StoreError(f"table {name}: no cluster form for an engine other than a MergeTree with an ORDER BY",
                         code="cluster_ddl_unsupported")
    ledger = name == _LEDGER
    local = name if ledger else f"{name}_local"
    args = (_LEDGER_REPLICA_PATH if ledger else _REPLICA_PATH) % local
    if engine.group(2):
        args += f", {engine.group(2)}"
    ddl = (f"CREATE TABLE IF NOT EXISTS {local} {ON_CLUSTER_CLAUSE}"
           + stmt[header.end():engine.start()]
           + f"ENGINE = Replicated{engine.group(1)}({args})" + stmt[engine.end():])
    if settings := _SETTINGS.search(ddl):
        kept = [s.strip() for s in settings.group(1).split(",")
                if not s.strip().startswith("non_replicated_deduplication_window")]
        ddl = ddl[:settings.start()] + (f"\nSETTINGS {', '.join(kept)}" if kept else "")
    if ledger:
        return [ddl]
    key = _SHARD_KEYS.get((version, name), order.group(1))
    return [ddl, f"CREATE TABLE IF NOT EXISTS {name} {ON_CLUSTER_CLAUSE} AS {local}\n"
                 f"ENGINE = Distributed('{{cluster}}', currentDatabase(), {local}, cityHash64({key}))"]


def _tables(directory: Path, through: int) -> set[str]:
    """The tables created by the migrations in ``directory`` up to version ``through``, but the ledger.

    Only earlier and same-version files count, so a migration's cluster text never changes with a later one.
    """
    return {m.group(1) for version, _, path in _migration_files(directory) if version <= through
            for stmt in _statements(path.read_text("utf-8")) if (m := _TABLE.match(stmt))}


def _cluster_text(sql: str, *, tables: Collection[str], version: int) -> str:
    return "".join(f"{c};\n\n" for s in _statements(sql)
                   for c in cluster_statements(s, tables=tables, version=version)).removesuffix("\n")


def cluster_migration(path: Path | str) -> str:
    """The cluster DDL of the single-node migration file at ``path``, one statement after another.

    What ``migrate(..., cluster=True)`` runs and checksums for that file; print it to apply a
    migration by hand (infra/clickhouse/README.md, 'Upgrading a cluster').
    """
    path = Path(path)
    m = _MIGRATION_NAME.match(path.name)
    version = int(m.group(1)) if m else 0
    return _cluster_text(path.read_text("utf-8"), tables=_tables(path.parent, version), version=version)


#: Per version, the checksum of the cluster DDL as a written-out file (kept as the expected cluster DDL in
#: tests/unit/audit/cluster_ddl), which a cluster's ledger may hold, and the checksum of the derived text
#: of the same statements (that test proves them the same): a ledger row with the first counts as the second.
_CLUSTER_FILE_CHECKSUMS = {
    1: ("f811997dd0c95ec3709a3218e267db36d11a863111452f348d3f87b66b65847b",
        "e8601f163a1366f6bc87dcce3d8d31b3cc97e7b5c2329751848b35e9ce15d68a"),
    2: ("1f990b6b6a1e0bdb2653eee1ce4da74b42a4e29ae539e675e3b8f3b580cd23a5",
        "a6157ec06317a3c0c211d269ba0340733000ba74adbfb37c26ec59e3192b4f6a"),
    3: ("eba56f872645c856d35498d301b0e0568466b8be2ea67e16e7347116d9dbfed9",
        "784251c2a858ec425364371f4f1b6d421f01e3db4fe521be87560727068a320e"),
    4: ("f3c47fc160ffb1853242e9c70f8217f01ef173dd4c8576bd2b28a7358b2b1e24",
        "8ab51f4988f33e07a2ac3eeb91a00e84ecc513615b62bee2a65c4c4b0911696c"),
    5: ("2303d9ecb8010d838779a72ce01476dd08d94452a9343e2cea71d4a4bbc483cf",
        "34bb241cbcc4bd54256e5de082137ee4376437022ba3737f239c12b07ff13596"),
    6: ("baab7bec81dfd8ae3ffa692c090f99151e96b1c2312eb12c8fbde0f58b8ec332",
        "a6f50560aa512297806c1f1d47ad9656d1ba8aae2c1e83e75c56693a7862ecd4"),
}


def migrate(target: Store | Settings | str, *, cluster: bool = False, directory: Path | str | None = None) -> list[str]:
    """Apply the versioned SQL migrations not yet recorded in ``schema_migrations``, in order.

    Idempotent: a second call applies nothing and returns ``[]``. Every DDL uses
    ``IF NOT EXISTS``, so a crash between a statement and its ledger row is repaired
    by running again.

    Args:
        target: the store, or what :func:`open_store` opens.
        cluster: run the cluster form of every migration (:func:`cluster_statements`); the
            ``{cluster}``, ``{shard}`` and ``{replica}`` macros must be defined on every node.
        directory: the single-node migrations (``MIGRATIONS_DIR`` unless given).

    The ledger's checksum is the sha256 of the text that runs: on one node the migration file,
    on a cluster its derived text (:func:`cluster_migration`), so on a cluster a change to the
    derivation that alters an applied migration is drift too.

    Returns:
        Names of the migrations applied by this call (``["0001_audit_tables", ...]``).

    Raises:
        StoreError: ``migration_drift`` when an applied migration's text changed
            (add a new migration instead of editing an applied one).
    """
    directory = Path(directory) if directory is not None else MIGRATIONS_DIR

    def text_of(path: Path, version: int) -> str:
        sql = path.read_text("utf-8")
        return _cluster_text(sql, tables=_tables(directory, version), version=version) if cluster else sql

    store = target if isinstance(target, Store) else open_store(target)
    try:
        for stmt in _statements(text_of(directory / _BOOTSTRAP, 0)):
            store.command(stmt)
        applied = {int(v): c for v, c in store.query(
            "SELECT version, argMax(checksum, applied_at) FROM schema_migrations GROUP BY version").rows}
        done: list[str] = []
        for version, name, path in _migration_files(directory):
            text = text_of(path, version)
            checksum = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if version in applied:
                same = applied[version] == checksum or (
                    cluster and _CLUSTER_FILE_CHECKSUMS.get(version) == (applied[version], checksum))
                if not same:
                    raise StoreError(
                        f"migration {name} was applied with different contents; never edit an applied "
                        f"migration, add {version + 1:04d}_<change>.sql instead",
                        code="migration_drift",
                    )
                continue
            for stmt in _statements(text):
                _apply(store, stmt, version)
            store.insert("schema_migrations", [[version, name, checksum]], ["version", "name", "checksum"])
            done.append(name)
        return done
    finally:
        if store is not target:
            store.close()


_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\s*(?:ON CLUSTER '[^']*'\s*)?\(", re.S)
_ENGINE = re.compile(r"\bENGINE\s*=\s*(\w+)")
_CREATE_VIEW = re.compile(
    r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+)(?: ON CLUSTER '[^']*')? TO (\w+) AS\s+(.*)$", re.S)


def _table_engine(store: Store, name: str) -> str | None:
    rows = store.query("SELECT engine FROM system.tables WHERE database = currentDatabase() AND name = {n:String}",
                       {"n": name}).rows
    return str(rows[0][0]) if rows else None


def _apply(store: Store, stmt: str, version: int) -> None:
    """Run one migration statement, upgrading what ``IF NOT EXISTS`` alone would silently skip.

    * ``CREATE TABLE IF NOT EXISTS t (...) ENGINE = E`` when ``t`` exists with another engine
      (0001's ReplacingMergeTree tables under 0002's MergeTree): :func:`_replace_empty` when the
      table is empty (a fresh store runs 0001 and 0002 back to back), else :func:`_rebuild` on one
      node and ``manual_upgrade`` on a cluster.
    * ``CREATE MATERIALIZED VIEW IF NOT EXISTS v TO t AS <select>`` when ``v`` does not exist yet:
      the target is emptied and backfilled with ``INSERT INTO t <select>`` before the view is
      created, so rows already in the store count in the rollup. A crash anywhere in between
      leaves no view, so running again redoes the backfill from an empty target instead of
      doubling it.
    """
    table = _CREATE_TABLE.match(stmt)
    engine = _ENGINE.search(stmt)
    if table and engine:
        existing = _table_engine(store, table.group(1))
        if existing is not None and existing != engine.group(1):
            cluster = _ON_CLUSTER.search(stmt)
            if _empty(store, table.group(1)):
                # a fresh store: 0001 created this table a moment ago, nothing to carry over or keep
                _replace_empty(store, table.group(1), stmt, cluster.group(0) if cluster else "")
                return
            if cluster:
                raise StoreError(
                    f"table {table.group(1)} is {existing}, migration {version:04d} declares {engine.group(1)}: "
                    f"on a cluster the move is done by hand (infra/clickhouse/README.md, 'Upgrading a cluster')",
                    code="manual_upgrade")
            _rebuild(store, table.group(1), stmt, version)
            return
        leftover = _table_engine(store, f"{table.group(1)}_new")
        if existing is not None and leftover is not None and leftover != engine.group(1):
            # a crash between _rebuild's EXCHANGE and its RENAME: finish the rename
            store.command(f"RENAME TABLE {table.group(1)}_new TO {table.group(1)}_{version - 1:04d}")
    view = _CREATE_VIEW.match(stmt)
    if view and _table_engine(store, view.group(1)) is None:
        target, select = view.group(2), view.group(3)
        store.command(f"TRUNCATE TABLE IF EXISTS {target}")
        store.command(f"INSERT INTO {target} {select}")
    store.command(stmt)


_ON_CLUSTER = re.compile(r"ON CLUSTER '[^']*'")


def _empty(store: Store, local: str) -> bool:
    """No row in ``local`` on any shard (read through its Distributed table when there is one)."""
    dist = local.removesuffix("_local")
    name = dist if dist != local and _table_engine(store, dist) == "Distributed" else local
    return int(store.query(f"SELECT count() FROM {name}").rows[0][0]) == 0


def _replace_empty(store: Store, local: str, create: str, on_cluster: str) -> None:
    """Drop an EMPTY table whose engine changed and create it as declared, without a word.

    An empty table has nothing to carry over and nothing a kept copy would let anyone check, so
    it is not rebuilt and kept as ``<table>_<version>`` like a table with rows (:func:`_rebuild`):
    a fresh store ends with the declared tables only. On a cluster (``on_cluster`` the clause,
    else ``""``) the Distributed table over ``local`` is dropped too: it was created
    ``AS <local>`` and would keep the old columns; the migration's next statement creates it
    again from the new table. A cluster table with rows is moved by hand
    (infra/clickhouse/README.md, 'Upgrading a cluster').
    """
    dist = local.removesuffix("_local")
    if dist != local:
        store.command(f"DROP TABLE IF EXISTS {dist} {on_cluster} SYNC")
    store.command(f"DROP TABLE IF EXISTS {local} {on_cluster} SYNC")
    store.command(create)
    log.debug("empty table %s created again with the engine of the current migration", local)


def _rebuild(store: Store, name: str, create: str, version: int) -> None:
    """Move table ``name`` to the engine ``create`` declares, keeping one row per old sort key.

    The new table is built as ``<name>_new`` and filled with ``LIMIT 1 BY <old sorting key>``
    (this is where the ReplacingMergeTree's pending duplicates are dropped, once, instead of at
    every read), then swapped in with ``EXCHANGE TABLES`` (atomic) and the old table kept as
    ``<name>_<previous version>``. Restartable: a crash before the exchange leaves ``<name>``
    untouched and ``<name>_new`` is rebuilt from empty; after it, ``<name>`` already has the new
    engine and only the rename of the old table is left to do.
    """
    new, old = f"{name}_new", f"{name}_{version - 1:04d}"
    key = store.query("SELECT sorting_key FROM system.tables WHERE database = currentDatabase() "
                      "AND name = {n:String}", {"n": name}).rows[0][0]
    store.command(f"DROP TABLE IF EXISTS {new}")
    store.command(create.replace(f"IF NOT EXISTS {name}", f"{new}", 1))
    cols_new = [r[0] for r in store.query(
        "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String} "
        "AND default_kind NOT IN ('MATERIALIZED', 'ALIAS') ORDER BY position", {"t": new}).rows]
    cols_old = {r[0] for r in store.query(
        "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {t:String}",
        {"t": name}).rows}
    cols = ", ".join(c for c in cols_new if c in cols_old)
    before = store.query(f"SELECT count() FROM (SELECT 1 FROM {name} LIMIT 1 BY {key})").rows[0][0]
    store.command(f"INSERT INTO {new} ({cols}) SELECT {cols} FROM {name} LIMIT 1 BY {key}")
    after = store.query(f"SELECT count() FROM {new}").rows[0][0]
    if after != before:
        raise StoreError(f"upgrading {name}: copied {after} rows of {before}; the old table is untouched",
                         code="migration_failed")
    store.command(f"EXCHANGE TABLES {name} AND {new}")
    store.command(f"RENAME TABLE {new} TO {old}")
    log.warning("audit table %s moved to the new engine (%d rows); the old one is kept as %s", name, after, old)


#: The owner-record role of a worker running the audit sink (:func:`open_owned`): long-lived.
SINK_ROLE = "audit-sink"


def open_owned(settings: Settings, *, wait_s: float = 60.0) -> Store:
    """Open (and migrate) the store for a long-lived owner, waiting out a short-lived opener such as a CLI query.

    chdb lets one process own a directory; a user's ``agentlog query`` run while
    no worker owned it holds the lock for a moment. A worker that died on that
    would be absurd, so it retries; a long-lived owner still ends in one clear error.
    Another worker running the audit sink on the directory is not waited for:
    with the embedded store there is one sink per directory, and this one refuses at once.

    Raises:
        StoreLockedError: another worker's audit sink owns the chdb directory, or any
            other owner kept it past ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            store = open_store(settings, role=SINK_ROLE)
            try:
                migrate(store)
            except BaseException:
                store.close()
                raise
            return store
        except StoreLockedError as e:
            if e.owner is not None and e.owner.get("role") == SINK_ROLE:
                raise StoreLockedError(
                    f"the embedded audit store {settings.store_url} is owned by another worker running the audit "
                    f"sink (pid {e.owner.get('pid')}, {e.owner.get('cmd', '?')}): one sink per chdb directory. "
                    "Run this worker with --role process (AGENTLOG_WORKER_ROLE=process), give it its own "
                    "AGENTLOG_HOME and prefix, or use a ClickHouse server (AGENTLOG_CLICKHOUSE_URL) for many sinks",
                    owner=e.owner) from e
            if time.monotonic() > deadline:
                raise
            log.warning("audit store busy (%s); retrying", e)
            time.sleep(1.0)
        except StoreError as e:
            if e.code not in {"store_unavailable", "store_busy"} or time.monotonic() > deadline:
                raise
            log.warning("audit store busy (%s); retrying", e)
            time.sleep(1.0)
