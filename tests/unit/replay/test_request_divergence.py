"""A changed LLM request is the cause of a divergence, reported at its own index before its consequences.

Requests are compared as their cache key sees them (the recipe's projection, RFC 0041 §A), so transport
fields never count; the differing fields are named as a cache miss names them. In a recorded replay the
changed prompt is reported at the request (an ``output`` divergence, aspect ``request``), not at the answer
the recording then cannot give. Call bytes may differ as long as the observable result is the same
(SPEC §7): two live runs whose model answers the same to either prompt match. Under other bindings it is
the what-if's answer and the verdict stays ``what-if``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentlog.cli import app
from agentlog.replay.compare import compare_runs
from agentlog.schemas.validate import validate_payload
from tests.unit.replay.runs import as_replay, index_of, llm_run

pytest.importorskip("pydantic_ai")

from agentlog.replay.regression import record, replay_test  # noqa: E402
from tests.unit.replay.two_agents import PLANNER_INSTRUCTIONS, PROMPT_V2, support_program  # noqa: E402

PROMPT_PATH = "payload.request.messages[0].parts[0].content"  # the planner's instructions lead as a system message


def _write(path: Path, docs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return path


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("recorded") / "support.jsonl", record(support_program(), run_id="support-42"))


def test_a_changed_prompt_is_reported_at_its_request_in_a_recorded_replay(recording: Path) -> None:
    result = replay_test(recording, support_program(planner_instructions=PROMPT_V2), expect="diverged")
    d = result.first_divergence
    assert d is not None
    assert (d.at_sequence, d.kind, d.event_type, d.node_id, d.aspect) == (
        1, "output", "agent.invocation.started", "planner", "request")
    assert (d.path, d.expected, d.actual) == (PROMPT_PATH, PLANNER_INSTRUCTIONS, PROMPT_V2)
    assert PROMPT_PATH in d.detail
    assert result.miss is not None  # the consequence: the recording has no answer for the new request
    everything = compare_runs(_load(recording), list(result.docs), collect_all=True)
    assert [(x.at_sequence, x.kind, x.aspect) for x in everything.divergences][:2] == [
        (1, "output", "request"), (2, "missing", "type")]


@pytest.mark.parametrize("strict", [False, True])
def test_two_live_runs_that_differ_only_in_the_prompt_match_when_every_answer_is_the_same(strict: bool) -> None:
    original = record(support_program(), run_id="support-a")
    changed = record(support_program(planner_instructions=PROMPT_V2), run_id="support-b")
    assert compare_runs(original, changed, strict=strict, collect_all=True).verdict == "match"


def test_agentlog_compare_reports_the_changed_request_as_the_cause(tmp_path: Path, recording: Path) -> None:
    replayed = replay_test(recording, support_program(planner_instructions=PROMPT_V2), expect="diverged")
    changed = _write(tmp_path / "changed.jsonl", list(replayed.docs))
    runner = CliRunner()
    as_json = runner.invoke(app, ["compare", str(recording), str(changed), "--strict", "--json"])
    assert as_json.exit_code == 1, as_json.output
    first = json.loads(as_json.stdout)["firstDivergence"]
    assert (first["atSequence"], first["kind"], first["path"]) == (1, "output", PROMPT_PATH)
    human = runner.invoke(app, ["compare", str(recording), str(changed)])
    assert human.exit_code == 1
    assert "first divergence at sequence 1: output" in human.stdout and PROMPT_V2 in human.stdout


def test_a_what_if_under_a_new_prompt_version_lists_the_changed_request_first(recording: Path) -> None:
    result = replay_test(recording, support_program(planner_instructions=PROMPT_V2), mode="what-if",
                         bindings={"configVersion": "prompt-v2"}, expect="what-if")
    assert result.comparison.binding_diff == {"configVersion": {"expected": None, "actual": "prompt-v2"}}
    d = result.first_divergence
    assert d is not None and (d.at_sequence, d.kind, d.aspect, d.path) == (1, "output", "request", PROMPT_PATH)
    assert result.miss is None and result.asked >= 1


def test_transport_fields_of_a_request_never_count() -> None:
    original = llm_run("run-1")
    replay = as_replay(original)
    request = replay[index_of(replay, "agent.invocation.started")]["payload"]["request"]
    request.update(requestId="req-9", traceId="t-9", user="someone", metadata={"tenant": "x"}, timeoutMs=5000,
                   stream=True, headers={"x-api-key": "k"})
    assert compare_runs(original, replay, collect_all=True).verdict == "match"


def _answered_otherwise(replay: list[dict], seq: int) -> None:
    """The answer to the request at ``seq`` is another one: what a changed request leads to."""
    completed = next(d for d in replay if d["sequence"] > seq and d["type"] == "agent.invocation.completed")
    completed["payload"]["envelope"] = [{"kind": "response", "parts": [{"part_kind": "text", "content": "other"}]}]


def test_a_changed_request_alone_is_no_divergence() -> None:
    original = llm_run("run-1")
    replay = as_replay(original)
    replay[index_of(replay, "agent.invocation.started")]["payload"]["request"]["temperature"] = 0.7
    assert compare_runs(original, replay, collect_all=True).verdict == "match"


def test_a_changed_request_is_published_as_an_output_at_the_request() -> None:
    original = llm_run("run-1")
    replay = as_replay(original)
    seq = index_of(replay, "agent.invocation.started")
    replay[seq]["payload"]["request"]["temperature"] = 0.7
    _answered_otherwise(replay, seq)
    result = compare_runs(original, replay)
    d = result.first_divergence
    assert d is not None and (d.at_sequence, d.kind, d.aspect, d.path, d.expected, d.actual) == (
        seq, "output", "request", "payload.request.temperature", 0, 0.7)
    [event] = result.events
    assert event["type"] == "replay.diverged"
    assert (event["payload"]["divergenceKind"], event["payload"]["divergencePoint"]) == (
        "output", "agent.invocation.started")
    validate_payload(event["type"], event["payload"])
    assert [x.aspect for x in compare_runs(original, replay, collect_all=True).divergences][:2] == [
        "request", "result"]


def test_without_a_recorded_request_the_cache_keys_are_compared() -> None:
    original = llm_run("run-1")
    seq = index_of(original, "agent.invocation.started")
    del original[seq]["payload"]["request"]
    replay = as_replay(original)
    assert compare_runs(original, replay).verdict == "match"
    changed = copy.deepcopy(replay)
    changed[seq]["payload"]["cacheKey"] = "f" * 64
    _answered_otherwise(changed, seq)
    d = compare_runs(original, changed).first_divergence
    assert d is not None and (d.at_sequence, d.kind, d.aspect, d.path, d.actual) == (
        seq, "output", "request", "payload.cacheKey", "f" * 64)
