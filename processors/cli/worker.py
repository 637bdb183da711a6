"""``agentlog worker``: run every processor in one Faust worker."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def worker(
        web_port: int = typer.Option(None, help="Serve /metrics and /query on this port (default: AGENTLOG_WEB_PORT)."),
        web: bool = typer.Option(True, "--web/--no-web", help="Enable the HTTP endpoint."),
        sink: bool = typer.Option(True, "--sink/--no-sink", help="Write the audit history to ClickHouse."),
        handoff_mode: str = typer.Option(None, help="auto | check | derive (default: AGENTLOG_HANDOFF_MODE)."),
        loglevel: str = typer.Option("warning", help="Faust log level."),
        wait: float = typer.Option(300.0, help="Seconds to wait for an unreachable broker, or for enough brokers "
                                                "to create topics at the replication factor, before giving up."),
    ) -> None:
        """Sequencer, handoff, snapshots, replay comparison and the audit sink, in one process."""
        # Imported here, not at module level, so `agentlog --help` does not load Faust.
        from processors.worker.app import run_worker
        from streams.settings import load_settings

        settings = load_settings(web_port=web_port, web_enabled=web, handoff_mode=handoff_mode)
        if settings.handoff_mode not in {"auto", "check", "derive"}:
            raise typer.BadParameter("handoff mode must be auto, check or derive")
        run_worker(settings, sink=sink, loglevel=loglevel, wait_s=wait)
