"""Queries over HTTP, for a chdb store that a worker process owns.

chdb lets one process open a directory, so while a worker runs, ``agentlog query``
cannot open the store itself. The worker mounts :func:`handle_query_request` on its
web endpoint (``POST /query`` and ``POST /sql``) and advertises the URL in the
store's owner file (``Store.set_query_url``); :func:`query_via_worker` is the
client side. Both sides speak the same JSON:

request  ``{"query": "run-timeline", "params": {"run_id": "r1"}}`` or ``{"sql": "SELECT 1"}``
response ``{"columns": [...], "rows": [[...], ...]}`` (200) or ``{"error": {"code", "message"}}`` (400/500)
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from typing import Any

from processors.audit.queries import run_named, run_sql
from processors.audit.store import QueryResult, Store, read_owner
from schemas.errors import AgentlogError, StoreError
from streams.settings import Settings

__all__ = ["handle_query_request", "query_via_worker", "result_to_json", "json_value"]

#: Errors that are the caller's fault (bad name, bad param, write attempt): HTTP 400.
_CLIENT_ERRORS = {"unknown_query", "bad_param", "read_only", "bad_request", "clickhouse_error"}


def json_value(v: Any) -> Any:
    """A ClickHouse result value as JSON: datetimes ISO 8601, big ints as they are, bytes as text."""
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, (_dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, (uuid.UUID, decimal.Decimal)):
        return str(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    if isinstance(v, float) and v != v:  # NaN (e.g. a rate over zero rows) is not JSON
        return None
    return v


def result_to_json(result: QueryResult) -> dict[str, Any]:
    return {"columns": list(result.columns), "rows": [[json_value(v) for v in row] for row in result.rows]}


def handle_query_request(store: Store, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """Answer one query request; never raises (errors become ``{"error": {code, message}}``)."""
    try:
        if not isinstance(body, Mapping):
            raise StoreError("request body must be a JSON object", code="bad_request")
        if "sql" in body:
            if not isinstance(body["sql"], str):
                raise StoreError("'sql' must be a string", code="bad_request")
            result = run_sql(store, body["sql"])
        elif "query" in body:
            params = body.get("params") or {}
            if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
                raise StoreError("'params' must be an object of name → value", code="bad_request")
            result = run_named(store, str(body["query"]), {k: str(v) for k, v in params.items()})
        else:
            raise StoreError("request needs 'query' (+ 'params') or 'sql'", code="bad_request")
    except AgentlogError as e:
        status = 400 if e.code in _CLIENT_ERRORS else 500
        return status, {"error": e.to_dict()}
    return 200, result_to_json(result)


def query_via_worker(settings: Settings | str, body: Mapping[str, Any], *, timeout_s: float = 60.0
                     ) -> dict[str, Any] | None:
    """POST ``body`` to the owning worker's query endpoint; ``None`` when no live worker owns the store.

    Raises:
        StoreError: the worker's own error (same code), or ``store_unreachable`` when the
            owner advertises an endpoint that does not answer.
    """
    owner = read_owner(settings)
    if not owner or not owner.get("queryUrl"):
        return None
    base = str(owner["queryUrl"]).rstrip("/")
    path = "/sql" if "sql" in body else "/query"
    url = base if base.endswith(("/query", "/sql")) else base + path
    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read()).get("error") or {}
        except ValueError:
            err = {}
        raise StoreError(err.get("message") or f"worker query endpoint {url} answered HTTP {e.code}",
                         code=err.get("code") or "store_unreachable") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise StoreError(
            f"the store is owned by pid {owner.get('pid')} but its query endpoint {url} does not answer ({e}); "
            f"check that worker or stop it",
            code="store_unreachable",
        ) from e
