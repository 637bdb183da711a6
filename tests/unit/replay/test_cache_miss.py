"""Why did my request miss? ResultCache.diagnose and the MockReplaySession error that carries it.

The expected diffs are written from the recorded run (``runs.llm_run``: the planner's LLM call at
attempt 0; the research tool call made at attempt 0 with no result, retried and returned at
attempt 1) and from the change each test makes to the request.
"""

from __future__ import annotations

import copy

import pytest

from processors.core.result_cache import ReplayCacheMiss, ResultCache, args_digest, tool_cache_key
from processors.replay.mock import MockReplaySession
from schemas.cachekey import cache_key
from schemas.canonical import jcs, sha256_hex
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
