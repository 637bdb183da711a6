"""``agentlog replay-test``: replay a recorded run with the host's agent code and fail with the first divergence.

The program is named as ``module:attribute`` (a callable taking the recorder, see
:mod:`agentlog.replay.regression`); the recorded run is a JSONL export or a run id in the store.
Exit codes follow SPEC §7: 0 the expected verdict (``match`` unless ``--expect`` says otherwise),
1 another verdict, 2 the replay could not run. ``--record FILE`` runs the program live and writes
the recording instead (``--publish`` also sends it to the store). ``--tools recorded`` answers
each tool call with its recorded result instead of running the tool (default ``run``).
``--bindings '{"configVersion": "prompt-v2"}'`` (a JSON object, or ``@file.json``) lays versions over
the recording's, as ``bindings=`` does in Python: other versions make the verdict ``what-if``.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import typer

from agentlog.schemas.errors import AgentlogError, ReplayError

EXIT_OK, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2


def _program(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ReplayError(f"--program must be module:attribute, not {ref!r}")
    sys.path.insert(0, str(Path.cwd()))  # the project under test, as pytest's rootdir would be
    try:
        target: Any = importlib.import_module(module)
        for name in attr.split("."):
            target = getattr(target, name)
    except (ImportError, AttributeError) as e:
        raise ReplayError(f"cannot load program {ref!r}: {e}") from e
    return target


def _bindings(text: str | None) -> dict[str, Any] | None:
    """The ``--bindings`` object: JSON, or ``@path`` to a file holding it; only the versions a run binds."""
    if text is None:
        return None
    from agentlog.replay.compare import BINDING_KEYS

    where = "--bindings"
    if text.startswith("@"):
        where = text[1:]
        try:
            text = Path(where).read_text(encoding="utf-8")
        except OSError as e:
            raise ReplayError(f"--bindings {text}: cannot read {where}: {e.strerror or e}",
                              code="invalid_bindings") from e
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ReplayError(f"{where} is not JSON ({e}); give an object such as "
                          '\'{"configVersion": "prompt-v2"}\' or @file.json', code="invalid_bindings") from e
    if not isinstance(value, dict):
        raise ReplayError(f"{where} must be a JSON object of versions, not {type(value).__name__}",
                          code="invalid_bindings")
    unknown = sorted(set(value) - set(BINDING_KEYS))
    if unknown:
        raise ReplayError(f"{where}: {', '.join(unknown)} is not a version a run binds; use "
                          f"{', '.join(BINDING_KEYS)}", code="invalid_bindings")
    return value


def replay_test_command(
    source: str = typer.Argument(..., help="The recorded run: a JSONL export, or a run id in the store."),
    program: str = typer.Option(..., "--program", help="module:attribute of the program (takes the recorder)."),
    mode: str = typer.Option("recorded", "--mode", help="recorded | live | what-if"),
    tools: str = typer.Option("run", "--tools", help="run (the tools run again) | recorded (tool calls answered "
                                                      "from the recording, the tools not run)"),
    expect: str = typer.Option("match", "--expect", help="The verdict that passes (match, diverged, …)."),
    bindings: str | None = typer.Option(None, "--bindings", help='Versions laid over the recording\'s, as a JSON '
                                        'object or @file.json (\'{"configVersion": "prompt-v2"}\'): other '
                                        "versions make the verdict what-if."),
    publish: bool = typer.Option(False, "--publish", help="Publish the run to the store (settings from the env)."),
    record: Path | None = typer.Option(None, "--record", help="Run the program live; write its run here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the report (with "
                                 "--record: what was recorded)."),
) -> None:
    """Replay a recorded run with your agent code: verdict and first divergence."""
    from agentlog.replay.regression import record as record_run
    from agentlog.replay.regression import replay_test
    from agentlog.streams.settings import load_settings

    try:
        settings = load_settings() if publish or not (source.endswith((".jsonl", ".json")) or Path(source).exists()) \
            else None
        if record is not None:
            docs = record_run(_program(program), run_id=source, bindings=_bindings(bindings),
                              settings=settings if publish else None)
            record.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
            if as_json:
                typer.echo(json.dumps({"recorded": source, "events": len(docs), "out": str(record),
                                       "published": publish}, ensure_ascii=False))
            else:
                typer.echo(f"recorded run {source}: {len(docs)} events → {record}")
            raise typer.Exit(EXIT_OK)
        if mode not in ("recorded", "live", "what-if"):
            raise ReplayError(f"--mode must be recorded, live or what-if, not {mode!r}")
        if tools not in ("run", "recorded"):
            raise ReplayError(f"--tools must be run or recorded, not {tools!r}")
        overlay = _bindings(bindings)
        result = replay_test(source, _program(program), mode=mode, tools=tools,  # type: ignore[arg-type]
                             expect=None, settings=settings, publish=publish, bindings=overlay)
    except AgentlogError as e:
        typer.echo(f"error[{e.code}]: {e}", err=True)
        raise typer.Exit(EXIT_ERROR) from e
    if as_json:
        body = result.comparison.to_json_dict()
        body.update({"sourceRunId": result.source_run_id, "replayRunId": result.replay_run_id, "mode": result.mode,
                     "tools": result.tools, "served": result.served, "asked": result.asked,
                     "toolsServed": result.tools_served, "toolsRun": result.tools_run, "miss": result.miss,
                     "error": result.error, "published": result.published})
        typer.echo(json.dumps(body, ensure_ascii=False, sort_keys=True))
    else:
        typer.echo(result.describe())
    raise typer.Exit(EXIT_OK if result.verdict == expect else EXIT_DIVERGED)


def register(app: typer.Typer) -> None:
    app.command("replay-test")(replay_test_command)
