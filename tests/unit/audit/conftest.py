"""Audit-store fixtures: the same tests on embedded chdb and, when configured, a ClickHouse server.

Set ``AGENTLOG_TEST_CLICKHOUSE_URL=http://user:pass@host:8123`` to run the ``server``
cases; each test gets a fresh random database there, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.unit.audit.data import audit_batches

SERVER_URL_ENV = "AGENTLOG_TEST_CLICKHOUSE_URL"


@pytest.fixture(params=["chdb", "server"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """URL of an empty store on each backend."""
    if request.param == "chdb":
        yield f"chdb://{tmp_path / 'ch'}"
        return
    base = os.environ.get(SERVER_URL_ENV)
    if not base:
        pytest.skip(f"server backend: set {SERVER_URL_ENV}=http://user:pass@host:8123 to run against a ClickHouse server")
    import clickhouse_connect

    db = f"agentlog_test_{uuid.uuid4().hex[:10]}"
    admin = clickhouse_connect.get_client(dsn=base)
    admin.command(f"CREATE DATABASE {db}")
    try:
        yield base.rstrip("/") + "/" + db
    finally:
        admin.command(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


@pytest.fixture
def store(store_url: str):
    """A migrated, empty store (closed after the test so the next test may open another chdb dir)."""
    from agentlog.audit.migrations import migrate
    from agentlog.audit.store import open_store

    s = open_store(store_url)
    try:
        migrate(s)
        yield s
    finally:
        s.close()


@pytest.fixture
def loaded_store(store):
    """The store holding every record kind of the realistic scenario in tests/unit/audit/data.py."""
    for kind, records in audit_batches().items():
        store.insert_records(kind, records, dedup_token=f"fixture:{kind}")
    return store
