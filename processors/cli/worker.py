"""``agentlog worker``: run the processors, the audit sink, or both (``--role``), in one Faust worker."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def worker(
        web_port: int = typer.Option(None, help="Serve /metrics and /query on this port (default: AGENTLOG_WEB_PORT)."),
        web: bool = typer.Option(True, "--web/--no-web", help="Enable the HTTP endpoint."),
        role: str = typer.Option(None, help="all | process | sink (default: AGENTLOG_WORKER_ROLE, else all): "
                                             "process = the agents, no audit store; sink = only the audit "
                                             "sink and the HTTP endpoints; all = both "
                                             "(README \"Running the worker\")."),
        sink_process: bool = typer.Option(None, "--sink-process/--one-process",
                                          help="With --role all: run the agents in a supervised child "
                                               "process and the sink in this one (two cores; default: "
                                               "AGENTLOG_SINK_PROCESS, else one process)."),
        handoff_mode: str = typer.Option(None, help="auto | check | derive (default: AGENTLOG_HANDOFF_MODE)."),
        loglevel: str = typer.Option("warning", help="Faust log level."),
        log_format: str = typer.Option(None, help="text | json: the log on stderr (default: AGENTLOG_LOG_FORMAT, "
                                                  "else text; text is coloured only on a terminal)."),
        wait: float = typer.Option(300.0, help="Seconds to wait for an unreachable broker, or for enough brokers "
                                                "to create topics at the replication factor, before giving up."),
    ) -> None:
        """Sequencer, handoff, snapshots, replay comparison and the audit sink (by --role), in one process."""
        # Imported here, not at module level, so `agentlog --help` does not load Faust.
        from agentlog.audit.retention import parse_retention
        from agentlog.streams.redaction import load_policy
        from agentlog.streams.settings import load_settings
        from agentlog.worker.app import run_worker, worker_role

        settings = load_settings(web_port=web_port, handoff_mode=handoff_mode, worker_role=role,
                                 sink_process=sink_process, log_format=log_format)
        if settings.handoff_mode not in {"auto", "check", "derive"}:
            raise typer.BadParameter("handoff mode must be auto, check or derive")
        runs = worker_role(settings)
        if sink_process and runs != "all":
            # Only the flag is refused: AGENTLOG_SINK_PROCESS may be set for a whole deployment.
            raise typer.BadParameter(f"--sink-process splits a --role all worker in two; "
                                     f"this worker runs --role {runs} only")
        load_policy(settings)  # a bad redaction policy stops the worker before it starts anything
        parse_retention(settings.retention)  # and so does a bad AGENTLOG_RETENTION
        run_worker(settings, web=web, loglevel=loglevel, wait_s=wait)
