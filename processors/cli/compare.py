"""``agentlog compare A B``: judge a replay against its source run, each given as an export file or a run id.

The same engine the replay processor runs (:func:`agentlog.replay.tree.compare_tree`), fed from
JSONL files (:func:`agentlog.replay.tree.stored_tree`) or from the committed log, in any mix: an
operator can re-check a verdict — or a test can pin one — offline from two exports, or name the two
runs the store holds as ``replay-test`` and the console do. Exit codes follow SPEC §7: 0 match,
1 any divergence (``diverged``, ``diverged_at_refusal``, ``what-if``), 2 the comparison could not run.

Runs of any size: neither side is loaded at once. A file is read through once for a compact record per
event and its events are read back one index at a time as the comparison walks
(:class:`agentlog.replay.compare.StoredRun`); a run id's tree is first written from the committed log to a
temporary file, event by event, and then read the same way.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import typer
from rich.console import Console

from agentlog.cli._output import print_records
from agentlog.schemas.errors import AgentlogError, ReplayError

if TYPE_CHECKING:
    from agentlog.replay import ComparisonResult, Divergence
    from agentlog.replay.compare import StoredRun
    from agentlog.streams.settings import Settings

EXIT_MATCH, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2


def _fmt(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _print_divergences(console: Console, divergences: tuple[Divergence, ...]) -> None:
    print_records(console, ["seq", "kind", "event", "path", "expected", "actual"],
                  [[str(d.at_sequence), d.kind, d.event_type or "-", d.path or "-", _fmt(d.expected), _fmt(d.actual)]
                   for d in divergences], title="divergences")


#: File names that say "this is an export": such an argument is never looked up as a run id.
_EXPORT_SUFFIXES = (".jsonl", ".json")


async def _spool_tree(settings: Settings, run_id: str, spool: IO[bytes]) -> int:
    """Writes a run and its descendants from the committed log to ``spool``, the run first, one event a line: what
    an exported run tree holds. Returns how many events it wrote.

    Each event is written as it is read (:func:`agentlog.streams.reader.iter_run`), so the spool, not memory,
    holds the run. A child run the log holds no events of is left out; the comparison then reports it
    (unchecked in the source, missing in the replay) as it does for a file without it.
    """
    from agentlog.schemas.canonical import jcs
    from agentlog.streams.reader import iter_run

    written = 0
    todo, seen = [run_id], set()
    while todo:
        current = todo.pop(0)
        if current in seen:
            continue
        seen.add(current)
        async for item in iter_run(settings, current):
            doc = item["doc"]
            spool.write(jcs(doc) + b"\n")  # as `agentlog export` writes it
            written += 1
            payload = doc.get("payload")
            child = payload.get("childRunId") if isinstance(payload, dict) else None
            if isinstance(child, str) and child not in todo:  # the child runs it names, in order
                todo.append(child)
    spool.flush()
    return written


class _Sources:
    """Resolves each side of the comparison to its run tree, read back from a file as the comparison goes; a run id
    is first written from the committed log to a temporary file. Settings are loaded only when a run id needs them."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self._settings: Settings | None = None

    def runs(self, arg: str) -> tuple[str, dict[str, StoredRun]]:
        from agentlog.replay.tree import stored_tree

        path = Path(arg)
        if path.is_file():
            root, runs = self._stack.enter_context(stored_tree(path))
            if not runs:
                raise ReplayError(f"{arg} has no events; nothing to compare")
            return root, runs
        if path.suffix in _EXPORT_SUFFIXES:
            raise ReplayError(f"{arg}: no such file; give an `agentlog export` file or a run id")
        if self._settings is None:
            from agentlog.streams.settings import load_settings

            self._settings = load_settings()
        spool = tempfile.NamedTemporaryFile(prefix="agentlog-compare-", suffix=".jsonl")  # noqa: SIM115 - the stack
        self._stack.enter_context(spool)  # closes it, once the comparison is done
        if not asyncio.run(_spool_tree(self._settings, arg, spool)):
            raise ReplayError(
                f"{arg!r} is neither an existing file nor a run in the committed log "
                f"({self._settings.topic_prefix}.log at {self._settings.kafka_bootstrap}); give an `agentlog export` "
                "file or the id of a committed run (check AGENTLOG_TOPIC_PREFIX)", code="run_not_found")
        tree: tuple[str, dict[str, StoredRun]] = self._stack.enter_context(stored_tree(Path(spool.name)))
        return tree


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
        console.print(f"[yellow]child run {hop['sourceChildRunId']} not compared: the source side holds none of "
                      "its events[/]")
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
        _print_divergences(console, result.divergences)


def compare_command(
    original: str = typer.Argument(..., help="The source run: an `agentlog export` file (JSONL) or a run id in "
                                             "the committed log."),
    replay: str = typer.Argument(..., help="The replay run: an export file or a run id, as for the source."),
    from_seq: int | None = typer.Option(
        None, "--from-seq", min=0, help="First re-executed index (default: the replay's replayOf.fromSeq, else 0)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report."),
    collect_all: bool = typer.Option(False, "--all", help="Report every divergence, not just the first."),
    strict: bool = typer.Option(
        False, "--strict", help="Compare index by index (RFC 0041 conformance) instead of per lane."
    ),
) -> None:
    """Compare a replay run with its source run (files or run ids): verdict and first divergence.

    Each side is a whole run tree: a file holds the run first, then its child runs; a run id is read
    from the committed log with the child runs its events name. Dispatches are followed into the
    child runs and the first divergence anywhere is reported with its path.
    """
    # Imported here, not at module level, so `agentlog --help` does not load the replay package.
    from agentlog.replay.tree import compare_tree

    try:
        with ExitStack() as stack:
            sources = _Sources(stack)
            o_root, o_runs = sources.runs(original)
            r_root, r_runs = sources.runs(replay)
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
