"""``agentlog compare``: judge a replay against its source run from two exported logs, offline.

The same engine the replay processor runs (:func:`agentlog.replay.compare.compare_runs`), fed from
JSONL files (:func:`agentlog.replay.exported.read_jsonl`), so an operator can re-check a verdict —
or a test can pin one — without a broker. Exit codes follow SPEC §7: 0 match, 1 any divergence
(``diverged``, ``diverged_at_refusal``, ``what-if``), 2 the comparison could not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from agentlog.schemas.errors import AgentlogError

if TYPE_CHECKING:
    from agentlog.replay import ComparisonResult, Divergence

EXIT_MATCH, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2


def _fmt(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _divergence_table(divergences: tuple[Divergence, ...]) -> Table:
    table = Table("seq", "kind", "event", "path", "expected", "actual", title="divergences")
    for d in divergences:
        table.add_row(str(d.at_sequence), d.kind, d.event_type or "-", d.path or "-",
                      _fmt(d.expected), _fmt(d.actual))
    return table


#: How many reordered events the human report lists before summarising.
_REORDERED_SHOWN = 20


def _print_human(console: Console, result: ComparisonResult, unchecked: tuple[dict[str, Any], ...] = ()) -> None:
    style = {"match": "green", "what-if": "yellow"}.get(result.verdict, "red")
    line = f"verdict: [bold {style}]{result.verdict}[/]"
    if result.error_code:
        line += f"  errorCode: {result.error_code}"
    console.print(line)
    console.print(f"source run: {result.source_run_id}  fromSeq: {result.from_seq}  "
                  f"compared through sequence {result.compared_through}")
    if result.binding_diff:
        console.print("[yellow]bindings differ — not a historical replay:[/]")
        for key, diff in result.binding_diff.items():
            console.print(f"  {key}: {_fmt(diff['expected'])} → {_fmt(diff['actual'])}")
    if result.reordered:
        console.print(f"reordered across lanes (scheduling, not a divergence): {len(result.reordered)} events")
        for r in result.reordered[:_REORDERED_SHOWN]:
            where = f"{r['sourceRunId']} " if "sourceRunId" in r else ""
            console.print(f"  {where}sequence {r['atSequence']} → {r['replaySequence']}  {r['type']}  "
                          f"lane {r['lane'] or '-'}", markup=False)
        if len(result.reordered) > _REORDERED_SHOWN:
            console.print(f"  … {len(result.reordered) - _REORDERED_SHOWN} more (--json lists all)")
    for hop in unchecked:
        console.print(f"[yellow]child run {hop['sourceChildRunId']} not compared: its original log is not in "
                      "the file[/]")
    d = result.first_divergence
    if d is None:
        return
    if result.tree_path:
        trail = " → ".join([str(result.tree_path[0]["sourceRunId"])] + [
            f"{hop['worker'] or '?'} ({hop['sourceChildRunId']}, child run)" for hop in result.tree_path])
        console.print(f"in the run tree: {trail} → sequence {d.at_sequence}", markup=False)
    console.print(f"first divergence at sequence {d.at_sequence}: [bold]{d.kind}[/]"
                  f" ({d.event_type or '-'}{', node ' + d.node_id if d.node_id else ''})")
    if d.path:
        console.print(f"  path:     {d.path}")
    console.print(f"  expected: {_fmt(d.expected)}", markup=False)
    console.print(f"  actual:   {_fmt(d.actual)}", markup=False)
    if d.detail:
        console.print(f"  note:     {d.detail}", markup=False)
    if result.collect_all and len(result.divergences) > 1:
        console.print(_divergence_table(result.divergences))


def compare_command(
    original: Path = typer.Argument(..., help="JSONL of the source run's events."),
    replay: Path = typer.Argument(..., help="JSONL of the replay run's events."),
    from_seq: int | None = typer.Option(
        None, "--from-seq", min=0, help="First re-executed index (default: the replay's replayOf.fromSeq, else 0)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report."),
    collect_all: bool = typer.Option(False, "--all", help="Report every divergence, not just the first."),
    strict: bool = typer.Option(
        False, "--strict", help="Compare index by index (RFC 0041 conformance) instead of per lane."
    ),
) -> None:
    """Compare a replay run with its source run: verdict and first divergence.

    Each file may hold a whole run tree (the run first, then its child runs): dispatches are
    followed into the child runs and the first divergence anywhere is reported with its path.
    """
    # Imported here, not at module level, so `agentlog --help` does not load the replay package.
    from agentlog.replay.exported import read_jsonl
    from agentlog.replay.tree import compare_tree, group_runs

    try:
        o_root, o_runs = group_runs(read_jsonl(original))
        r_root, r_runs = group_runs(read_jsonl(replay))
        if not o_runs or not r_runs:
            from agentlog.schemas.errors import ReplayError
            raise ReplayError(f"{original if not o_runs else replay} has no events; nothing to compare")
        tree = compare_tree(o_runs, r_runs, original_root=o_root, replay_root=r_root, from_seq=from_seq,
                            collect_all=collect_all, strict=strict)
    except AgentlogError as e:
        typer.echo(f"error[{e.code}]: {e}", err=True)
        raise typer.Exit(EXIT_ERROR) from e
    result = tree.result
    if as_json:
        body = result.to_json_dict()
        if tree.unchecked:
            body["unchecked"] = [dict(hop) for hop in tree.unchecked]
        typer.echo(json.dumps(body, ensure_ascii=False, sort_keys=True))
    else:
        _print_human(Console(highlight=False), result, tree.unchecked)
    raise typer.Exit(EXIT_MATCH if result.verdict == "match" else EXIT_DIVERGED)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_command)
