"""``agentlog replay`` (re-derive a run from an offset) and ``agentlog replay-verdicts``.

``replay`` re-reads the committed log from the nearest snapshot, refolds it with the live
fold and checks every index against the state hash its log record carries and the hash chain
(:func:`agentlog.replay.rederive.replay_run`). Exit codes follow SPEC §7: 0 match, 1 divergence,
2 the replay could not run. When the run is itself a host replay, its host-replay verdict is
shown too, so a ``what-if`` (other bound versions, MACP §3) is never mistaken for a match.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from agentlog.cli._output import Cell, print_records
from agentlog.schemas.errors import AgentlogError
from agentlog.streams.settings import load_settings

if TYPE_CHECKING:
    from agentlog.replay import Divergence, RederivationResult
    from agentlog.schemas.records import Verdict

EXIT_MATCH, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2
#: Style of a host-replay verdict; anything else (``diverged``, ``error``, a record without one) is red.
_VERDICT_STYLE: dict[str | None, str] = {"match": "green", "what-if": "yellow"}


def _fmt(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _print_divergence(console: Console, d: Divergence, *, title: str = "first divergence") -> None:
    console.print(f"{title} at sequence [bold]{d.at_sequence}[/]: [bold red]{d.kind}[/]"
                  + (f" (log offset {d.log_offset})" if d.log_offset is not None else ""))
    if d.path:
        console.print(f"  path:     {d.path}", markup=False)
    console.print(f"  - recorded: {_fmt(d.expected)}", markup=False, style="red")
    console.print(f"  + replayed: {_fmt(d.actual)}", markup=False, style="green")
    if d.detail:
        console.print(f"  note:     {d.detail}", markup=False)


def _print_host_verdict(console: Console, verdict: Verdict) -> None:
    v = verdict.get("verdict")
    style = _VERDICT_STYLE.get(v, "red")
    console.print(f"host replay of {verdict.get('sourceRunId')} (mode {verdict.get('mode')}): "
                  f"[bold {style}]{v}[/]"
                  + (f"  errorCode: {verdict['errorCode']}" if verdict.get("errorCode") else ""))
    if v == "what-if":
        console.print("[yellow]  what-if: this run bound other versions than its source (MACP §3); "
                      "its agreement is not a historical match[/]")
        for key, diff in (verdict.get("bindingDiff") or {}).items():
            console.print(f"    {key}: {_fmt(diff.get('expected'))} → {_fmt(diff.get('actual'))}", markup=False)
    if verdict.get("reordered"):
        console.print(f"  reordered across lanes (scheduling, not a divergence): {len(verdict['reordered'])} events")
    if verdict.get("path"):
        trail = " → ".join([str(verdict["path"][0].get("sourceRunId"))] + [
            f"{hop.get('worker') or '?'} ({hop.get('sourceChildRunId')}, child run)" for hop in verdict["path"]])
        at = (verdict.get("firstDivergence") or {}).get("atSequence")
        console.print(f"  in the run tree: {trail} → sequence {at}", markup=False)
    if verdict.get("detail"):
        console.print(f"  note: {verdict['detail']}", markup=False)


def _print_human(console: Console, result: RederivationResult, host: Verdict | None) -> None:
    style = "green" if result.verdict == "match" else "red"
    console.print(f"verdict: [bold {style}]{result.verdict}[/]  run: {result.run_id}  "
                  f"log partition {result.log_partition}")
    snap = (f"snapshot at sequence {result.snapshot_used}" if result.snapshot_used is not None
            else "none (refolded from sequence 0)")
    console.print(f"start: sequence {result.from_seq}   snapshot used: {snap}")
    if result.snapshot_note:
        console.print(f"  ({result.snapshot_note})", markup=False)
    console.print(f"events compared with their recorded state hashes: {result.compared}"
                  f"   last sequence: {result.last_sequence}")
    console.print(f"head hash: {result.head_hash}")
    if result.bindings:
        console.print("bound versions: " + ", ".join(f"{k}={v}" for k, v in sorted(result.bindings.items())),
                      markup=False)
    if result.first_divergence:
        _print_divergence(console, result.first_divergence)
    if result.collect_all and len(result.divergences) > 1:
        print_records(console, ["seq", "kind", "path", "recorded", "replayed", "offset"],
                      [[str(d.at_sequence), d.kind, d.path or "-", _fmt(d.expected), _fmt(d.actual),
                        str(d.log_offset)] for d in result.divergences], title="all divergences")
    if result.replay_of:
        if host is None:
            console.print(f"this run replays {result.replay_of.get('sourceRunId')}; "
                          "no host-replay verdict recorded yet")
        else:
            _print_host_verdict(console, host)


def replay_command(
    run: str = typer.Option(..., "--run", help="The run to re-derive."),
    from_offset: int | None = typer.Option(None, "--from-offset", min=0,
                                           help="Start at this offset of the run's log partition."),
    from_seq: int | None = typer.Option(None, "--from-seq", min=0, help="Start at this sequence."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report."),
    collect_all: bool = typer.Option(False, "--all", help="Report every divergence, not just the first."),
) -> None:
    """Re-derive a run from a log offset or sequence and compare with the recorded state hashes."""
    # Imported here, not at module level, so `agentlog --help` does not load the replay package.
    from agentlog.replay import replay_run_with_host_verdict

    settings = load_settings()
    console = Console(highlight=False)
    err = Console(stderr=True)
    try:
        with Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, disable=as_json or not err.is_terminal, transient=True) as bar:
            task = bar.add_task("replay", total=None)

            def progress(done: int, total: int | None) -> None:
                bar.update(task, completed=done, total=total)

            result, host = asyncio.run(replay_run_with_host_verdict(
                settings, run, from_offset=from_offset, from_seq=from_seq, collect_all=collect_all,
                progress=progress))
    except AgentlogError as e:
        if as_json:  # the error record on stdout for the script, the one line on stderr as always
            typer.echo(json.dumps({"verdict": "error", "runId": run, "error": e.to_dict()}, ensure_ascii=False))
        typer.echo(f"error[{e.code}]: {e}", err=True)
        raise typer.Exit(EXIT_ERROR) from e
    if as_json:
        body = result.to_json_dict()
        if result.replay_of:
            body["hostVerdict"] = host
        typer.echo(json.dumps(body, ensure_ascii=False, sort_keys=True))
    elif result.error is None:  # set exactly when the verdict is "error"
        _print_human(console, result, host)
    if result.error is not None:
        typer.echo(f"error[{result.error['code']}]: {result.error['message']}", err=True)
    raise typer.Exit({"match": EXIT_MATCH, "diverged": EXIT_DIVERGED}.get(result.verdict, EXIT_ERROR))


def verdicts_command(
    run: str | None = typer.Option(None, "--run", help="Only the verdict of this replay run."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array of verdict records."),
) -> None:
    """Host-replay verdicts (RFC 0041 §C) recorded on the verdicts topic."""
    # Imported here, not at module level, so `agentlog --help` does not load the replay package.
    from agentlog.replay import host_verdicts

    verdicts = asyncio.run(host_verdicts(load_settings(), run))
    if as_json:
        typer.echo(json.dumps(verdicts, ensure_ascii=False, sort_keys=True))
        return
    console = Console(highlight=False)
    if not verdicts:
        console.print("no host-replay verdicts" + (f" for {run}" if run else ""))
        return
    rows: list[list[Cell]] = []
    for v in verdicts:
        d = v.get("firstDivergence")
        where = f"{d['atSequence']} {d['kind']} {d.get('path') or ''}".strip() if d else "-"
        rows.append([v.get("replayRunId"), v.get("sourceRunId") or "-", v.get("mode") or "-",
                     Text(str(v.get("verdict")), style=_VERDICT_STYLE.get(v.get("verdict"), "red")),
                     v.get("errorCode") or "-", where, str(v.get("comparedThrough"))])
    print_records(console, ["replay run", "source run", "mode", "verdict", "errorCode", "first divergence",
                            "compared"], rows)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
    app.command("replay-verdicts")(verdicts_command)
