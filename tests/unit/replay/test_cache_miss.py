"""Why did my request miss? ResultCache.diagnose and the MockReplaySession error that carries it.

The expected diffs are written from the recorded run (``runs.llm_run``: the planner's LLM call at
attempt 0; the research tool call made at attempt 0 with no result, retried and returned at
attempt 1) and from the change each test makes to the request.
"""

from __future__ import annotations

import copy

import pytest

from agentlog.core.result_cache import ReplayCacheMiss, ResultCache, args_digest, tool_cache_key
from agentlog.replay.mock import MockReplaySession
from agentlog.schemas.cachekey import cache_key
from agentlog.schemas.canonical import jcs, sha256_hex
from tests.unit.replay.runs import REQUEST, TOOL_ARGS, llm_run

RECORDED_KEY = sha256_hex(jcs(REQUEST))  # the key llm_run records (not the recipe's)


@pytest.fixture
def session() -> MockReplaySession:
    return MockReplaySession(ResultCache.from_events(llm_run("run-1")), "run-1")


def test_llm_miss_names_the_recorded_call_and_the_field_that_changed_the_key(session: MockReplaySession) -> None:
    asked = copy.deepcopy(REQUEST)
    asked["temperature"] = 0.7
    asked["messages"][0]["content"] = "Which Q3 incident was worst?"
    with pytest.raises(ReplayCacheMiss) as caught:
        session.recorded_llm("planner", 0, cache_key(asked), request=asked)
    diagnosis = caught.value.diagnosis
    assert caught.value.code == "replay_cache_miss"
    assert diagnosis["nearest"]["cacheKey"] == RECORDED_KEY and diagnosis["nearest"]["kind"] == "llm"
    changed = {d["path"].rsplit(".", 1)[-1]: (d["recorded"], d["requested"]) for d in diagnosis["diff"]}
    assert changed == {"temperature": (0, 0.7),
                       "content": ("Which Q4 incident was worst?", "Which Q3 incident was worst?")}
    assert "temperature" in str(caught.value)


def test_fields_outside_the_key_projection_are_not_blamed(session: MockReplaySession) -> None:
    # A trace id rides along in the request but is not part of the recipe's projection.
    asked = {**copy.deepcopy(REQUEST), "model": "claude-y", "traceId": "4bf92f3577b34da6"}
    with pytest.raises(ReplayCacheMiss) as caught:
        session.recorded_llm("planner", 0, cache_key(asked), request=asked)
    assert [d["path"].rsplit(".", 1)[-1] for d in caught.value.diagnosis["diff"]] == ["model"]


def test_miss_without_the_request_still_names_the_nearest_call(session: MockReplaySession) -> None:
    with pytest.raises(ReplayCacheMiss) as caught:
        session.recorded_llm("planner", 0, "0" * 64)
    d = caught.value.diagnosis
    assert d["nearest"]["cacheKey"] == RECORDED_KEY and d["diff"] == []
    assert "send the request" in d["reason"]


def test_tool_miss_diffs_the_arguments(session: MockReplaySession) -> None:
    with pytest.raises(ReplayCacheMiss) as caught:
        session.recorded_tool("research", 1, "search", {**TOOL_ARGS, "limit": 50})
    d = caught.value.diagnosis
    assert d["nearest"]["tool"] == "search"
    assert d["diff"] == [{"path": "args.limit", "recorded": 10, "requested": 50}]


def test_a_call_that_never_returned_is_told_apart_from_a_changed_one(session: MockReplaySession) -> None:
    with pytest.raises(ReplayCacheMiss) as caught:
        session.recorded_tool("research", 0, "search", TOOL_ARGS)  # attempt 0 failed before returning
    d = caught.value.diagnosis
    assert d["diff"] == [] and "never returned" in d["reason"] and "('research', 1)" in d["reason"]


def test_one_call_too_many_says_how_often_it_was_recorded(session: MockReplaySession) -> None:
    assert session.recorded_llm("planner", 0, RECORDED_KEY)["kind"] == "valid"
    with pytest.raises(ReplayCacheMiss) as caught:
        session.recorded_llm("planner", 0, RECORDED_KEY)
    assert "recorded 1 time(s)" in caught.value.diagnosis["reason"]


def test_tool_calls_can_be_named_by_tool_and_args_digest() -> None:
    cache = ResultCache.from_events(llm_run("run-1"))
    found = cache.tool_key("run-1", "research", 1, "search", args_digest(TOOL_ARGS))
    assert found == tool_cache_key("search", TOOL_ARGS)
    assert cache.tool_key("run-1", "research", 1, "search", args_digest({"q": "other"})) is None


def _tool_calls(*calls: tuple[str, dict, str], node: str = "clerk") -> list[dict]:
    """A run whose node made these tool calls, in order: (tool, args, result)."""
    docs: list[dict] = [{"runId": "run-t", "type": "run.started", "sequence": 0, "payload": {"bindings": {}}}]
    for i, (tool, args, result) in enumerate(calls):
        docs.append({"runId": "run-t", "type": "agent.toolCalled", "nodeId": node, "sequence": len(docs),
                     "payload": {"callId": f"c{i}", "tool": tool, "args": args}})
        docs.append({"runId": "run-t", "type": "agent.toolReturned", "nodeId": node, "sequence": len(docs),
                     "payload": {"callId": f"c{i}", "result": result}})
    return docs


TIED = _tool_calls(("lookup_order", {"order_id": "42"}, "kettle"), ("lookup_order", {"order_id": "43"}, "toaster"))


def _nearest_args(diagnosis: dict) -> dict:
    return diagnosis["nearest"]["args"]


def test_tied_calls_are_told_apart_by_the_position_the_replay_asks_from() -> None:
    cache = ResultCache.from_events(TIED)
    asked = {"order_id": "44"}  # one differing field against either recorded call
    second = cache.diagnose("run-t", "clerk", 0, tool_cache_key("lookup_order", asked), tool="lookup_order",
                            args=asked, position=1)
    assert _nearest_args(second) == {"order_id": "43"}
    assert second["diff"] == [{"path": "args.order_id", "recorded": "43", "requested": "44"}]
    assert "of 2 recorded calls differing in as few fields" in second["reason"]
    first = cache.diagnose("run-t", "clerk", 0, tool_cache_key("lookup_order", asked), tool="lookup_order",
                           args=asked, position=0)
    assert _nearest_args(first) == {"order_id": "42"}
    past_the_end = cache.diagnose("run-t", "clerk", 0, tool_cache_key("lookup_order", asked), tool="lookup_order",
                                  args=asked, position=5)
    assert _nearest_args(past_the_end) == {"order_id": "43"}


def test_tied_calls_at_no_position_are_told_apart_by_how_alike_the_differing_values_are() -> None:
    cache = ResultCache.from_events(_tool_calls(("search", {"query": "zebra migration"}, "a"),
                                                ("search", {"query": "agent replay logs"}, "b")))
    asked = {"query": "agent replay log"}
    d = cache.diagnose("run-t", "clerk", 0, tool_cache_key("search", asked), tool="search", args=asked)
    assert _nearest_args(d) == {"query": "agent replay logs"}  # recorded second
    # Equally far from the replay's position (0 and 2 are both 1 away from 1): likeness decides again.
    three = ResultCache.from_events(_tool_calls(("search", {"query": "agent replay logs"}, "a"),
                                                ("other", {}, "x"),
                                                ("search", {"query": "zebra migration"}, "b")))
    d = three.diagnose("run-t", "clerk", 0, tool_cache_key("search", asked), tool="search", args=asked, position=1)
    assert _nearest_args(d) == {"query": "agent replay logs"}


def test_fewer_differing_fields_beat_the_position() -> None:
    cache = ResultCache.from_events(_tool_calls(("lookup_order", {"order_id": "42", "region": "eu"}, "kettle"),
                                                ("lookup_order", {"order_id": "43", "region": "us"}, "toaster")))
    asked = {"order_id": "42", "region": "eu-west"}
    d = cache.diagnose("run-t", "clerk", 0, tool_cache_key("lookup_order", asked), tool="lookup_order", args=asked,
                       position=1)
    assert _nearest_args(d) == {"order_id": "42", "region": "eu"}
    assert "as few fields" not in d["reason"]


def test_the_session_and_the_results_endpoint_hold_a_miss_against_the_call_at_its_position() -> None:
    from agentlog.replay.served import results_answer

    session = MockReplaySession(ResultCache.from_events(TIED), "run-t")
    assert session.recorded_tool("clerk", 0, "lookup_order", {"order_id": "42"}) == "kettle"
    with pytest.raises(ReplayCacheMiss) as caught:
        session.recorded_tool("clerk", 0, "lookup_order", {"order_id": "44"})
    assert _nearest_args(caught.value.diagnosis) == {"order_id": "43"}

    cache = ResultCache.from_events(TIED)
    for position, expected in ((0, "42"), (1, "43")):
        status, body = results_answer(cache, "run-t", {"node": "clerk", "tool": "lookup_order",
                                                       "args": {"order_id": "44"}, "position": position})
        assert status == 404 and _nearest_args(body["diagnosis"]) == {"order_id": expected}
    status, body = results_answer(cache, "run-t", {"node": "clerk", "tool": "lookup_order",
                                                   "args": {"order_id": "44"}, "position": "second"})
    assert status == 400 and "position" in body["error"]["message"]
