"""The HTTP results answer without a web server: what a lookup returns for each kind of request.

(The same answers over a real worker and curl: tests/integration/replay/test_results_http.py.)
"""

from __future__ import annotations

import copy

import pytest

from agentlog.core.result_cache import ResultCache, args_digest
from agentlog.replay.served import results_answer
from agentlog.schemas.cachekey import cache_key
from agentlog.schemas.canonical import jcs, sha256_hex
from tests.unit.replay.runs import ENVELOPE, REQUEST, TOOL_ARGS, TOOL_RESULT, llm_run

RECORDED_KEY = sha256_hex(jcs(REQUEST))  # the key llm_run records


@pytest.fixture(scope="module")
def cache() -> ResultCache:
    return ResultCache.from_events(llm_run("run-1"))


def test_hit_by_cache_key(cache: ResultCache) -> None:
    status, body = results_answer(cache, "run-1", {"node": "planner", "attempt": "0", "cacheKey": RECORDED_KEY})
    assert status == 200 and body["result"]["envelope"] == ENVELOPE


def test_tool_by_digest_and_by_args(cache: ResultCache) -> None:
    for params in ({"tool": "search", "argsDigest": args_digest(TOOL_ARGS)}, {"tool": "search", "args": TOOL_ARGS}):
        status, body = results_answer(cache, "run-1", {"node": "research", "attempt": 1, **params})
        assert status == 200 and body["result"]["result"] == TOOL_RESULT, params


def test_a_second_occurrence_the_original_never_made_is_a_miss(cache: ResultCache) -> None:
    status, body = results_answer(cache, "run-1", {"node": "planner", "cacheKey": RECORDED_KEY, "occurrence": 1})
    assert status == 404 and "recorded 1 time(s)" in body["diagnosis"]["reason"]


def test_a_request_without_a_key_is_keyed_by_the_recipe(cache: ResultCache) -> None:
    asked = copy.deepcopy(REQUEST)
    asked["temperature"] = 0.5
    status, body = results_answer(cache, "run-1", {"node": "planner", "request": asked})
    assert status == 404 and body["diagnosis"]["cacheKey"] == cache_key(asked)
    assert [d["path"] for d in body["diagnosis"]["diff"]] == ["request.temperature"]


@pytest.mark.parametrize("params", [
    {"node": "planner"},                                  # names no call
    {"node": "planner", "cacheKey": "k", "attempt": "x"},  # attempt not an integer
    {"node": "planner", "cacheKey": "k", "attempt": -1},
    {"node": "planner", "request": {"model": "m"}},        # no provider/messages: no key
    {"node": "planner", "cacheKey": 7},
])
def test_requests_that_name_no_call_are_400(cache: ResultCache, params: dict) -> None:
    status, body = results_answer(cache, "run-1", params)
    assert status == 400 and body["error"]["code"] == "bad_request"
