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
        from rich.text import Text

        from agentlog.cli._output import print_records

        console = Console()
        print_records(console, ["check", "result", "what ran"],
                      [[c.name, Text("ok", style="green") if c.ok else Text("not claimed", style="red"), c.detail]
                       for c in checks], title="capability checks (run now)")
        console.print_json(json.dumps(document))
