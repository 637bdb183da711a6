"""``agentlog verify``: check a run's history against the worker's signed checkpoints.

Offline with ``--export FILE`` (what ``agentlog export`` wrote: RunEventDocs) and ``--checkpoints
FILE`` beside it (what ``agentlog export --checkpoints`` wrote: one signed checkpoint per line), or
from the committed log and the ``checkpoints`` topic. The check is
:func:`agentlog.core.checkpoint.verify_history`; exit 0 verified, 1 not verified (the first
index no valid signature vouches for, with a stable code), 2 the check could not run.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from agentlog.schemas.errors import AgentlogError, ConfigError
from agentlog.streams.settings import load_settings

EXIT_VERIFIED, EXIT_NOT_VERIFIED, EXIT_ERROR = 0, 1, 2


def verify_command(
    run: str = typer.Option(..., "--run", help="The run to verify."),
    export: Path | None = typer.Option(None, "--export", help="An `agentlog export` file (offline); "
                                       "default: the committed log and the checkpoints topic."),
    checkpoints: Path | None = typer.Option(None, "--checkpoints", help="The run's signed checkpoints, one per "
                                            "line (`agentlog export --checkpoints`); goes with --export."),
    public_key: list[Path] = typer.Option(..., "--public-key", help="A worker's ed25519.pub.pem; repeat it for "
                                          "every key that signed (key rotation)."),
    allow_unsigned_tail: bool = typer.Option(False, "--allow-unsigned-tail", help="Accept events after the last "
                                             "checkpoint (a run in progress); they are still reported."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report."),
) -> None:
    """Verify a run's hash chain, state hashes and signed checkpoints; exit 1 naming the first unverified index."""
    # Imported here, not at module level, so `agentlog --help` does not load the Kafka client.
    from agentlog.replay.verify import load_export, load_from_log, load_keys, verify_run

    settings = load_settings()
    try:
        if checkpoints is not None and export is None:
            raise ConfigError("--checkpoints goes with --export; without --export, verify reads the committed log "
                              "and the checkpoints topic")
        pems = []
        for path in public_key:
            try:
                pems.append((str(path), path.read_bytes()))
            except OSError as e:
                raise ConfigError(f"cannot read --public-key {path}: {e}") from e
        keys = load_keys(pems)
        history = (load_export(export, run, checkpoints=checkpoints) if export is not None
                   else asyncio.run(load_from_log(settings, run)))
        if not history.records:
            where = str(export) if export is not None else f"{settings.topic_prefix}.log"
            raise AgentlogError(f"run {run!r} has no events in {where}", code="run_not_found")
        result = verify_run(history, run, keys, handoff_mode=settings.handoff_mode,
                            allow_unsigned_tail=allow_unsigned_tail)
    except AgentlogError as e:
        if as_json:  # the error record on stdout for the script, the one line on stderr as always
            typer.echo(json.dumps({"runId": run, "verified": False, "error": e.to_dict()}, ensure_ascii=False))
        typer.echo(f"error[{e.code}]: {e}", err=True)
        raise typer.Exit(EXIT_ERROR) from e
    if as_json:
        typer.echo(json.dumps(result.to_json_dict(), ensure_ascii=False, sort_keys=True))
    else:
        console = Console(highlight=False, soft_wrap=True)  # hashes stay on one line, for copying
        if export is None:
            source = "committed log + checkpoints topic"
        else:
            source = f"export {export}" + (f" + checkpoints {checkpoints}" if checkpoints is not None else "")
        if result.failure is None:
            console.print(f"[bold green]verified[/]: run {escape(run)}, {result.events} events, "
                          f"{result.checkpoints_verified} checkpoints ({escape(source)})")
        else:
            f = result.failure
            where = f" (checkpoint at {f.checkpoint_sequence})" if f.checkpoint_sequence is not None else ""
            console.print(f"[bold red]NOT verified[/]: run {escape(run)}: {escape(f'error[{f.code}]')} "
                          f"first unverified index {f.at_sequence}{where}")
            console.print(f"  {f.detail}", markup=False)
        console.print(f"  head hash of events 0..{result.events - 1}: {result.head_hash}; "
                      f"last signed sequence {result.last_signed}; "
                      f"keys {', '.join(k[:16] for k in result.key_ids) or '-'}", markup=False)
        for note in result.notes:
            console.print(f"  note: {note}", markup=False)
    raise typer.Exit(EXIT_VERIFIED if result.verified else EXIT_NOT_VERIFIED)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_command)
