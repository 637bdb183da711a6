"""Replay suites of multi-agent programs in pydantic-ai, the OpenAI Agents SDK and LangGraph (no broker).

Per framework, 21 runs of the support desk (:mod:`tests.unit.replay.desk`: triage looks the order up and hands
refunds on to a refunds agent) are recorded live with varied inputs and exported, then replayed as one suite: the
unchanged program matches every run; a changed prompt, a changed tool result and a changed routing each diverge
exactly the runs they touch, in one group at the event where the change first shows.

Expectations come from the desk's script, not from the replay: inputs ``i % 3 == 0`` ask for a refund (orders 100,
103, … 118); the changed routing sends refunds of orders from 110 on (112, 115, 118) to the escalation agent. A refund
run is ``run.started`` (0), triage's lookup call (1, 2), the lookup (3, 4), triage's transfer call (5, 6), the
transfer (7, 8), then the agent handed to; pydantic-ai's triage closes its turn with one more call (9, 10) before
the program hands the question on.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from agentlog.replay.regression import record
from agentlog.replay.suite import Suite, SuiteReport, file_run, replay_suite
from tests.unit.replay import desk

junitparser = pytest.importorskip("junitparser")

#: Framework → the module its suite program needs.
FRAMEWORKS = {"pydantic_ai": "pydantic_ai", "openai_agents": "agents", "langgraph": "langgraph"}
N = 21
RUNS = [f"desk-{i}" for i in range(N)]
REFUNDS = [f"desk-{i}" for i in range(0, N, 3)]
REROUTED = ["desk-12", "desk-15", "desk-18"]
#: Where a changed refund tool shows: the refund's result (run.started, triage's two calls, the lookup, the
#: transfer: 9 events; pydantic-ai's triage call after the transfer: 2 more; the refunds agent's call: 2 more).
REFUND_RESULT_AT = {"pydantic_ai": 14, "openai_agents": 12, "langgraph": 12}
#: Where a changed routing shows (kind, event type, node, path, index): pydantic-ai's transfer tool and the SDK's
#: handoff say where they sent the customer, at the transfer's result; LangGraph's router says nothing, so the run
#: first differs where the refunds agent's first call was.
ROUTING_SHOWS = {"pydantic_ai": ("output", "agent.toolReturned", desk.TRIAGE, "payload.result", 8),
                 "openai_agents": ("output", "agent.toolReturned", desk.TRIAGE, "payload.result", 8),
                 "langgraph": ("missing", "agent.invocation.started", desk.REFUNDS, None, 9)}
#: What the transfer's result reads, recorded and under the changed routing.
TRANSFER_RESULT = {"pydantic_ai": ("Transferred to refunds", "Transferred to escalation"),
                   "openai_agents": ('{"assistant": "refunds"}', '{"assistant": "escalation"}')}


@pytest.fixture(scope="module", params=sorted(FRAMEWORKS))
def framework(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The framework and its suite file: N recorded runs of its desk program, exported."""
    pytest.importorskip(FRAMEWORKS[request.param])
    module = importlib.import_module(f"tests.unit.replay.suite_desk_{request.param}")
    out = tmp_path_factory.mktemp(f"desk-{request.param}")
    runs = []
    for run_id, asked in zip(RUNS, desk.inputs(N), strict=True):
        path = out / f"{run_id}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in record(module.desk, run_id=run_id, input=asked)))
        runs.append(file_run(path)[0])
    Suite(f"desk-{request.param}", tuple(runs)).write(out / "suite.json")
    return request.param, out / "suite.json"


def _replay(framework: tuple[str, Path], variant: str, *, jobs: int = 1) -> SuiteReport:
    name, suite = framework
    return replay_suite(Suite.read(suite), f"tests.unit.replay.suite_desk_{name}:{variant}", jobs=jobs)


def _only_group(report: SuiteReport, runs: list[str]) -> dict:
    assert sorted(r.run_id for r in report.failed) == sorted(runs)
    assert report.counts == {"diverged": len(runs), **({"match": N - len(runs)} if len(runs) < N else {})}
    [group] = report.groups()
    assert sorted(group["runs"]) == sorted(runs)
    return group


def test_varied_inputs_record_varied_runs_and_the_unchanged_program_matches_them_all(framework):
    suite = Suite.read(framework[1])
    assert len({r.head for r in suite.runs}) == N
    events = {r.run_id: r.events for r in suite.runs}
    assert {events[r] for r in REFUNDS} and min(events[r] for r in REFUNDS) > max(
        events[r] for r in RUNS if r not in REFUNDS)  # a refund hands on to a second agent
    report = _replay(framework, "desk", jobs=2)
    assert report.counts == {"match": N} and report.ok and report.groups() == []
    assert [r.run_id for r in report.results] == RUNS


def test_a_changed_prompt_diverges_every_run_at_triages_first_request(framework):
    report = _replay(framework, "desk_prompt_v2")
    group = _only_group(report, RUNS)
    assert (group["kind"], group["eventType"], group["nodeId"], group["path"]) == (
        "output", "agent.invocation.started", desk.TRIAGE, "payload.request.messages[0].parts[0].content")
    assert {r.divergence["atSequence"] for r in report.failed} == {1}
    example = group["example"]["firstDivergence"]
    assert (example["expected"], example["actual"]) == (desk.INSTRUCTIONS, desk.INSTRUCTIONS_V2)


def test_a_changed_tool_result_diverges_exactly_the_refunds_at_that_result(framework):
    report = _replay(framework, "desk_refund_v2")
    group = _only_group(report, REFUNDS)
    assert (group["kind"], group["eventType"], group["nodeId"], group["path"]) == (
        "output", "agent.toolReturned", desk.REFUNDS, "payload.result")
    assert {r.divergence["atSequence"] for r in report.failed} == {REFUND_RESULT_AT[framework[0]]}
    assert desk.REFUND_NOTE_V2 in group["example"]["firstDivergence"]["actual"]


def test_a_changed_routing_diverges_exactly_the_rerouted_runs_where_the_routing_shows(framework, tmp_path):
    name = framework[0]
    report = _replay(framework, "desk_routing_v2")
    group = _only_group(report, REROUTED)
    kind, event_type, node, path, at = ROUTING_SHOWS[name]
    assert (group["kind"], group["eventType"], group["nodeId"], group["path"]) == (kind, event_type, node, path)
    assert {r.divergence["atSequence"] for r in report.failed} == {at}
    example = group["example"]["firstDivergence"]
    if name in TRANSFER_RESULT:
        assert (example["expected"], example["actual"]) == TRANSFER_RESULT[name]
    else:  # then the escalation agent's call, which the recording cannot answer
        assert "no llm call at node 'escalation'" in group["example"]["description"]

    junit = tmp_path / "junit.xml"
    junit.write_bytes(report.junit())
    [suite] = list(junitparser.JUnitXml.fromfile(str(junit)))
    assert (suite.name, suite.tests, suite.failures, suite.errors, suite.skipped) == (
        f"desk-{name}", N, len(REROUTED), 0, 0)
    failing = {case.name for case in suite if list(case.result)}
    assert failing == set(REROUTED)
    for case in suite:
        for result in case.result:
            assert isinstance(result, junitparser.Failure) and result.message == "expected match, got diverged"
