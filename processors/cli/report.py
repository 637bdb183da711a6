"""``agentlog report --run R``: the run's causation graph and handoff timeline as one HTML file.

The records come from the audit history. When this process can open the store (a server, or
a chdb directory no live worker holds) they are read with bound parameters straight from the
``events``, ``transitions`` and ``violations`` tables. When a worker owns the chdb directory,
the events come through its query endpoint (named query ``run-timeline``) and the
transitions and violations from their Kafka topics, which hold the same records the sink wrote.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from schemas.errors import StoreError


def _from_store(settings: Any, run_id: str) -> tuple[list[dict], list[dict], list[dict], str]:
    from processors.audit.store import open_store

    with open_store(settings) as store:
        params = {"run_id": run_id}
        events = store.query("SELECT doc FROM events FINAL WHERE run_id = {run_id:String} ORDER BY sequence", params)
        transitions = store.query("SELECT doc FROM transitions FINAL WHERE parent_run_id = {run_id:String}", params)
        violations = store.query("SELECT doc FROM violations FINAL WHERE run_id = {run_id:String} ORDER BY sequence",
                                 params)
        head = store.query("SELECT hash FROM events FINAL WHERE run_id = {run_id:String} ORDER BY sequence DESC "
                           "LIMIT 1", params)
    load = lambda result: [json.loads(row[0]) for row in result.rows]  # noqa: E731
    events_docs = [e for e in load(events)]
    return events_docs, load(transitions), load(violations), head.rows[0][0] if head.rows else ""


async def _topic(settings: Any, short: str, run_id: str, field: str) -> list[dict]:
    from streams.reader import read_topic

    out, seen = [], set()
    async for _, _, _, value in read_topic(settings, short, key=run_id):
        ident = json.dumps(value, sort_keys=True)
        if value.get(field) == run_id and ident not in seen:
            seen.add(ident)
            out.append(value)
    return out


def _via_worker(settings: Any, run_id: str) -> tuple[list[dict], list[dict], list[dict], str]:
    from processors.demo.tour import demo_worker, worker_query

    worker = demo_worker(settings)
    from processors.audit.server import query_via_worker

    body = {"query": "run-timeline", "params": {"run_id": run_id}}
    answer = query_via_worker(settings, body) if worker is None else worker_query(settings, worker, body)
    if answer is None:
        raise StoreError("the store is owned by a worker that advertises no query endpoint; "
                         "run the worker with --web, or stop it and run the report again", code="store_locked")
    rows = [dict(zip(answer["columns"], row)) for row in answer["rows"]]
    events = []
    for r in rows:
        doc = {"eventId": r["event_id"], "runId": run_id, "type": r["type"], "sequence": r["sequence"],
               "timestamp": str(r.get("event_time") or "")}
        if r.get("node_id"):
            doc["nodeId"] = r["node_id"]
        if r.get("causation_id"):
            doc["causationId"] = r["causation_id"]
        events.append(doc)
    transitions = asyncio.run(_topic(settings, "transitions", run_id, "parentRunId"))
    violations = asyncio.run(_topic(settings, "violations", run_id, "runId"))
    return events, transitions, violations, rows[-1]["hash"] if rows else ""


def fetch_report_records(settings: Any, run_id: str) -> tuple[list[dict], list[dict], list[dict], str, str]:
    """``(events, transitions, violations, head_hash, source)`` of ``run_id`` from the audit history."""
    from processors.audit.store import read_owner

    if read_owner(settings) is None:
        events, transitions, violations, head = _from_store(settings, run_id)
        source = "ClickHouse (events, transitions, violations)"
    else:
        events, transitions, violations, head = _via_worker(settings, run_id)
        source = "worker query endpoint (run-timeline) + transitions/violations topics"
    if not events:
        raise StoreError(f"run {run_id} has no events in the audit history; check the run id and "
                         "AGENTLOG_TOPIC_PREFIX / AGENTLOG_CLICKHOUSE_URL", code="unknown_run")
    return events, transitions, violations, head, source


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        run: str = typer.Option(..., "--run", help="The run to draw."),
        out: Path = typer.Option(None, "--out", help="Write the HTML here (default: report-<run>.html)."),
        as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
    ) -> None:
        """A self-contained HTML page: causation graph (events, causationId edges) and handoff timeline."""
        from processors.audit.report import render_report
        from streams.settings import load_settings

        settings = load_settings()
        events, transitions, violations, head, source = fetch_report_records(settings, run)
        target = out or Path(f"report-{run}.html")
        target.write_text(render_report(events, transitions, violations, run_id=run, head_hash=head or None), "utf-8")
        summary = {"out": str(target), "runId": run, "events": len(events), "transitions": len(transitions),
                   "violations": len(violations), "headHash": head, "source": source}
        if as_json:
            typer.echo(json.dumps(summary))
        else:
            typer.echo(f"wrote {target} ({len(events)} events, {len(transitions)} transitions, "
                       f"{len(violations)} violations; from {source})")
