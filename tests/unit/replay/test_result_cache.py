"""ResultCache: the recorded observable results a mock-mode replay gets back (RFC 0041 §C)."""

from __future__ import annotations

import copy
import json

from agentlog.core.result_cache import ResultCache, tool_cache_key
from agentlog.schemas.canonical import jcs, sha256_hex
from tests.unit.replay.runs import ENVELOPE, REQUEST, TOOL_ARGS, TOOL_RESULT, index_of, llm_run

LLM_KEY = sha256_hex(jcs(REQUEST))
TOOL_KEY = sha256_hex(jcs({"tool": "search", "args": TOOL_ARGS}))


def test_llm_envelope_is_recorded_under_run_node_attempt_key() -> None:
    cache = ResultCache.from_events(llm_run("run-1"))
    hit = cache.lookup("run-1", "planner", 0, LLM_KEY)
    assert hit == {"kind": "valid", "envelope": ENVELOPE, "usage": {"inputTokens": 40, "outputTokens": 12}}
    assert cache.lookup("run-1", "planner", 1, LLM_KEY) is None
    assert cache.lookup("run-2", "planner", 0, LLM_KEY) is None
    assert cache.lookup("run-1", "research", 0, LLM_KEY) is None


def test_tool_result_is_keyed_by_the_attempt_that_returned() -> None:
    # The first call (attempt 0) failed and was retried; only attempt 1 returned a result.
    cache = ResultCache.from_events(llm_run("run-1"))
    assert tool_cache_key("search", TOOL_ARGS) == TOOL_KEY
    assert cache.lookup("run-1", "research", 1, TOOL_KEY) == {"kind": "tool", "tool": "search", "result": TOOL_RESULT}
    assert cache.lookup("run-1", "research", 0, TOOL_KEY) is None
    assert len(cache) == 2


def test_refusal_is_recorded_as_a_refusal_marker() -> None:
    run = llm_run("run-1")
    seq = index_of(run, "agent.invocation.completed")
    run[seq]["type"] = "envelope.refusal"
    run[seq]["payload"] = {"cacheKey": LLM_KEY, "reason": "safety"}
    cache = ResultCache.from_events(run)
    assert cache.lookup("run-1", "planner", 0, LLM_KEY) == {"kind": "refusal", "reason": "safety"}


def test_completion_without_its_own_key_takes_the_started_key() -> None:
    run = llm_run("run-1")
    del run[index_of(run, "agent.invocation.completed")]["payload"]["cacheKey"]
    assert ResultCache.from_events(run).lookup("run-1", "planner", 0, LLM_KEY)["kind"] == "valid"


def test_same_call_twice_keeps_both_results_in_order() -> None:
    run = llm_run("run-1")
    ret = index_of(run, "agent.toolReturned")
    second_call = copy.deepcopy(run[ret - 1])
    second_call["payload"]["callId"] = "run-1:call-3"
    second_return = copy.deepcopy(run[ret])
    second_return["payload"].update(callId="run-1:call-3", result={"hits": 0})
    run = run[: ret + 1] + [second_call, second_return] + run[ret + 1 :]
    for i, doc in enumerate(run):
        doc["sequence"] = i
    cache = ResultCache.from_events(run)
    assert cache.lookup("run-1", "research", 1, TOOL_KEY)["result"] == TOOL_RESULT
    assert cache.lookup("run-1", "research", 1, TOOL_KEY, occurrence=1)["result"] == {"hits": 0}
    assert cache.lookup("run-1", "research", 1, TOOL_KEY, occurrence=2) is None


def test_several_runs_and_event_order_do_not_matter() -> None:
    events = llm_run("run-1") + llm_run("run-2")
    cache = ResultCache.from_events(reversed(events))
    assert cache.lookup("run-2", "planner", 0, LLM_KEY)["envelope"] == ENVELOPE
    assert cache.lookup("run-1", "research", 1, TOOL_KEY)["result"] == TOOL_RESULT


def test_json_round_trip_is_stable() -> None:
    cache = ResultCache.from_events(llm_run("run-1"))
    data = json.loads(json.dumps(cache.to_json()))
    again = ResultCache.from_json(data)
    assert again.to_json() == cache.to_json()
    assert jcs(again.to_json()) == jcs(ResultCache.from_events(list(reversed(llm_run("run-1")))).to_json())
    assert again.lookup("run-1", "planner", 0, LLM_KEY)["envelope"] == ENVELOPE


def test_lookups_return_copies() -> None:
    cache = ResultCache.from_events(llm_run("run-1"))
    cache.lookup("run-1", "planner", 0, LLM_KEY)["envelope"]["answer"] = "tampered"
    assert cache.lookup("run-1", "planner", 0, LLM_KEY)["envelope"] == ENVELOPE


def test_bad_serialisation_is_a_replay_error() -> None:
    import pytest

    from agentlog.schemas.errors import ReplayError

    with pytest.raises(ReplayError):
        ResultCache.from_json({"version": 99, "entries": []})
    with pytest.raises(ReplayError):
        ResultCache.from_json({"version": 1, "entries": [{"runId": "r"}]})
