"""Queries over HTTP, for a chdb store that a worker process owns — and reading from any process.

chdb lets one process open a directory, so while a worker runs, ``agentlog query``
cannot open the store itself. The worker mounts :func:`handle_query_request` on its
web endpoint (``POST /query`` and ``POST /sql``) and advertises the URL in the
store's owner file (``Store.set_query_url``); :func:`query_via_worker` is the
client side: it finds the process that owns the store and asks it. Both sides speak
the same JSON:

request  ``{"query": "run-timeline", "params": {"run_id": "r1"}}`` or ``{"sql": "SELECT 1"}``
response ``{"columns": [...], "rows": [[...], ...]}`` (200) or ``{"error": {"code", "message"}}`` (400/500)

A reader that does not care who holds the store uses :func:`answer_query` (a query or SQL) or
:func:`fetch_report_records` (what ``agentlog report`` draws): through the owning worker when
there is one, else the store opened directly.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import decimal
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from typing import Any

from agentlog.audit.migrations import migrate
from agentlog.audit.queries import run_named, run_sql
from agentlog.audit.store import QueryResult, Store, open_store, read_owner
from agentlog.schemas.errors import AgentlogError, StoreError
from agentlog.streams.reader import read_topic
from agentlog.streams.settings import Settings

__all__ = [
    "answer_query", "fetch_report_records", "handle_query_request", "json_value", "query_via_worker",
    "report_records", "result_to_json",
]

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


def query_via_worker(settings: Settings | str, body: Mapping[str, Any], *, timeout_s: float = 60.0,
                     worker_url: str | None = None) -> dict[str, Any] | None:
    """Ask the process that owns the store: POST ``body`` to its query endpoint.

    The endpoint is the one the owner advertises in the store's owner file; when there is none,
    ``worker_url`` — a worker the caller started itself and knows the address of (the demo's) —
    is asked instead. ``None`` when no live worker owns the store and no ``worker_url`` is given.

    Raises:
        StoreError: the worker's own error (same code), or ``store_unreachable`` when the
            endpoint does not answer.
    """
    owner = read_owner(settings)
    if owner and owner.get("queryUrl"):
        base = str(owner["queryUrl"]).rstrip("/")
        unreachable = f"the store is owned by pid {owner.get('pid')} but its query endpoint {{url}} does not " \
                      "answer ({error}); check that worker or stop it"
    elif worker_url:
        base = worker_url.rstrip("/")
        unreachable = "worker query endpoint {url} does not answer ({error})"
    else:
        return None
    path = "/sql" if "sql" in body else "/query"
    url = base if base.endswith(("/query", "/sql")) else base + path
    token = settings.web_token if isinstance(settings, Settings) else ""  # a worker guarded by its web token
    try:
        try:
            return _send(url, body, "POST", timeout_s, token)
        except urllib.error.HTTPError as e:
            if e.code != 405:
                raise
            # Faust function pages may answer GET only; the endpoint reads the body either way.
            return _send(url, body, "GET", timeout_s, token)
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read()).get("error") or {}
        except ValueError:
            err = {}
        raise StoreError(err.get("message") or f"worker query endpoint {url} answered HTTP {e.code}",
                         code=err.get("code") or "store_unreachable") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise StoreError(unreachable.format(url=url, error=e), code="store_unreachable") from e


def _send(url: str, body: Mapping[str, Any], method: str, timeout_s: float, token: str = "") -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        answer: dict[str, Any] = json.loads(resp.read())  # the endpoint answers a JSON object
        return answer


def answer_query(settings: Settings, body: Mapping[str, Any]) -> dict[str, Any]:
    """Answer ``body`` (a named query or read-only SQL) through the owning worker if there is one,
    else against the store opened directly.

    Raises:
        StoreError: as :func:`query_via_worker`, or the store's own (unknown query, bad param, write attempt).
    """
    via_worker = query_via_worker(settings, body)
    if via_worker is not None:
        return via_worker
    with open_store(settings) as store:
        if store.backend == "chdb":
            migrate(store)  # a fresh directory answers "no rows", not "unknown table"
        if "sql" in body:
            result = run_sql(store, body["sql"])
        else:
            result = run_named(store, body["query"], body.get("params") or {})
        return result_to_json(result)


# ---------------------------------------------------------------------------------------------
# The records of one run, for ``agentlog report``

#: Records of one kind (events, transitions or violations), decoded from their JSON.
Records = list[dict[str, Any]]


def fetch_report_records(settings: Settings, run_id: str) -> tuple[Records, Records, Records, str, str]:
    """``(events, transitions, violations, head_hash, source)`` of ``run_id`` from the audit history.

    When this process can open the store (a server, or a chdb directory no live worker holds)
    the records are read with bound parameters straight from the ``events``, ``transitions``
    and ``violations`` tables. When a worker owns the chdb directory, the events come through
    its query endpoint (named query ``run-timeline``) and the transitions and violations from
    their Kafka topics, which hold the same records the sink wrote.

    Raises:
        StoreError: ``unknown_run`` when the history holds no event of the run; ``store_locked``
            when a worker owns the store but advertises no query endpoint.
    """
    if read_owner(settings) is None:
        events, transitions, violations, head = _report_from_store(settings, run_id)
        source = "ClickHouse (events, transitions, violations)"
    else:
        events, transitions, violations, head = _report_via_worker(settings, run_id)
        source = "worker query endpoint (run-timeline) + transitions/violations topics"
    if not events:
        raise StoreError(f"run {run_id} has no events in the audit history; check the run id and "
                         "AGENTLOG_TOPIC_PREFIX / AGENTLOG_CLICKHOUSE_URL", code="unknown_run")
    return events, transitions, violations, head, source


def _report_from_store(settings: Settings, run_id: str) -> tuple[Records, Records, Records, str]:
    with open_store(settings) as store:
        return report_records(store, run_id)


def report_records(store: Store, run_id: str) -> tuple[Records, Records, Records, str]:
    """``(events, transitions, violations, head_hash)`` of ``run_id`` read from an open store (events with payloads).

    Shared by ``agentlog report`` and the web console's run page, which draw the same records.
    """
    params = {"run_id": run_id}
    events = store.query("SELECT doc FROM events WHERE run_id = {run_id:String} ORDER BY sequence", params)
    transitions = store.query("SELECT doc FROM transitions WHERE parent_run_id = {run_id:String}", params)
    violations = store.query("SELECT doc FROM violations WHERE run_id = {run_id:String} ORDER BY sequence",
                             params)
    head = store.query("SELECT hash FROM events WHERE run_id = {run_id:String} ORDER BY sequence DESC "
                       "LIMIT 1", params)

    def load(result: QueryResult) -> Records:
        return [json.loads(row[0]) for row in result.rows]

    return load(events), load(transitions), load(violations), head.rows[0][0] if head.rows else ""


async def _topic_records(settings: Settings, short: str, run_id: str, field: str) -> Records:
    out, seen = [], set()
    async for _, _, _, value in read_topic(settings, short, key=run_id):
        ident = json.dumps(value, sort_keys=True)
        if value.get(field) == run_id and ident not in seen:
            seen.add(ident)
            out.append(value)
    return out


def _report_via_worker(settings: Settings, run_id: str) -> tuple[Records, Records, Records, str]:
    answer = query_via_worker(settings, {"query": "run-timeline", "params": {"run_id": run_id}})
    if answer is None:
        raise StoreError("the store is owned by a worker that advertises no query endpoint; "
                         "run the worker with --web, or stop it and run the report again", code="store_locked")
    rows = [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]
    events = []
    for r in rows:
        doc = {"eventId": r["event_id"], "runId": run_id, "type": r["type"], "sequence": r["sequence"],
               "timestamp": str(r.get("event_time") or "")}
        if r.get("node_id"):
            doc["nodeId"] = r["node_id"]
        if r.get("causation_id"):
            doc["causationId"] = r["causation_id"]
        events.append(doc)
    transitions = asyncio.run(_topic_records(settings, "transitions", run_id, "parentRunId"))
    violations = asyncio.run(_topic_records(settings, "violations", run_id, "runId"))
    return events, transitions, violations, rows[-1]["hash"] if rows else ""
