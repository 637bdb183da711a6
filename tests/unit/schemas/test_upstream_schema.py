"""Docs we accept validate against openwop's run-event.schema.json, read unmodified at test time."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from agentlog.schemas.errors import EventRejected
from agentlog.schemas.events import RUN_EVENT_TYPE_LIST
from agentlog.schemas.upstream import upstream_file
from agentlog.schemas.validate import validate_doc
from tests.unit.schemas.strategies import contract_settings, valid_docs

UPSTREAM = upstream_file("openwop/schemas/run-event.schema.json")
SCHEMA = json.loads(UPSTREAM.read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_schema_is_the_draft_2020_12_run_event_doc():
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["title"] == "RunEventDoc"


def test_bundled_event_types_equal_upstream_enum():
    assert list(RUN_EVENT_TYPE_LIST) == SCHEMA["$defs"]["RunEventType"]["enum"]


@contract_settings
@given(valid_docs())
def test_accepted_docs_validate_upstream(doc):
    validate_doc(doc)
    errors = [e.message for e in VALIDATOR.iter_errors(doc)]
    assert errors == []


def _mutations(doc: dict) -> list[dict]:
    out = []
    for field in ("eventId", "runId", "type", "payload", "timestamp", "sequence"):
        out.append({k: v for k, v in doc.items() if k != field})
    out += [
        dict(doc, unknown=1),
        dict(doc, eventId=""),
        dict(doc, runId="r" * 129),
        dict(doc, nodeId=""),
        dict(doc, causationId=5),
        dict(doc, sequence=-1),
        dict(doc, sequence=True),
        dict(doc, sequence="1"),
        dict(doc, schemaVersion=-3),
        dict(doc, engineVersion=1),
        dict(doc, type="not.a.type"),
        dict(doc, timestamp=17),
    ]
    return out


@contract_settings
@given(valid_docs())
def test_upstream_rejections_are_our_rejections(doc):
    for bad in _mutations(doc):
        assert list(VALIDATOR.iter_errors(bad)), bad
        with pytest.raises(EventRejected) as info:
            validate_doc(bad)
        assert info.value.code in {"invalid_envelope", "unknown_event_type"}


@contract_settings
@given(st.sampled_from(RUN_EVENT_TYPE_LIST))
def test_every_upstream_type_is_accepted_by_type(event_type):
    doc = {"eventId": "e", "runId": "r", "type": event_type, "payload": {}, "timestamp": "2025-01-01T00:00:00Z", "sequence": 0}
    try:
        validate_doc(doc)
    except EventRejected as e:
        assert e.code == "invalid_payload"  # {} is not every interpreted type's payload, but the type is known
