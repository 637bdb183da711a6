"""Replay tests without a broker: each corpus program against its checked-in recording (``recorded/``).

Per framework (pydantic-ai, OpenAI Agents SDK, LangGraph), through the ``agentlog_replay`` fixture
(the pytest plugin) and ``agentlog replay-test``: the unchanged program replays its recording as a
``match``; the known-divergent recording (its tool answered otherwise) fails at that tool's result;
a tool changed now diverges at the same index; a model that now refuses is ``diverged_at_refusal``;
a what-if serves the calls whose key is unchanged and asks the model for the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlog.cli import app
from agentlog.replay.regression import ReplayTestFailed, replay_test
from tests.otel_corpus.programs import PROGRAMS
from tests.unit.replay.make_recorded import CHANGED_TOOL

RECORDED = Path(__file__).parent / "recorded"
FRAMEWORK_MODULE = {"pydantic_ai": "pydantic_ai", "openai_agents": "agents", "langgraph": "langgraph"}
CHANGED_NOW = {name: {k: "order 42: lost in transit" if k == "lookup_result" else "nothing relevant"
                      for k in knobs} for name, knobs in CHANGED_TOOL.items()}


@pytest.fixture(params=sorted(PROGRAMS))
def name(request: pytest.FixtureRequest) -> str:
    pytest.importorskip(FRAMEWORK_MODULE[request.param])
    return str(request.param)


def _docs(name: str, kind: str = "recorded") -> list[dict]:
    return [json.loads(line) for line in (RECORDED / f"{name}.{kind}.jsonl").read_text().splitlines()]


def _tool_result_index(docs: list[dict]) -> int:
    """The index of the first tool result the program's own tool produced (not a handoff's or a route's)."""
    called = {d["payload"]["callId"]: d["payload"]["tool"] for d in docs if d["type"] == "agent.toolCalled"}
    return next(d["sequence"] for d in docs if d["type"] == "agent.toolReturned"
                and called[d["payload"]["callId"]] in ("lookup_order", "search_papers"))


def test_the_unchanged_program_replays_its_recording(name, agentlog_replay):
    agentlog_replay(RECORDED / f"{name}.recorded.jsonl", PROGRAMS[name]())


def test_the_known_divergent_recording_fails_at_the_tool_result(name, agentlog_replay):
    with pytest.raises(ReplayTestFailed) as failed:
        agentlog_replay(RECORDED / f"{name}.divergent.jsonl", PROGRAMS[name]())
    result = failed.value.result
    d = result.first_divergence
    assert (result.verdict, d.kind, d.path, d.event_type) == ("diverged", "output", "payload.result",
                                                              "agent.toolReturned")
    assert d.at_sequence == _tool_result_index(_docs(name, "divergent"))
    assert d.expected == next(iter(CHANGED_TOOL[name].values()))
    assert failed.value.code == "replay_diverged"
    assert f"first divergence at index {d.at_sequence}: output" in str(failed.value)
    assert result.miss is not None  # the model call after the changed result has no recorded answer


def test_a_changed_tool_diverges_at_its_result(name):
    result = replay_test(RECORDED / f"{name}.recorded.jsonl", PROGRAMS[name](**CHANGED_NOW[name]),
                         expect="diverged")
    d = result.first_divergence
    assert (d.at_sequence, d.kind, d.path) == (_tool_result_index(_docs(name)), "output", "payload.result")
    assert d.actual == next(iter(CHANGED_NOW[name].values()))


def test_a_model_that_now_refuses_is_diverged_at_refusal(name):
    result = replay_test(RECORDED / f"{name}.recorded.jsonl", PROGRAMS[name](refuse=True), mode="live",
                         expect="diverged_at_refusal")
    d = result.first_divergence
    assert (d.at_sequence, d.kind, d.expected, d.actual) == (2, "refusal", "valid", "refusal")
    assert result.comparison.error_code == "replay_diverged_at_refusal"
    assert [e["type"] for e in result.comparison.events] == ["replay.divergedAtRefusal"]


def test_a_what_if_serves_unchanged_calls_and_asks_the_model_for_the_rest(name):
    result = replay_test(RECORDED / f"{name}.recorded.jsonl", PROGRAMS[name](**CHANGED_NOW[name]),
                         mode="what-if", bindings={"configVersion": "tool-v2"}, expect="what-if")
    recorded_calls = sum(d["type"] == "agent.invocation.started" for d in _docs(name))
    before = sum(d["type"] == "agent.invocation.started" and d["sequence"] < _tool_result_index(_docs(name))
                 for d in _docs(name))
    assert (result.served, result.asked) == (before, recorded_calls - before)
    assert result.comparison.binding_diff == {"configVersion": {"expected": None, "actual": "tool-v2"}}
    assert result.first_divergence.at_sequence == _tool_result_index(_docs(name))
    assert result.miss is None and result.error is None


def test_a_call_the_recording_cannot_answer_says_why():
    pytest.importorskip("pydantic_ai")
    result = replay_test(RECORDED / "pydantic_ai.recorded.jsonl", PROGRAMS["pydantic_ai"](instructions="Be brief."),
                         expect="diverged")
    assert result.served == 0 and result.miss is not None
    assert result.miss["diff"][0]["path"] == "request.messages[0].parts[0].content"
    assert "Be brief." in result.describe()


def test_the_cli_replays_a_recording_and_exits_by_verdict():
    pytest.importorskip("langgraph")
    runner = CliRunner()
    program = "tests.otel_corpus.programs:research_graph"
    ok = runner.invoke(app, ["replay-test", str(RECORDED / "langgraph.recorded.jsonl"), "--program", program])
    assert ok.exit_code == 0, ok.output
    assert ": match" in ok.output
    bad = runner.invoke(app, ["replay-test", str(RECORDED / "langgraph.divergent.jsonl"), "--program", program,
                              "--json"])
    assert bad.exit_code == 1, bad.output
    body = json.loads(bad.output)
    assert body["verdict"] == "diverged"
    assert body["firstDivergence"]["atSequence"] == _tool_result_index(_docs("langgraph", "divergent"))
    assert body["miss"]["reason"]
    expected = runner.invoke(app, ["replay-test", str(RECORDED / "langgraph.divergent.jsonl"), "--program",
                                   program, "--expect", "diverged"])
    assert expected.exit_code == 0, expected.output
