"""``agentlog capabilities``: the OpenWOP discovery block, each flag proven by a check run now.

The checks and the document are :mod:`agentlog.capabilities`; this module only prints them.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def capabilities(
        as_json: bool = typer.Option(False, "--json", help="Print only the discovery block as JSON."),
        vectors: Path = typer.Option(None, "--vectors", help="Cache-key vector file (default: the copy bundled "
                                                             "in schemas/upstream)."),
    ) -> None:
        """The OpenWOP multiAgent capability block, each flag proven by a check run now."""
        # Imported here, not at module level, so `agentlog --help` does not run the replay/fold imports.
        from agentlog.capabilities import capability_document, run_checks

        checks = run_checks(vectors)
        document = capability_document(checks)
        if as_json:
            typer.echo(json.dumps(document, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        console = Console()
        table = Table(title="capability checks (run now)")
        table.add_column("check")
        table.add_column("result")
        table.add_column("what ran")
        for c in checks:
            table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]not claimed[/]", c.detail)
        console.print(table)
        console.print_json(json.dumps(document))
