"""The audit schema's versioned migrations, and opening the store the way the worker's sink does.

Migrations are SQL files under ``infra/clickhouse/migrations`` (``NNNN_<change>.sql``),
recorded with a checksum in ``schema_migrations``; the cluster variant (Replicated /
Distributed DDL) lives beside them in ``infra/clickhouse/cluster``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from pathlib import Path

from processors.audit.store import Store, open_store
from schemas.errors import StoreError, StoreLockedError
from streams.settings import Settings

__all__ = ["CLUSTER_MIGRATIONS_DIR", "MIGRATIONS_DIR", "apply_retention", "migrate", "open_owned"]

log = logging.getLogger("agentlog.audit")

_INFRA = Path(__file__).resolve().parents[2] / "infra" / "clickhouse"
MIGRATIONS_DIR = _INFRA / "migrations"
CLUSTER_MIGRATIONS_DIR = _INFRA / "cluster"
_BOOTSTRAP = "schema_migrations.sql"
_MIGRATION_NAME = re.compile(r"^(\d{4})_[A-Za-z0-9_]+\.sql$")


def _statements(sql: str) -> list[str]:
    """Split a migration into statements. Migrations keep ``--`` and ``;`` out of string literals."""
    no_comments = re.sub(r"--[^\n]*", "", sql)
    return [s.strip() for s in no_comments.split(";") if s.strip()]


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


def migrate(target: Store | Settings | str, *, directory: Path | str | None = None) -> list[str]:
    """Apply the versioned SQL migrations not yet recorded in ``schema_migrations``, in order.

    Idempotent: a second call applies nothing and returns ``[]``. Every DDL uses
    ``IF NOT EXISTS``, so a crash between a statement and its ledger row is repaired
    by running again. ``directory`` selects a variant (``CLUSTER_MIGRATIONS_DIR``).

    Returns:
        Names of the migrations applied by this call (``["0001_audit_tables", ...]``).

    Raises:
        StoreError: ``migration_drift`` when an applied migration's file changed
            (add a new migration instead of editing an applied one).
    """
    directory = Path(directory) if directory is not None else MIGRATIONS_DIR
    store = target if isinstance(target, Store) else open_store(target)
    try:
        for stmt in _statements((directory / _BOOTSTRAP).read_text("utf-8")):
            store.command(stmt)
        applied = {int(v): c for v, c in store.query(
            "SELECT version, argMax(checksum, applied_at) FROM schema_migrations GROUP BY version").rows}
        done: list[str] = []
        for version, name, path in _migration_files(directory):
            text = path.read_text("utf-8")
            checksum = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if version in applied:
                if applied[version] != checksum:
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
      (0001's ReplacingMergeTree tables under 0002's MergeTree): :func:`_rebuild` on one node;
      on a cluster :func:`_replace_empty` when the table is empty (a fresh cluster runs 0001
      and 0002 back to back), else ``manual_upgrade``.
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
            if cluster and _empty(store, table.group(1)):
                # a fresh cluster: 0001 created these tables a moment ago, nothing to carry over
                _replace_empty(store, table.group(1), stmt, cluster.group(0))
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
    """Drop an EMPTY cluster table whose engine changed and create it as declared.

    The Distributed table over it is dropped too: it was created ``AS <local>`` and would keep
    the old columns; the migration's next statement creates it again from the new table.
    Only for empty tables (a fresh cluster that just ran 0001): a table with rows is moved by
    hand (infra/clickhouse/README.md, 'Upgrading a cluster').
    """
    dist = local.removesuffix("_local")
    if dist != local:
        store.command(f"DROP TABLE IF EXISTS {dist} {on_cluster} SYNC")
    store.command(f"DROP TABLE IF EXISTS {local} {on_cluster} SYNC")
    store.command(create)
    log.warning("empty cluster table %s re-created with the engine of the current migration", local)


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


def apply_retention(store: Store, days: int) -> None:
    """Make ``events`` keep ``days`` days of history by event time (``Settings.events_ttl_days``; 0 = forever).

    A row TTL, applied by ClickHouse in background merges; the rollups keep their sums.
    """
    if days < 0:
        raise StoreError(f"events_ttl_days must be >= 0, got {days}", code="bad_setting")
    if days:
        store.command(f"ALTER TABLE events MODIFY TTL toDateTime(event_time) + INTERVAL {int(days)} DAY")
    elif "TTL " in str(store.query("SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
                                   "AND name = 'events'").rows[0][0]):
        store.command("ALTER TABLE events REMOVE TTL")


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
                apply_retention(store, settings.events_ttl_days)
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
