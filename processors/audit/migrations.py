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
from schemas.errors import StoreError
from streams.settings import Settings

__all__ = ["CLUSTER_MIGRATIONS_DIR", "MIGRATIONS_DIR", "migrate", "open_owned"]

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
        applied = {int(v): c for v, c in store.query("SELECT version, checksum FROM schema_migrations FINAL").rows}
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
                store.command(stmt)
            store.insert("schema_migrations", [[version, name, checksum]], ["version", "name", "checksum"])
            done.append(name)
        return done
    finally:
        if store is not target:
            store.close()


def open_owned(settings: Settings, *, wait_s: float = 60.0) -> Store:
    """Migrate and open the store for a long-lived owner, waiting out a short-lived opener such as a CLI query.

    chdb lets one process own a directory; a user's ``agentlog query`` run while
    no worker owned it holds the lock for a moment. A worker that died on that
    would be absurd, so it retries; a long-lived owner still ends in one clear error.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            migrate(settings)
            return open_store(settings)
        except StoreError as e:
            if e.code not in {"store_locked", "store_unavailable", "store_busy"} or time.monotonic() > deadline:
                raise
            log.warning("audit store busy (%s); retrying", e)
            time.sleep(1.0)
