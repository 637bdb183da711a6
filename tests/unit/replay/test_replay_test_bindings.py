"""``agentlog replay-test --bindings``: the what-if verdict from the command line, as ``bindings=`` gives it in Python.

The recording is the two-agent program's (:mod:`tests.unit.replay.two_agents`); the program replayed is the
same with the planner's prompt changed. Without bindings that is a plain ``diverged``; bound under another
config version it is a ``what-if`` whose first divergence is the changed request. Bad bindings are one
``error[invalid_bindings]`` line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlog.cli import app

pytest.importorskip("pydantic_ai")

from agentlog.replay.regression import record  # noqa: E402
from tests.unit.replay.two_agents import support_program  # noqa: E402

CHANGED = "tests.unit.replay.two_agents:support_prompt_v2"


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("recorded") / "support.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in record(support_program(), run_id="support-42")),
                    encoding="utf-8")
    return path


def _replay(recording: Path, *args: str):
    return CliRunner().invoke(app, ["replay-test", str(recording), "--program", CHANGED, "--mode", "what-if",
                                    "--expect", "what-if", *args])


def test_bindings_make_the_what_if_verdict_reachable(recording: Path) -> None:
    done = _replay(recording, "--bindings", '{"configVersion": "prompt-v2"}', "--json")
    assert done.exit_code == 0, done.output
    body = json.loads(done.stdout)
    assert body["verdict"] == "what-if"
    assert body["bindingDiff"] == {"configVersion": {"expected": None, "actual": "prompt-v2"}}
    assert (body["firstDivergence"]["atSequence"], body["firstDivergence"]["kind"]) == (1, "output")


def test_bindings_from_a_file(recording: Path, tmp_path: Path) -> None:
    bindings = tmp_path / "bindings.json"
    bindings.write_text('{"configVersion": "prompt-v2", "policyVersion": "p-3"}', encoding="utf-8")
    done = _replay(recording, "--bindings", f"@{bindings}")
    assert done.exit_code == 0, done.output
    assert ": what-if" in done.stdout and "what-if: policyVersion" in done.stdout


def test_without_bindings_a_changed_prompt_answered_the_same_is_a_match(recording: Path) -> None:
    """Call bytes may differ as long as the observable result is the same (SPEC §7)."""
    done = CliRunner().invoke(app, ["replay-test", str(recording), "--program", CHANGED, "--mode", "what-if", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["verdict"] == "match"


@pytest.mark.parametrize(("given", "says"), [
    ('{"configVersion": prompt-v2}', "is not JSON"),
    ('["prompt-v2"]', "must be a JSON object"),
    ('{"configversion": "prompt-v2"}', "configversion is not a version a run binds"),
    ("@no-such-bindings.json", "cannot read no-such-bindings.json"),
])
def test_bad_bindings_are_one_error_line_and_exit_2(recording: Path, given: str, says: str) -> None:
    done = _replay(recording, "--bindings", given)
    assert done.exit_code == 2, done.output
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error[invalid_bindings]: ") and says in line
    assert done.stdout == ""
