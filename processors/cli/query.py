"""``agentlog query NAME --param k=v`` and ``agentlog sql "SELECT …"``: the audit history.

When a worker owns the embedded chdb directory (chdb allows one process per
directory) the request goes to the worker's query endpoint; otherwise the store
is opened directly (:func:`agentlog.audit.server.answer_query`). For people a table
that fits the terminal, else one block per row (:func:`agentlog.cli._output.print_records`);
``--json`` / ``--csv`` for machines.
"""

from __future__ import annotations

import csv
import json
import sys
from typing import Any

import typer

from agentlog.schemas.errors import ConfigError

_FORMAT_HELP = "Print {columns, rows} as JSON."


def _parse_params(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--param {item!r} must look like name=value")
        out[name.strip()] = value
    return out


def _execute(body: dict[str, Any]) -> dict[str, Any]:
    # Imported here, not at module level, so `agentlog --help` does not load the audit store.
    from agentlog.audit.server import answer_query
    from agentlog.streams.settings import load_settings

    return answer_query(load_settings(), body)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else str(value)


def _emit(payload: dict[str, Any], *, as_json: bool, as_csv: bool, title: str) -> None:
    columns, rows = payload["columns"], payload["rows"]
    if as_json:
        typer.echo(json.dumps(payload, ensure_ascii=False, default=str))
        return
    if as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v for v in row])
        return
    from rich.console import Console

    from agentlog.cli._output import print_records

    console = Console(highlight=False)
    print_records(console, columns, ([_cell(v) for v in row] for row in rows), title=title)
    console.print(f"[dim]{len(rows)} row{'s' if len(rows) != 1 else ''}[/dim]")


def query_command(
    name: str = typer.Argument(None, help="Named query (omit with --list to see them)."),
    param: list[str] = typer.Option([], "--param", "-p", help="Parameter name=value (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help=_FORMAT_HELP),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV with a header row."),
    list_: bool = typer.Option(False, "--list", help="List the named queries and their parameters."),
) -> None:
    """Run a named audit query (run-timeline, causation-chain, handoff-latency, failures, refusals, usage, …)."""
    # Imported here, not at module level, so `agentlog --help` does not load the audit store.
    from agentlog.audit.queries import NAMED_QUERIES

    if list_ or not name:
        specs = [q.spec() for q in NAMED_QUERIES.values()]
        if as_json:
            typer.echo(json.dumps(specs))
            return
        rows = [[s["name"], ", ".join(f"{p['name']}:{p['type']}{'' if p['required'] else '?'}" for p in s["params"]),
                 s["help"]] for s in specs]
        _emit({"columns": ["query", "params", "what"], "rows": rows}, as_json=False, as_csv=as_csv,
              title="named queries")
        return
    payload = _execute({"query": name, "params": _parse_params(param)})
    _emit(payload, as_json=as_json, as_csv=as_csv, title=name)


def sql_command(
    statement: str = typer.Argument(..., help="One read-only statement: SELECT, WITH, SHOW, DESCRIBE, EXPLAIN."),
    as_json: bool = typer.Option(False, "--json", help=_FORMAT_HELP),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV with a header row."),
) -> None:
    """Run read-only SQL against the audit history (writes and DDL are refused)."""
    payload = _execute({"sql": statement})
    _emit(payload, as_json=as_json, as_csv=as_csv, title="sql")


def register(app: typer.Typer) -> None:
    app.command("query")(query_command)
    app.command("sql")(sql_command)
