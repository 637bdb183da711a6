"""``agentlog publish`` and ``agentlog export``: run events in and out as JSON lines.

``publish`` is for hosts that write events to a file first (or pipe them); it checks
every line against the contract before anything is sent, so the answer names the bad
lines and the reason codes instead of leaving them to surface as rejection records.
It then waits for the sequencer's decision on every line it sent (found by the
record's ingest position, which both the log record and the rejection carry), so
"accepted" means committed to the log and a sequence gap is named with its line.
``export`` writes a run back out as RunEventDocs that validate against the upstream
OpenWOP schema, unchanged, and nothing else: its output is that contract, so any consumer
of the schema reads it. The run's signed checkpoints go to a file of their own when asked
for (``--checkpoints PATH``), which ``agentlog verify --export … --checkpoints …`` reads.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypedDict

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentlog.cli._output import print_records
from agentlog.schemas.canonical import jcs, loads_strict
from agentlog.schemas.errors import AgentlogError, ConfigError, EventRejected
from agentlog.schemas.records import log_format_error
from agentlog.streams.settings import load_settings

if TYPE_CHECKING:
    from agentlog.streams.publisher import PublishSummary, Reject

#: ``--timeout``'s default: :data:`agentlog.streams.publisher.DECISION_TIMEOUT_S`, written out here so
#: ``agentlog --help`` does not import the Kafka client (a unit test keeps the two equal).
DECISION_TIMEOUT_S = 30.0


def _parse_lines(lines: list[str]) -> Iterator[dict[str, Any] | AgentlogError]:
    """One item per non-blank line: the doc, or the error that makes it unusable."""
    for line in lines:
        try:
            doc = loads_strict(line.encode("utf-8", "surrogatepass"))
        except AgentlogError as e:
            yield e
            continue
        if not isinstance(doc, dict):
            yield EventRejected("decode_error", f"line is JSON {type(doc).__name__}, not an object")
        else:
            yield doc


def _read_input(file: str) -> tuple[list[str], list[int]]:
    """Non-blank lines and their 1-based line numbers."""
    if file == "-":
        text = sys.stdin.read()
    else:
        path = Path(file)
        if not path.is_file():
            raise ConfigError(f"{file}: no such file; give a JSONL file of RunEventDocs or '-' for stdin")
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    lines, numbers = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            lines.append(line)
            numbers.append(n)
    return lines, numbers


class _RejectedLine(TypedDict):
    line: int | None  # 1-based line number in the input
    code: str
    detail: str
    stage: str  # validation, delivery or sequencer


def _lines(rejects: list[Reject], numbers: list[int]) -> list[_RejectedLine]:
    return [{"line": numbers[r.index] if 0 <= r.index < len(numbers) else None, "code": r.code,
             "detail": r.detail, "stage": r.stage} for r in rejects]


def publish(
    file: str = typer.Argument(..., help="JSONL file, one RunEventDoc per line, or '-' for stdin"),
    wire: str = typer.Option("avro", "--wire", help="ingest encoding: avro (Confluent-framed) or json"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    no_wait: bool = typer.Option(False, "--no-wait", help="only send: do not wait for the sequencer's decisions"),
    timeout: float = typer.Option(DECISION_TIMEOUT_S, "--timeout", min=0.1, metavar="S",
                                  help="give up after S seconds without a new decision (exit 2)"),
) -> None:
    """Validate and publish RunEventDocs, then wait for the sequencer; exit 1 if any line was rejected.

    Each line is checked against the contract before anything is sent; the lines sent are then
    decided by the sequencer (a running worker): accepted into the log, rejected (a sequence gap, …)
    or already committed (its eventId is in the log from an earlier send; not an error). With
    ``--no-wait`` the lines are only sent, and the answer says "sent". Exit 2 when no decision
    arrives for ``--timeout`` seconds.
    """
    # Imported here, not at module level, so `agentlog --help` does not load the Kafka client.
    from agentlog.streams.publisher import publish_docs

    if wire not in ("avro", "json"):
        raise ConfigError(f"--wire must be avro or json, not {wire!r}")
    settings = load_settings()
    lines, numbers = _read_input(file)
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json or not console.is_terminal,
        transient=True,
    ) as progress:
        sending = progress.add_task("publishing", total=len(lines))
        deciding = progress.add_task("deciding", total=None, visible=False)
        summary = asyncio.run(
            publish_docs(
                settings,
                _parse_lines(lines),
                wire=wire,  # type: ignore[arg-type]  # str, checked to be "avro" or "json" above
                on_progress=lambda done: progress.update(sending, completed=done),
                wait=not no_wait,
                timeout_s=timeout,
                on_decided=lambda done, sent: progress.update(deciding, completed=done, total=sent, visible=True),
            )
        )
    rejected = _lines(summary.rejected, numbers)
    already = _lines(summary.already_committed, numbers)
    if as_json:
        out: dict[str, Any] = {"topic": summary.topic, "decided": summary.decided, "sent": summary.sent}
        if summary.decided:
            out.update(accepted=summary.committed, alreadyCommitted=already)
        out["rejected"] = rejected
        typer.echo(json.dumps(out))
    else:
        _print_summary(summary, rejected, already)
    if rejected:
        raise typer.Exit(1)


def _print_summary(summary: PublishSummary, rejected: list[_RejectedLine], already: list[_RejectedLine]) -> None:
    out = Console()
    topic = escape(summary.topic)
    if not summary.decided:
        out.print(f"[bold]{summary.sent}[/] sent, [bold]{len(rejected)}[/] rejected → {topic} "
                  "(not waiting for the sequencer's decisions)", soft_wrap=True)
    else:
        also = f", [bold]{len(already)}[/] already committed" if already else ""
        out.print(f"[bold]{summary.committed}[/] accepted, [bold]{len(rejected)}[/] rejected{also} → {topic}",
                  soft_wrap=True)
    if rejected:
        print_records(out, ["line", "code", "detail"], [[str(r["line"]), r["code"], r["detail"]] for r in rejected])
    if already:
        lines = _ranges([r["line"] for r in already if r["line"] is not None])
        out.print(f"already committed (in the log from an earlier send): lines {lines}",
                  markup=False, highlight=False, soft_wrap=True)


def _ranges(numbers: list[int]) -> str:
    """``1-3, 7, 9-10`` for 1, 2, 3, 7, 9, 10 (ascending)."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def export(
    run: str = typer.Option(..., "--run", help="run id to export"),
    out: Path | None = typer.Option(None, "--out", help="output file (default: stdout)"),
    source: str = typer.Option("log", "--source", help="log (committed, hash-chained) or ingest (raw)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary to stderr"),
    checkpoints: Path | None = typer.Option(None, "--checkpoints", help="also write the run's signed checkpoints "
                                            "to this file, one JSON per line (--source log only); the "
                                            "export is then the stored form, which is what they sign"),
    stored: bool = typer.Option(False, "--stored", help="Write the stored form: content sealed, as the chain and "
                                "checkpoints cover it (`agentlog verify --export` checks this form, no key needed)."),
) -> None:
    """Write one run's RunEventDocs as JSONL (JCS canonical, one per line, log order), and nothing else.

    Content is opened with the run's data key (``[erased]`` once erased); ``--stored`` writes it sealed, as stored.
    Each event is written as it is read, so a run of any size exports in the memory of one event. A log record
    without stateHash (log format 1) stops the export with ``log_format_unsupported``: ``--out`` is then not
    written at all (the export goes to a ``.partial`` file renamed at the end); on stdout the lines before it
    stay. That log is exported with the version that wrote it.
    """
    # Imported here, not at module level, so `agentlog --help` does not load the Kafka client.
    from agentlog.streams.reader import iter_run, read_topic

    async def run_checkpoints() -> list[dict[str, Any]]:
        found = {jcs(v): v async for _, _, _, v in read_topic(settings, "checkpoints", key=run)
                 if v.get("runId") == run}
        return sorted(found.values(), key=lambda c: (c.get("sequence", -1), c.get("keyId", "")))

    async def write(sink: IO[bytes]) -> int:
        count = 0
        async for item in iter_run(settings, run, short_name=source, conflicts=conflicts,
                                   opened=not (stored or checkpoints is not None)):
            if source == "log" and "stateHash" not in item:
                raise log_format_error(item)  # an export of this log is made by its version
            sink.write(jcs(item["doc"]) + b"\n")
            count += 1
        return count

    if source not in ("log", "ingest"):
        raise ConfigError(f"--source must be log or ingest, not {source!r}")
    if checkpoints is not None and source != "log":
        raise ConfigError("--checkpoints needs --source log: the worker signs the committed log, not the ingest topic")
    settings = load_settings()
    conflicts: list[dict[str, Any]] = []
    partial = out.with_name(out.name + ".partial") if out is not None else None
    sink: IO[bytes]
    try:
        with (open(partial, "wb") if partial is not None else _stdout_bytes()) as sink:
            events = asyncio.run(write(sink))
        if not events:
            raise AgentlogError(f"run {run!r} has no events on {settings.topic_prefix}.{source}",
                                code="run_not_found")
    except BaseException:
        if partial is not None:
            partial.unlink(missing_ok=True)
        raise
    if partial is not None and out is not None:
        partial.replace(out)
    signed = asyncio.run(run_checkpoints()) if checkpoints is not None else []
    if checkpoints is not None and not signed:
        Console(stderr=True).print(f"[yellow]warning:[/] run {escape(run)} has no signed checkpoints yet")
    if checkpoints is not None:
        with open(checkpoints, "wb") as cp_sink:
            for record in signed:
                cp_sink.write(jcs(record) + b"\n")
    summary: dict[str, Any] = {"run": run, "source": source, "events": events, "conflicts": len(conflicts)}
    if out is not None:
        summary["out"] = str(out)
    if checkpoints is not None:
        summary.update(checkpoints=len(signed), checkpointsOut=str(checkpoints))
    if as_json:
        typer.echo(json.dumps(summary), err=True)
    elif out is not None or checkpoints is not None:
        wrote = [f"{events} events of {run} → {out or 'stdout'}"]
        if checkpoints is not None:
            wrote.append(f"{len(signed)} checkpoints → {checkpoints}")
        Console(stderr=True).print("; ".join(wrote), markup=False, highlight=False)
    if conflicts:
        Console(stderr=True).print(
            f"[yellow]warning:[/] {len(conflicts)} conflicting duplicate(s) dropped (first record kept)"
        )


class _stdout_bytes:
    """stdout's binary buffer as a context manager that flushes but never closes it."""

    def __enter__(self) -> IO[bytes]:
        return sys.stdout.buffer

    def __exit__(self, *exc: object) -> None:
        sys.stdout.buffer.flush()


def register(app: typer.Typer) -> None:
    app.command("publish")(publish)
    app.command("export")(export)
