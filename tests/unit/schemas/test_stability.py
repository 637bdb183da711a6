"""The field-stability table and its path helpers."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given

from agentlog.schemas.canonical import jcs
from agentlog.schemas.stability import (
    MISSING,
    VOLATILE_ENVELOPE_FIELDS,
    WILDCARD,
    format_path,
    get_path,
    is_volatile,
    iter_paths,
    parse_path,
    path_matches,
    strip_volatile,
    volatile_paths,
)
from agentlog.schemas.upstream import upstream_file
from tests.unit.schemas.strategies import contract_settings, json_values, valid_docs

AOS = upstream_file("aos/backend/app/schemas/examples/structured_outcome_replayable.json")


def _failed(**payload_changes):
    payload = {"error": {"code": "ERR_HTTP_503", "message": "Service Unavailable", "details": {"x": 1}},
               "latencyMs": 15234, "traceId": "abc", "retries": 3, "costCents": 0,
               "side_effects": [{"type": "http_request", "target": "api.example.com", "timestamp": "t1"}]}
    payload.update(payload_changes)
    return {"eventId": "e1", "runId": "r1", "type": "run.failed", "payload": payload,
            "timestamp": "2025-12-01T06:30:00Z", "sequence": 7, "causationId": "e0"}


def test_envelope_volatiles():
    assert set(VOLATILE_ENVELOPE_FIELDS) == {"timestamp", "eventId", "causationId", "runId"}
    assert "sequence" not in volatile_paths("run.failed") and "type" not in volatile_paths("run.failed")


def test_aos_fixture_paths_parse_and_read():
    fixture = json.loads(AOS.read_text(encoding="utf-8"))
    assertion = fixture["_replay_assertion"]
    for path in assertion["ignored_fields"]:
        assert format_path(parse_path(path)) == path
    for path, expected in assertion["deterministic_fields"].items():
        if path.endswith(".length"):
            assert len(get_path(fixture, path.removesuffix(".length"))) == expected
        elif "[*]" in path:
            assert set(get_path(fixture, path)) == {expected}
        else:
            assert get_path(fixture, path) == expected


def test_aos_ignored_fields_are_volatile_in_payloads():
    fixture = json.loads(AOS.read_text(encoding="utf-8"))
    for path in fixture["_replay_assertion"]["ignored_fields"]:
        assert is_volatile("run.failed", f"payload.{path}") or path == "timestamp", path
    for path in fixture["_replay_assertion"]["deterministic_fields"]:
        base = path.removesuffix(".length")
        assert not is_volatile("run.failed", f"payload.{base}"), path


def test_change_only_in_volatile_fields_is_a_match():
    a = _failed()
    b = _failed(latencyMs=3, traceId="zzz", error={"code": "ERR_HTTP_503", "message": "other words", "details": {}},
                side_effects=[{"type": "http_request", "target": "api.example.com", "timestamp": "t2"}])
    b.update(eventId="e9", runId="replay-1", timestamp="2026-01-01T00:00:00Z", causationId="e8")
    assert jcs(strip_volatile(a)) == jcs(strip_volatile(b))


@pytest.mark.parametrize(
    "change",
    [
        {"error": {"code": "ERR_HTTP_504", "message": "Service Unavailable", "details": {"x": 1}}},
        {"retries": 2},
        {"costCents": 1},
        {"side_effects": [{"type": "webhook_sent", "target": "api.example.com", "timestamp": "t1"}]},
        {"side_effects": [{"type": "http_request", "target": "other", "timestamp": "t1"}]},
        {"side_effects": []},
    ],
)
def test_change_in_compared_fields_is_a_divergence(change):
    assert jcs(strip_volatile(_failed())) != jcs(strip_volatile(_failed(**change)))


def test_observable_values_are_never_searched_for_volatile_keys():
    doc = {"eventId": "e", "runId": "r", "type": "variable.changed", "timestamp": "t", "sequence": 1,
           "payload": {"name": "v", "value": {"timestamp": 1, "traceId": "x", "message": "hi"}}}
    assert strip_volatile(doc)["payload"]["value"] == doc["payload"]["value"]
    assert not is_volatile("variable.changed", "payload.value.timestamp")


@contract_settings
@given(valid_docs())
def test_strip_volatile_never_mutates_and_is_idempotent(doc):
    before = copy.deepcopy(doc)
    stripped = strip_volatile(doc)
    assert doc == before
    assert strip_volatile(stripped) == stripped
    for field in VOLATILE_ENVELOPE_FIELDS:
        assert field not in stripped
    assert stripped["sequence"] == doc["sequence"] and stripped["type"] == doc["type"]


@contract_settings
@given(json_values)
def test_iter_paths_leaves_read_back(value):
    for path, leaf in iter_paths(value, "payload"):
        assert get_path({"payload": value}, path) == leaf


def test_path_syntax():
    assert parse_path('payload.items[*].id') == ("payload", "items", WILDCARD, "id")
    assert parse_path('payload["a.b"][2]') == ("payload", "a.b", 2)
    assert format_path(("payload", "a.b", 2)) == 'payload["a.b"][2]'
    assert path_matches("payload.side_effects[*].timestamp", "payload.side_effects[4].timestamp")
    assert path_matches("payload.error.details", "payload.error.details.deep[0]")
    assert not path_matches("payload.error.details", "payload.error")
    assert not path_matches("payload.side_effects[*].timestamp", "payload.side_effects.x.timestamp")
    assert get_path({"a": 1}, "b") is MISSING
    assert get_path({"a": [{"b": 1}, {}, {"b": 2}]}, "a[*].b") == [1, 2]
    with pytest.raises(ValueError):
        parse_path("a..b")
