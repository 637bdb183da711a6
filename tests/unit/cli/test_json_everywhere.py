"""Every ``agentlog`` command that prints results has ``--json``: one JSON document on stdout.

The commands are read from the typer app itself, so a command added without ``--json`` fails here
unless it joins the allow-list with the reason it prints nothing to parse. Several commands then run
with ``--json`` (no broker) and their stdout parses as one document; an error stays one
``error[code]: ...`` line on stderr with exit 2.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from agentlog.audit.migrations import migrate
from agentlog.audit.store import open_store
from agentlog.cli import app
from tests.unit.audit.data import audit_batches

GOLDEN = Path(__file__).resolve().parents[1] / "replay" / "golden"

#: Commands without ``--json``, each because it prints nothing a script would parse.
WITHOUT_JSON = {
    "worker",  # a long-running process: its output is log lines, its results go to Kafka and the store
}


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    subcommands = getattr(command, "commands", None)
    if subcommands:
        for name, sub in subcommands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def test_every_command_that_prints_results_has_json() -> None:
    commands = dict(_commands(typer.main.get_command(app)))
    assert {"compare", "query", "infra status", "worker"} <= commands.keys()  # the walk reaches groups too
    missing = sorted(name for name, command in commands.items()
                     if name not in WITHOUT_JSON and not any("--json" in p.opts for p in command.params))
    assert missing == []
    assert commands.keys() >= WITHOUT_JSON  # the allow-list names real commands only


def _json(args: list[str], *, exit_code: int = 0, env: dict[str, str] | None = None) -> Any:
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == exit_code, (args, result.output, result.exception)
    return json.loads(result.stdout)  # the whole of stdout: one document, nothing around it


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    url = f"chdb://{tmp_path / 'ch'}"
    with open_store(url) as store:
        migrate(store)
        for kind, records in audit_batches().items():
            store.insert_records(kind, records)
    return {"AGENTLOG_CLICKHOUSE_URL": url, "AGENTLOG_HOME": str(tmp_path / "home")}


def test_commands_print_one_json_document(tmp_path: Path, store_env: dict[str, str]) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"provider": "p", "model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    assert set(_json(["cache-key", str(request), "--json"])) == {"recipe", "key"}
    assert "multiAgent" in json.dumps(_json(["capabilities", "--json"]))
    assert _json(["compare", str(GOLDEN / "match.original.jsonl"), str(GOLDEN / "match.replay.jsonl"),
                  "--json"])["verdict"] == "match"
    assert {q["name"] for q in _json(["query", "--list", "--json"])} >= {"run-timeline", "runs"}
    run_1 = [r for r in audit_batches()["committed"] if r["doc"]["runId"] == "run-1"]
    timeline = _json(["query", "run-timeline", "-p", "run_id=run-1", "--json"], env=store_env)
    assert [row[timeline["columns"].index("hash")] for row in timeline["rows"]] == [r["hash"] for r in run_1]
    assert _json(["sql", "SELECT 1 AS one", "--json"], env=store_env) == {"columns": ["one"], "rows": [[1]]}


def idle(recorder: Any) -> None:
    """A program for ``agentlog replay-test --record``: it asks nothing, so its run only starts and ends."""


def test_replay_test_record_prints_what_it_recorded_as_json(tmp_path: Path) -> None:
    out = tmp_path / "idle.jsonl"
    body = _json(["replay-test", "idle-run", "--program", f"{__name__}:idle", "--record", str(out), "--json"])
    written = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    assert body == {"recorded": "idle-run", "events": len(written), "out": str(out), "published": False}
    assert written and {d["runId"] for d in written} == {"idle-run"}


def test_an_error_under_json_is_one_line_on_stderr_with_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "absent.jsonl"),
                                      str(GOLDEN / "match.replay.jsonl"), "--json"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error[replay_error]: ") and "absent.jsonl" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
