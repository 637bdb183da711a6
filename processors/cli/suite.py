"""``agentlog suite create`` and ``agentlog replay-suite``: recorded runs as a regression suite.

``suite create NAME --out FILE`` freezes a selection of recorded runs (by query on the audit store, by id, or
exported files) into a suite file: run ids and their heads (:mod:`agentlog.replay.suite`). ``replay-suite FILE
--program module:function`` replays every run of it with the program in ``--jobs`` processes and prints one
report; ``--json`` prints it for machines and ``--junit FILE`` writes JUnit XML (one test case per run).
Exit codes: 0 every replayed run has the expected verdict (``--expect``, default ``match``), 1 another verdict
or a program that raised, 2 the suite could not run (or was interrupted).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from agentlog.schemas.errors import AgentlogError, ReplayError

EXIT_OK, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2

suite_app = typer.Typer(help="Recorded runs as a regression suite: `suite create`, then `agentlog replay-suite`.",
                        no_args_is_help=True)


def _bindings_filter(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ReplayError(f"--binding takes key=value (e.g. configVersion=prompt-v2), not {item!r}",
                              code="bad_param")
        out[key] = value
    return out


@suite_app.command("create")
def create_command(
    name: str = typer.Argument(..., help="The suite's name (JUnit's suite name too)."),
    out: Path = typer.Option(..., "--out", help="Where to write the suite file (JSON)."),
    since: str | None = typer.Option(None, "--since", help="Runs started at or after: ISO 8601 (UTC if no offset) "
                                                           "or a span back from now (90m, 24h, 7d, 2w)."),
    until: str | None = typer.Option(None, "--until", help="Runs started before (as --since)."),
    node: str | None = typer.Option(None, "--node", help="Runs with an event at this node (agent)."),
    status: str | None = typer.Option(None, "--status", help="completed | failed | cancelled"),
    run_class: str | None = typer.Option(None, "--class", help="Runs of this class (run.started runClass)."),
    tag: str | None = typer.Option(None, "--tag", help="Runs with this tag (run.started tags)."),
    binding: list[str] = typer.Option([], "--binding", help="key=value a run binds (run.started bindings); "
                                                            "repeatable, all must hold."),
    run: list[str] = typer.Option([], "--run", help="A run id (repeatable); with filters, among these only."),
    file: list[Path] = typer.Option([], "--file", help="An exported run (agentlog export; repeatable)."),
    sample: int | None = typer.Option(None, "--sample", min=1, help="Keep this many of the selected runs, drawn "
                                                                   "with --seed."),
    seed: int = typer.Option(0, "--seed", help="The sample's seed: the same seed draws the same runs."),
    as_json: bool = typer.Option(False, "--json", help="Print the suite file's JSON."),
) -> None:
    """Freeze recorded runs into a suite file: their ids and heads, so CI replays exactly the same set."""
    from agentlog.replay.suite import Selection, Suite, SuiteRun, file_run, now_iso, point_in_time, select_runs
    from agentlog.streams.settings import load_settings

    try:
        since = point_in_time(since) if since is not None else None
        until = point_in_time(until, option="--until") if until is not None else None
        selection = Selection(since=since, until=until, node=node, status=status, run_class=run_class, tag=tag,
                              bindings=_bindings_filter(binding), run_ids=tuple(run), sample=sample, seed=seed)
        queried = bool(run) or any((since, until, node, status, run_class, tag, binding)) or not file
        runs = list(select_runs(load_settings(), selection)) if queried else []
        if run:
            missing = sorted(set(run) - {r.run_id for r in runs})
            if missing and not any((since, until, node, status, run_class, tag, binding)):
                raise ReplayError(f"the audit store holds no root run {', '.join(missing)}", code="unknown_run")
        for path in file:  # named relative to the suite file, so that a checkout can move
            found, _ = file_run(path)
            runs.append(SuiteRun(found.run_id, found.head, found.events,
                                 os.path.relpath(path.resolve(), out.resolve().parent)))
        if not runs:
            raise ReplayError("the selection holds no run: widen it (the audit store lists root runs that are not "
                              "replays)", code="empty_suite")
        suite = Suite(name=name, runs=tuple(runs), selection=selection.to_json(), created_at=now_iso())
        out.parent.mkdir(parents=True, exist_ok=True)
        suite.write(out)
    except AgentlogError as e:
        typer.echo(f"error[{e.code}]: {e}", err=True)
        raise typer.Exit(EXIT_ERROR) from e
    if as_json:
        typer.echo(json.dumps(suite.to_json(), ensure_ascii=False))
    else:
        typer.echo(f"suite {name}: {len(suite.runs)} run(s) → {out}")


def replay_suite_command(
    suite_file: Path = typer.Argument(..., help="The suite file (agentlog suite create)."),
    program: str = typer.Option(..., "--program", help="module:attribute of the program (takes the recorder; "
                                                       "reads the run's input as recorder.input)."),
    mode: str = typer.Option("recorded", "--mode", help="recorded | live | what-if"),
    tools: str = typer.Option("run", "--tools", help="run | recorded (tool calls answered from the recording)"),
    bindings: str | None = typer.Option(None, "--bindings", help="Versions laid over every recording's, as JSON or "
                                                                 "@file.json: other versions make it what-if."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Processes replaying at once."),
    expect: str = typer.Option("match", "--expect", help="The verdict every replayed run must have."),
    junit: Path | None = typer.Option(None, "--junit", help="Write JUnit XML here (one test case per run)."),
    publish: bool | None = typer.Option(None, "--publish/--no-publish", help="Publish the replay runs, tagged with "
                                        "this execution, so the worker judges them and the audit store keeps the "
                                        "history (default: when the suite's runs come from the store)."),
    code_version: str | None = typer.Option(None, "--code-version", help="The code under test, kept with the "
                                            "execution (default: the current directory's git commit)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
) -> None:
    """Replay every run of a suite with your program; one report, grouped by first divergence."""
    from rich.console import Console
    from rich.markup import escape

    from agentlog.cli.replay_test import _bindings
    from agentlog.replay.suite import RunResult, Suite, replay_suite
    from agentlog.streams.settings import load_settings

    err = Console(stderr=True, highlight=False)

    def progress(result: RunResult, done: int, total: int) -> None:  # on stderr, with --json too
        err.print(f"[{done}/{total}] {escape(result.run_id)}: {result.status}", highlight=False)

    try:
        if mode not in ("recorded", "live", "what-if"):
            raise ReplayError(f"--mode must be recorded, live or what-if, not {mode!r}", code="bad_param")
        if tools not in ("run", "recorded"):
            raise ReplayError(f"--tools must be run or recorded, not {tools!r}", code="bad_param")
        suite = Suite.read(suite_file)
        from_store = any(r.file is None for r in suite.runs)
        settings = load_settings() if from_store or publish else None
        report = replay_suite(suite, program, settings=settings, mode=mode, tools=tools,  # type: ignore[arg-type]
                              bindings=_bindings(bindings), jobs=jobs, expect=expect, progress=progress,
                              publish=settings if (from_store if publish is None else publish) else None,
                              code_version=_git_commit() if code_version is None else code_version)
    except AgentlogError as e:
        if as_json:
            typer.echo(json.dumps({"ok": False, "error": e.to_dict()}, ensure_ascii=False))
        typer.echo(f"error[{e.code}]: {e}", err=True)
        raise typer.Exit(EXIT_ERROR) from e
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_bytes(report.junit())
    if as_json:
        typer.echo(json.dumps(report.to_json(), ensure_ascii=False, sort_keys=True, default=str))
    else:
        typer.echo(report.describe())
    raise typer.Exit(EXIT_ERROR if report.interrupted else EXIT_OK if report.ok else EXIT_DIVERGED)


def _git_commit() -> str:
    """The current directory's git commit (short), or "" outside a work tree."""
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def register(app: typer.Typer) -> None:
    app.add_typer(suite_app, name="suite")
    app.command("replay-suite")(replay_suite_command)
