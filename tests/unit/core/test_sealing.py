"""Sealed content: deterministic, bound to its place, erasable; metadata stays readable."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.core.sealing import ERASED, DataKey, SealError, is_sealed, open_event, seal_event, sealed_paths
from agentlog.schemas.content import content_members
from agentlog.schemas.validate import validate_doc
from tests.bench.workload import tree
from tests.unit.core.runs import realistic_run

MARKER = "MARKER-7f3a-alice@example.org"
KEY = DataKey("k1", bytes(range(32)))


def _doc(type_: str, payload, event_id: str = "e-1", run_id: str = "run-1") -> dict:
    return {"eventId": event_id, "runId": run_id, "type": type_, "payload": payload,
            "timestamp": "2026-11-28T10:00:00Z", "sequence": 3, "nodeId": "planner"}


REQUEST = _doc("agent.invocation.started", {
    "request": {"provider": "openai", "model": "gpt-5", "temperature": 0,
                "messages": [{"role": "system", "content": "You are a planner."},
                             {"role": "user", "content": f"Refund order 42 for {MARKER}"}]},
    "cacheKey": "sha256:abc", "recipe": "openwop-semantic-request-v2"})


def test_content_is_sealed_and_metadata_stays_clear():
    stored = seal_event(REQUEST, KEY)
    assert MARKER not in json.dumps(stored)
    assert "You are a planner." not in json.dumps(stored)
    assert stored["payload"]["cacheKey"] == "sha256:abc"
    assert stored["payload"]["request"]["model"] == "gpt-5"
    assert stored["payload"]["request"]["temperature"] == 0
    assert sealed_paths(stored) == ["payload.request.messages"]
    assert {k: stored[k] for k in stored if k != "payload"} == {k: REQUEST[k] for k in REQUEST if k != "payload"}


def test_sealing_is_deterministic_and_opens_back():
    assert seal_event(REQUEST, KEY) == seal_event(REQUEST, KEY)
    assert open_event(seal_event(REQUEST, KEY), {"k1": KEY}.get) == REQUEST


def test_sealing_a_stored_record_again_changes_nothing():
    stored = seal_event(REQUEST, KEY)
    assert seal_event(stored, KEY) == stored


def test_the_same_value_at_another_place_gives_another_token():
    a = seal_event(_doc("variable.changed", {"name": "x", "value": MARKER}, event_id="e-1"), KEY)
    b = seal_event(_doc("variable.changed", {"name": "x", "value": MARKER}, event_id="e-2"), KEY)
    assert a["payload"]["value"] != b["payload"]["value"]


def test_a_token_moved_to_another_event_does_not_open():
    a = seal_event(_doc("variable.changed", {"name": "x", "value": MARKER}, event_id="e-1"), KEY)
    moved = {**a, "eventId": "e-2"}
    with pytest.raises(SealError, match="payload.value of event e-2"):
        open_event(moved, {"k1": KEY}.get)


def test_an_altered_token_does_not_open():
    stored = seal_event(_doc("agent.toolReturned", {"callId": "c1", "result": {"hits": 3}}), KEY)
    token = stored["payload"]["result"]["$sealed"]
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    with pytest.raises(SealError):
        open_event({**stored, "payload": {**stored["payload"], "result": {"$sealed": flipped}}}, {"k1": KEY}.get)


def test_a_wrong_key_does_not_open():
    stored = seal_event(REQUEST, KEY)
    with pytest.raises(SealError):
        open_event(stored, {"k1": DataKey("k1", os.urandom(32))}.get)


def test_without_its_key_content_reads_erased_and_metadata_survives():
    stored = seal_event(REQUEST, KEY)
    erased = open_event(stored, {}.get)
    assert erased["payload"]["request"]["messages"] == ERASED
    assert erased["payload"]["request"]["model"] == "gpt-5"
    assert erased["payload"]["cacheKey"] == "sha256:abc"


def test_an_erased_export_is_still_one_valid_run_event_doc_per_event():
    """``[erased]`` stands where a list or an object was (LLM messages, an envelope): the contract still holds."""
    docs = [doc for i in range(5) for run in tree(f"erased-{i}") for doc in run] + realistic_run("erased-r")
    erased = [open_event(seal_event(doc, KEY), {}.get) for doc in docs]
    assert any(e["payload"] != d["payload"] for e, d in zip(erased, docs, strict=True))
    for doc in erased:
        assert validate_doc(doc) is doc


@pytest.mark.parametrize(("type_", "payload", "clear", "sealed"), [
    ("agent.toolCalled", {"callId": "c1", "tool": "search", "args": {"q": MARKER}}, ["callId", "tool"], ["args"]),
    ("agent.toolReturned", {"callId": "c1", "result": MARKER}, ["callId"], ["result"]),
    ("agent.invocation.completed", {"cacheKey": "k", "envelope": [{"text": MARKER}], "usage": {"inputTokens": 3}},
     ["cacheKey", "usage"], ["envelope"]),
    ("variable.changed", {"name": "answer", "value": MARKER}, ["name"], ["value"]),
    ("channel.written", {"channel": "out", "value": [MARKER]}, ["channel"], ["value"]),
    ("run.failed", {"error": {"code": "tool_failed", "message": MARKER}}, [], ["error.message"]),
    ("provider.usage", {"provider": "openai", "model": "m", "inputTokens": 1, "outputTokens": 2, "costCents": 0.1},
     ["provider", "model", "inputTokens", "outputTokens", "costCents"], []),
    # A type the catalogue does not name, and a field a host added: content unless named metadata.
    ("approval.received", {"status": "granted", "comment": MARKER}, ["status"], ["comment"]),
    ("agent.toolCalled", {"callId": "c1", "tool": "t", "args": {}, "note": MARKER}, ["callId", "tool"],
     ["args", "note"]),
])
def test_the_catalogue(type_, payload, clear, sealed):
    stored = seal_event(_doc(type_, payload), KEY)
    assert MARKER not in json.dumps(stored)
    assert sorted(sealed_paths(stored)) == sorted(f"payload.{p}" for p in sealed)
    for name in clear:
        assert stored["payload"][name] == payload[name]


def test_a_payload_that_is_not_an_object_is_content_as_a_whole():
    assert list(content_members([MARKER], {})) == [((), [MARKER])]
    stored = seal_event(_doc("log.appended", [MARKER]), KEY)
    assert is_sealed(stored["payload"]) and open_event(stored, {"k1": KEY}.get)["payload"] == [MARKER]


def test_a_null_payload_has_nothing_to_seal():
    doc = _doc("run.completed", None)
    assert seal_event(doc, KEY) is doc


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@given(json_values, json_values)
def test_any_json_value_round_trips(args, result):
    for doc in (_doc("agent.toolCalled", {"callId": "c", "tool": "t", "args": args}),
                _doc("agent.toolReturned", {"callId": "c", "result": result})):
        assert open_event(seal_event(doc, KEY), {"k1": KEY}.get) == doc


def test_a_records_members_seal_at_their_paths_and_open_back():
    from agentlog.core.sealing import open_record, seal_record

    record = {"replayRunId": "r2", "firstDivergence": {"kind": "output", "expected": MARKER, "actual": [1, 2]},
              "events": [{"type": "replay.divergedAtRefusal", "payload": {"refusalReason": MARKER, "atSequence": 3}}]}
    paths = [("firstDivergence", "expected"), ("firstDivergence", "actual"), ("firstDivergence", "detail"),
             ("events", 0, "payload", "refusalReason"), ("events", 5, "payload")]
    sealed = seal_record(record, paths, KEY, "r2", "verdict")
    assert MARKER not in json.dumps(sealed) and sealed["firstDivergence"]["kind"] == "output"
    assert "detail" not in sealed["firstDivergence"] and sealed["events"][0]["payload"]["atSequence"] == 3
    assert open_record(sealed, {"k1": KEY}.get, "r2", "verdict") == record
    assert open_record(sealed, {}.get, "r2", "verdict")["firstDivergence"]["expected"] == ERASED
    with pytest.raises(SealError):
        open_record(sealed, {"k1": KEY}.get, "r3", "verdict")  # bound to its run
    assert seal_record(record, paths, None, "r2", "verdict")["firstDivergence"]["expected"] == ERASED
