"""``agentlog erase``: erase a data subject's content (or a run's and its children's) by deleting their keys.

What it does, step by step, is :mod:`agentlog.streams.erasure`. Exit 0 when erased (or already erased: it says
so), 2 when nothing could be erased (an unknown subject or run changes nothing) or the erase could not finish
(run it again: every step is idempotent and the receipt is written once).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import socket

import typer
from rich.console import Console
from rich.markup import escape

from agentlog.schemas.errors import AgentlogError, ConfigError
from agentlog.streams.settings import load_settings

EXIT_ERASED, EXIT_ERROR = 0, 2


def erase_command(
    subject: str | None = typer.Option(None, "--subject", help="The data subject (run.started payload.subjectId; "
                                       "a run without one is its own subject)."),
    run: str | None = typer.Option(None, "--run", help="One run, with every run it started."),
    by: str | None = typer.Option(None, "--by", help="Who erases, for the receipt (default: user@host)."),
    wait_s: float = typer.Option(120.0, "--wait", help="Seconds to wait for the keyring's compaction."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (with the signed receipt)."),
) -> None:
    """Erase a subject's content everywhere (keys deleted, ingest truncated) and write a signed receipt."""
    from agentlog.core.checkpoint import key_id, load_private_key
    from agentlog.streams.erasure import erase

    settings = load_settings()
    err = Console(stderr=True, highlight=False)
    try:
        if (subject is None) == (run is None):
            raise ConfigError("name exactly one of --subject and --run")
        path = settings.signing_key_path
        try:
            signer = load_private_key(path.read_bytes(), where=str(path))
        except OSError as e:
            raise ConfigError(f"cannot read the worker's signing key {path} ({e}): receipts are signed with it; "
                              "run erase where the worker's key is, or set AGENTLOG_SIGNING_KEY_FILE") from e
        result = asyncio.run(erase(
            settings, subject=subject, run=run, by=by or f"{getpass.getuser()}@{socket.gethostname()}",
            signer=signer, signer_kid=key_id(signer), wait_s=wait_s,
            progress=(lambda line: None) if as_json else (lambda line: err.print(escape(line)))))
    except AgentlogError as e:
        if as_json:
            typer.echo(json.dumps({"erased": False, "error": e.to_dict()}, ensure_ascii=False))
        typer.echo(f"error[{e.code}]: {e}", err=True)
        raise typer.Exit(EXIT_ERROR) from e
    if as_json:
        typer.echo(json.dumps({"erased": True, **result.to_json(), "receipt": result.receipt}, ensure_ascii=False,
                              sort_keys=True))
        raise typer.Exit(EXIT_ERASED)
    out = Console(highlight=False, soft_wrap=True)
    what = f"subject {subject}" if subject is not None else f"run {run}"
    if result.already:
        out.print(f"already erased: {escape(what)} ({len(result.runs)} run(s)); nothing changed, receipt "
                  f"{result.receipt_id}")
        raise typer.Exit(EXIT_ERASED)
    total = sum(result.events.values())
    out.print(f"[bold]erased[/] {escape(what)}: {len(result.runs)} run(s), {total} event(s) in "
              f"{result.seconds:.1f} s; receipt {result.receipt_id}")
    for r in result.runs:
        out.print(f"  {escape(r)}: {result.events.get(r, 0)} event(s)", markup=True)
    raise typer.Exit(EXIT_ERASED)


def register(app: typer.Typer) -> None:
    app.command("erase")(erase_command)
