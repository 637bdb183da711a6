"""validate_doc: the envelope, JSON safety, size and payload checks, each with its reason code."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentlog.schemas.canonical import MAX_SAFE_INTEGER, jcs
from agentlog.schemas.errors import EventRejected
from agentlog.schemas.events import RUN_EVENT_TYPES
from agentlog.schemas.validate import REJECTION_CODES, is_rfc3339, validate_doc
from tests.unit.schemas.strategies import contract_settings, valid_docs

BASE = {
    "eventId": "e-1",
    "runId": "run-1",
    "type": "variable.changed",
    "payload": {"name": "x", "value": 1},
    "timestamp": "2025-12-01T06:30:00.000Z",
    "sequence": 0,
}


def _with(**changes):
    doc = copy.deepcopy(BASE)
    for k, v in changes.items():
        if v is _DROP:
            del doc[k]
        else:
            doc[k] = v
    return doc


_DROP = object()


def _code(doc, **kw):
    with pytest.raises(EventRejected) as info:
        validate_doc(doc, **kw)
    assert info.value.code in REJECTION_CODES
    return info.value.code


@contract_settings
@given(valid_docs())
def test_valid_docs_pass_unchanged(doc):
    before = copy.deepcopy(doc)
    assert validate_doc(doc) is doc
    assert doc == before


def test_event_types_come_from_upstream_enum():
    assert len(RUN_EVENT_TYPES) == 84
    assert {"run.started", "core.workflowChain.event", "replay.divergedAtRefusal"} <= RUN_EVENT_TYPES


@pytest.mark.parametrize(
    "doc",
    [
        _with(eventId=_DROP),
        _with(runId=_DROP),
        _with(type=_DROP),
        _with(payload=_DROP),
        _with(timestamp=_DROP),
        _with(sequence=_DROP),
        _with(prevHash="0" * 64),
        _with(tenant="t1"),
        _with(eventId=""),
        _with(eventId="x" * 129),
        _with(runId=7),
        _with(nodeId=""),
        _with(nodeId=None),
        _with(causationId="c" * 129),
        _with(sequence=-1),
        _with(sequence=True),
        _with(sequence=1.0),
        _with(sequence="3"),
        _with(schemaVersion=-1),
        _with(schemaVersion=False),
        _with(engineVersion=3),
        _with(type=5),
        _with(timestamp="yesterday"),
        _with(timestamp="2025-02-30T00:00:00Z"),
        _with(timestamp="2025-12-01 06:30:00Z"),
        _with(timestamp="2025-12-01T25:00:00Z"),
        _with(timestamp="2025-12-01T06:30:00"),
        _with(timestamp=1700000000),
    ],
    ids=lambda d: ",".join(f"{k}={str(v)[:12]}" for k, v in d.items() if BASE.get(k, _DROP) != v) or "dropped",
)
def test_invalid_envelope(doc):
    assert _code(doc) == "invalid_envelope"


def test_not_an_object():
    assert _code([BASE]) == "invalid_envelope"


def test_missing_field_is_named():
    with pytest.raises(EventRejected, match="sequence"):
        validate_doc(_with(sequence=_DROP))


@pytest.mark.parametrize("ts", ["2025-12-01T06:30:00Z", "2025-12-01t06:30:60.5+05:30", "2024-02-29T23:59:59-00:00"])
def test_rfc3339_accepts(ts):
    assert is_rfc3339(ts)


def test_unknown_event_type():
    assert _code(_with(type="core.dispatch.failed")) == "unknown_event_type"


@pytest.mark.parametrize(
    ("doc", "code"),
    [
        (_with(sequence=MAX_SAFE_INTEGER + 1), "unsafe_integer"),
        (_with(payload={"name": "x", "value": -(2**63)}), "unsafe_integer"),
        (_with(type="log.appended", payload=[1, {"n": 2**60}]), "unsafe_integer"),
        (_with(payload={"name": "x", "value": float("nan")}), "non_finite_number"),
        (_with(type="log.appended", payload=float("inf")), "non_finite_number"),
    ],
)
def test_json_safety(doc, code):
    assert _code(doc) == code


@contract_settings
@given(valid_docs(), st.integers(min_value=1, max_value=3000))
def test_oversize_iff_canonical_bytes_exceed_limit(doc, limit):
    size = len(jcs(doc))
    if size > limit:
        assert _code(doc, max_bytes=limit) == "oversize"
    else:
        validate_doc(doc, max_bytes=limit)


def test_oversize_uses_exact_jcs_length_not_python_spelling():
    # 1e20 is 5 characters in Python's JSON and 21 in JCS: the check must use JCS.
    doc = _with(type="log.appended", payload=[1e20] * 100)
    size = len(jcs(doc))
    assert _code(doc, max_bytes=size - 1) == "oversize"
    validate_doc(doc, max_bytes=size)


def test_default_limit_is_one_mebibyte():
    big = _with(type="log.appended", payload="x" * 1_048_576)
    assert _code(big) == "oversize"


@contract_settings
@given(valid_docs(), st.sampled_from(["eventId", "runId", "type", "payload", "timestamp", "sequence"]))
def test_dropping_any_required_field_is_invalid_envelope(doc, field):
    del doc[field]
    assert _code(doc) == "invalid_envelope"


@contract_settings
@given(valid_docs(), st.text(min_size=1).filter(lambda k: k not in BASE and k not in
       {"nodeId", "schemaVersion", "engineVersion", "causationId"}))
def test_any_unknown_envelope_field_is_invalid_envelope(doc, field):
    doc[field] = "x"
    assert _code(doc) == "invalid_envelope"


def test_payload_error_is_one_line_and_names_the_field():
    with pytest.raises(EventRejected) as info:
        validate_doc(_with(payload={"name": "", "value": 1}))
    assert info.value.code == "invalid_payload"
    assert "\n" not in info.value.detail
    assert "payload.name" in info.value.detail
    assert "variable.changed" in info.value.detail


def test_reason_precedence_envelope_before_payload():
    doc = _with(extra=1, payload={"value": float("nan")})
    assert _code(doc) == "invalid_envelope"


@contract_settings
@given(valid_docs())
def test_typed_envelope_model_round_trips(doc):
    from agentlog.schemas.events import RunEventDoc

    assert RunEventDoc.model_validate(doc).to_doc() == doc


@pytest.mark.parametrize(
    "ts",
    ["2025-02-30T00:00:00Z", "2023-02-29T00:00:00Z", "2025-13-01T00:00:00Z", "2025-12-01T06:61:00Z",
     "2025-12-01T06:30:61Z", "2025-12-01T06:30:00+24:00", "2025-12-01T06:30:00+05:60", "2025-12-01",
     "2025-12-01T06:30Z", "20251201T063000Z", "2025-12-01T06:30:00.Z", "２０２５-12-01T06:30:00Z"],
)
def test_rfc3339_rejects(ts):
    assert not is_rfc3339(ts)
