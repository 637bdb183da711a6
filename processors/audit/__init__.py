"""The audit history in ClickHouse: store, migrations, row mapping, named queries, query server, report,
and the sink that fills the store from every output topic exactly once (:mod:`agentlog.audit.sink`,
its inserts in :mod:`agentlog.audit.exactly_once`).
"""

from agentlog.audit.migrations import MIGRATIONS_DIR, cluster_migration, migrate, open_owned
from agentlog.audit.queries import NAMED_QUERIES, run_named, run_sql
from agentlog.audit.report import render_report
from agentlog.audit.server import handle_query_request, query_via_worker
from agentlog.audit.store import QueryResult, Store, open_store, read_owner

__all__ = [
    # store
    "QueryResult", "Store", "open_store", "read_owner",
    # migrations
    "MIGRATIONS_DIR", "cluster_migration", "migrate", "open_owned",
    # queries
    "NAMED_QUERIES", "handle_query_request", "query_via_worker", "run_named", "run_sql",
    # report
    "render_report",
]
