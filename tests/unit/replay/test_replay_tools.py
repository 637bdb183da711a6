"""Tool calls in a replay test: run again, or answered from the recording, as the caller chooses.

Per framework (pydantic-ai, OpenAI Agents SDK, LangGraph), on the checked-in recordings (``recorded/``):
with ``tools="recorded"`` a tool whose code changed is not run and the replay is a ``match``, the tool's
result being the recorded one; with ``tools="run"`` (the default) it runs and the replay diverges at
its result. A tool call the recording has no match for ends the replay with the miss diagnosis (the
nearest recorded call and the argument that differs), the tool not run. The same tool called twice
with the same arguments gets the recorded results in order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentlog.cli import app
from agentlog.replay.recorder import Recorder
from agentlog.replay.regression import record, replay_recorded, replay_test
from agentlog.schemas.errors import ReplayError
from tests.otel_corpus import script as s
from tests.otel_corpus.programs import PROGRAMS, langgraph_program
from tests.unit.replay.test_replay_frameworks import CHANGED_NOW, FRAMEWORK_MODULE, RECORDED

#: Each program's own tool (not a handoff or a route) and the arguments its model asks it with.
OWN_TOOL = {"pydantic_ai": (s.LOOKUP_TOOL, s.LOOKUP_ARGS), "openai_agents": (s.LOOKUP_TOOL, s.LOOKUP_ARGS),
            "langgraph": (s.SEARCH_TOOL, s.SEARCH_ARGS)}
RECORDED_RESULT = {"pydantic_ai": s.LOOKUP_RESULT, "openai_agents": s.LOOKUP_RESULT, "langgraph": s.SEARCH_RESULT}

#: For ``agentlog replay-test --program tests.unit.replay.test_replay_tools:changed_graph``.
changed_graph = langgraph_program(**CHANGED_NOW["langgraph"])


@pytest.fixture(params=sorted(PROGRAMS))
def name(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(FRAMEWORK_MODULE[request.param])
    return str(request.param)


def _own_tool_result(docs: Any, name: str) -> tuple[int, Any]:
    """(index, result) of the program's own tool's result in a run."""
    tool = OWN_TOOL[name][0]
    called = {d["payload"]["callId"]: d["payload"]["tool"] for d in docs if d["type"] == "agent.toolCalled"}
    return next((d["sequence"], d["payload"]["result"]) for d in docs
                if d["type"] == "agent.toolReturned" and called[d["payload"]["callId"]] == tool)


def test_a_changed_tool_served_from_the_recording_is_not_run_and_matches(name):
    ran: list[str] = []
    result = replay_test(RECORDED / f"{name}.recorded.jsonl", PROGRAMS[name](**CHANGED_NOW[name], tool_calls=ran),
                         tools="recorded")
    assert result.verdict == "match" and result.tools == "recorded"
    assert ran == []
    assert (result.tools_served, result.tools_run) == (1, 0)
    assert _own_tool_result(result.docs, name)[1] == RECORDED_RESULT[name]
    assert "tool calls answered from the recording: 1, by running the tool: 0" in result.describe()


def test_a_changed_tool_run_again_diverges_at_its_result(name):
    ran: list[str] = []
    result = replay_test(RECORDED / f"{name}.recorded.jsonl", PROGRAMS[name](**CHANGED_NOW[name], tool_calls=ran),
                         tools="run", expect="diverged")
    assert ran == [OWN_TOOL[name][0]]
    assert (result.tools_served, result.tools_run) == (0, 1)
    d = result.first_divergence
    recorded_at, recorded_result = _own_tool_result(
        [json.loads(line) for line in (RECORDED / f"{name}.recorded.jsonl").read_text().splitlines()], name)
    assert (d.at_sequence, d.path, d.expected) == (recorded_at, "payload.result", recorded_result)


def test_a_tool_call_the_recording_cannot_answer_ends_the_replay_with_a_diagnosis(name, tmp_path):
    # The recording says the tool was called with other arguments than the model (served) now asks it with.
    tool, args = OWN_TOOL[name]
    key = next(iter(args))
    docs = [json.loads(line) for line in (RECORDED / f"{name}.recorded.jsonl").read_text().splitlines()]
    for d in docs:
        if d["type"] == "agent.toolCalled" and d["payload"]["tool"] == tool:
            d["payload"]["args"] = {key: "something else"}
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs))
    ran: list[str] = []
    result = replay_test(source, PROGRAMS[name](tool_calls=ran), tools="recorded", expect="diverged")
    assert ran == []
    assert result.miss is not None and result.error is None
    assert result.miss["nearest"]["tool"] == tool and result.miss["nearest"]["args"] == {key: "something else"}
    assert [(d["path"], d["recorded"], d["requested"]) for d in result.miss["diff"]] == [
        (f"args.{key}", "something else", args[key])]
    assert result.docs[-1]["type"] == "run.failed"
    assert result.docs[-1]["payload"]["error"]["code"] == "replay_cache_miss"
    unanswered = [d for d in result.docs if d["type"] == "agent.toolCalled" and d["payload"]["tool"] == tool]
    assert [d["payload"]["args"] for d in unanswered] == [args]
    assert f"args.{key}" in result.describe()


def test_the_same_call_twice_gets_the_recorded_results_in_order():
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentlog.replay.frameworks.pydantic_ai import ReplayModel, ReplayTools

    def program(answers: list[str]) -> Any:
        def run(recorder: Recorder) -> str:
            def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                returned = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
                if len(returned) < 2:
                    return ModelResponse(parts=[ToolCallPart("roll", {"sides": 6}, f"call_{len(returned)}")])
                return ModelResponse(parts=[TextPart(" and ".join(returned))])

            agent = Agent(ReplayModel(recorder, inner=FunctionModel(scripted, model_name="dice"), node="dice"),
                          capabilities=[ReplayTools(recorder)])
            left = list(answers)

            @agent.tool_plain
            def roll(sides: int) -> str:
                return left.pop(0)

            return str(agent.run_sync("roll twice").output)

        return run

    recording = record(program(["first", "second"]), run_id="dice")
    result = replay_test(_write(recording), program(["changed", "changed"]), tools="recorded")
    assert result.tools_served == 2
    assert [d["payload"]["result"] for d in result.docs if d["type"] == "agent.toolReturned"] == ["first", "second"]
    rerun = replay_test(_write(recording), program(["changed", "changed"]), tools="run", expect="diverged")
    assert rerun.first_divergence.actual == "changed"


def _write(docs: list[dict[str, Any]]) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "recording.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def test_recorded_tools_need_a_recording_and_a_known_choice():
    with pytest.raises(ReplayError, match="pass results"):
        Recorder("r", tools="recorded")
    with pytest.raises(ReplayError, match="tools must be one of run, recorded"):
        Recorder("r", tools="replayed")  # type: ignore[arg-type]


def test_the_cli_chooses_tools_served_or_run():
    pytest.importorskip("langgraph")
    runner = CliRunner()
    args = ["replay-test", str(RECORDED / "langgraph.recorded.jsonl"), "--program",
            "tests.unit.replay.test_replay_tools:changed_graph"]
    served = runner.invoke(app, [*args, "--tools", "recorded", "--json"])
    assert served.exit_code == 0, served.output
    body = json.loads(served.output)
    assert (body["verdict"], body["tools"], body["toolsServed"], body["toolsRun"]) == ("match", "recorded", 1, 0)
    run = runner.invoke(app, [*args, "--tools", "run"])
    assert run.exit_code == 1, run.output
    assert ": diverged" in run.output
    default = runner.invoke(app, args)
    assert default.exit_code == 1, default.output
    wrong = runner.invoke(app, [*args, "--tools", "replayed"])
    assert wrong.exit_code == 2
    assert "--tools must be run or recorded" in wrong.output


def test_the_pytest_option_chooses_tools_for_every_replay_test(tmp_path):
    """``--agentlog-tools recorded`` answers the tool calls of every ``agentlog_replay`` test that does not say."""
    pytest.importorskip("langgraph")
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    test = tmp_path / "test_support.py"
    test.write_text("from tests.unit.replay.test_replay_tools import RECORDED, changed_graph\n\n\n"
                    "def test_the_graph_still_behaves(agentlog_replay):\n"
                    "    agentlog_replay(RECORDED / 'langgraph.recorded.jsonl', changed_graph)\n")

    def run(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), *options],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True,
                              text=True, timeout=300)

    served = run("--agentlog-tools", "recorded")
    assert served.returncode == 0, served.stdout[-3000:]
    ran = run()
    assert ran.returncode == 1, ran.stdout[-3000:]
    assert "expected match, got replay of langgraph-recorded" in ran.stdout and "tools run" in ran.stdout


def test_a_tool_that_delegates_to_another_agent_runs_so_that_agent_runs_again():
    """tools="recorded": the planner's lookup is served, its write_reply (which runs the writer agent) runs."""
    pytest.importorskip("pydantic_ai")
    from agentlog.replay.recorder import delegating_tools
    from tests.unit.replay import two_agents

    docs = record(two_agents.support, run_id="delegates")
    assert delegating_tools(docs) == {"write_reply"}
    result = replay_recorded("delegates", docs, two_agents.support, tools="recorded")
    assert result.verdict == "match"
    assert (result.tools_served, result.tools_run) == (1, 1)
    writer = [d for d in result.docs if d.get("nodeId") == "writer"]
    assert [d["type"] for d in writer] == ["agent.invocation.started", "agent.invocation.completed"]
    assert result.served == 4 and result.asked == 0  # the writer's model call too, from the recording
