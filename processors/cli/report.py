"""``agentlog report --run R``: the run tree's agent graph, handoff timeline and causation graph as one HTML file.

The records come from the audit history (:func:`agentlog.audit.server.fetch_report_records`:
the store directly, or through the worker that owns it; the agent graph,
:func:`agentlog.audit.agents.agent_graph`, through the same route); the page is
:func:`agentlog.audit.report.render_report`. This module only writes the file and says what it wrote.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        run: str = typer.Option(..., "--run", help="The run to draw."),
        out: Path = typer.Option(None, "--out", help="Write the HTML here (default: report-<run>.html)."),
        as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
    ) -> None:
        """A self-contained HTML page: the run tree's agents, handoff timeline and causation graph."""
        # Imported here, not at module level, so `agentlog --help` does not load the audit store.
        from agentlog.audit.agents import agent_graph
        from agentlog.audit.report import render_report
        from agentlog.audit.server import answer_query, fetch_report_records
        from agentlog.core.sealing import sealed_paths
        from agentlog.streams.keyring import load_keyring
        from agentlog.streams.settings import load_settings

        settings = load_settings()
        events, transitions, violations, head, source = fetch_report_records(settings, run)
        if any(sealed_paths(e) for e in events):  # the store holds content sealed: opened with the run's key
            keyring = asyncio.run(load_keyring(settings, [run]))
            events = [keyring.open(e) for e in events]
        agents = agent_graph(lambda sql: answer_query(settings, {"sql": sql})["rows"], run)
        target = out or Path(f"report-{run}.html")
        target.write_text(render_report(events, transitions, violations, run_id=run, head_hash=head or None,
                                        agents=agents), "utf-8")
        summary = {"out": str(target), "runId": run, "events": len(events), "transitions": len(transitions),
                   "violations": len(violations), "headHash": head, "source": source}
        if as_json:
            typer.echo(json.dumps(summary))
        else:
            typer.echo(f"wrote {target} ({len(events)} events, {len(transitions)} transitions, "
                       f"{len(violations)} violations; from {source})")
