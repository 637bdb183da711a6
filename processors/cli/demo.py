"""``agentlog demo``: the guided tour on the real local stack (logic in :mod:`agentlog.demo.tour`)."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        keep: bool = typer.Option(True, "--keep/--stop",
                                  help="Leave the worker and broker running afterwards (default), or stop them."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of the tour."),
        stop_only: bool = typer.Option(False, "--stop-only", help="Only stop the demo worker and the local broker."),
        otel: bool = typer.Option(False, "--otel", help="Instead: a pydantic-ai run sent as OpenTelemetry spans "
                                                        "over OTLP/HTTP (needs agentlog[otel])."),
    ) -> None:
        """Bring up Kafka + worker, publish a multi-agent run, replay it three ways, query it."""
        # Imported here, not at module level, so `agentlog --help` does not load the demo's stack.
        from rich.console import Console

        from agentlog.demo.tour import run_demo, stop_demo
        from agentlog.schemas.errors import AgentlogError
        from agentlog.streams.settings import load_settings

        console = Console(quiet=as_json)
        settings = load_settings()

        def say(text: str) -> None:
            console.print(f"[dim]•[/] {text}")

        try:
            if stop_only:
                stop_demo(settings, say)
                return
            if otel:
                from agentlog.demo.otel import run_otel_demo

                summary: Any = run_otel_demo(settings, console)
            else:
                summary = run_demo(settings, console)
            if not keep:
                stop_demo(settings, say)
        except AgentlogError:
            raise  # one line, exit 2 (agentlog.cli.main)
        except KeyboardInterrupt:
            typer.echo("interrupted; the worker and broker keep running (agentlog demo --stop-only stops them)",
                       err=True)
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - the demo promises no stack traces; say what broke
            typer.echo(f"error[demo_failed]: {type(e).__name__}: {e}", err=True)
            sys.exit(2)
        if as_json:
            typer.echo(json.dumps(summary.to_dict(), default=str))
        if not summary.ok:
            sys.exit(1)
