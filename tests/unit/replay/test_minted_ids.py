"""Ids a framework mints never count: pydantic-ai's random tool-call ids, wherever a payload carries them.

Two live runs of the two-agent program (:mod:`tests.unit.replay.two_agents`) differ in every tool-call id:
in the planner's response envelopes, the tool events' ``callId`` and the later requests' messages. The
comparison pairs the ids the two runs minted and reads the replay's payloads with the original's ids, so
such runs match; the pairing is still a pairing, so an id that stands for another call diverges.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from agentlog.replay.compare import compare_runs  # noqa: E402
from agentlog.replay.regression import record, replay_test  # noqa: E402
from tests.unit.replay.two_agents import support_program  # noqa: E402


def _envelope_ids(docs: list[dict]) -> list[str]:
    return [part["id"] for d in docs if d["type"] == "agent.invocation.completed"
            for part in d["payload"]["envelope"][0]["parts"] if "id" in part]


def _at(docs: list[dict], type_: str, nth: int = 0) -> int:
    return [d["sequence"] for d in docs if d["type"] == type_][nth]


@pytest.fixture(scope="module")
def two_live_runs() -> tuple[list[dict], list[dict]]:
    program = support_program()
    return record(program, run_id="support-a"), record(program, run_id="support-b")


def test_the_framework_mints_other_ids_in_each_run(two_live_runs) -> None:
    # What the tests below rely on: without the pairing, the runs would differ.
    a, b = two_live_runs
    assert len(_envelope_ids(a)) == 2 and set(_envelope_ids(a)).isdisjoint(_envelope_ids(b))
    later_request = json.dumps(a[_at(a, "agent.invocation.started", 1)]["payload"]["request"])
    assert _envelope_ids(a)[0] in later_request


@pytest.mark.parametrize("strict", [False, True])
def test_two_live_runs_that_differ_only_in_minted_ids_match(two_live_runs, strict: bool) -> None:
    a, b = two_live_runs
    result = compare_runs(a, b, collect_all=True, strict=strict)
    assert (result.verdict, result.divergences) == ("match", ())


def test_an_output_tool_id_only_a_response_envelope_carries_is_paired_too() -> None:
    program = support_program(structured_writer=True)
    a, b = record(program, run_id="support-a"), record(program, run_id="support-b")
    writer_ids = [_envelope_ids([d for d in run if d.get("nodeId") == "writer"]) for run in (a, b)]
    assert len(writer_ids[0]) == 1 and writer_ids[0] != writer_ids[1]  # and no tool event names them
    assert compare_runs(a, b, collect_all=True).verdict == "match"


def test_a_live_replay_test_of_the_two_agents_matches(two_live_runs, tmp_path: Path) -> None:
    a, _ = two_live_runs
    source = tmp_path / "support.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in a), encoding="utf-8")
    result = replay_test(source, support_program(), mode="live")
    assert (result.verdict, result.asked, result.served) == ("match", 4, 0)


def test_an_id_that_stands_for_another_call_still_diverges(two_live_runs) -> None:
    a, b = two_live_runs
    b = copy.deepcopy(b)
    delegating = _at(b, "agent.invocation.completed", 1)  # the planner's write_reply call
    lookup_id = b[_at(b, "agent.invocation.completed", 0)]["payload"]["envelope"][0]["parts"][0]["id"]
    b[delegating]["payload"]["envelope"][0]["parts"][0]["id"] = lookup_id
    d = compare_runs(a, b).first_divergence
    assert d is not None and (d.at_sequence, d.kind, d.path) == (delegating, "output",
                                                                 "payload.envelope[0].parts[0].id")
    assert (d.expected, d.actual) == (_envelope_ids(a)[1], lookup_id)
    assert d.detail == f"the replay's minted id {lookup_id} stands for the original's {_envelope_ids(a)[0]}"
