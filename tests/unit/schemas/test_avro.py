"""Confluent-framed Avro: round trip, framing and the reason codes of broken values."""

from __future__ import annotations

import struct

import fastavro
import pytest
from hypothesis import given

from agentlog.schemas.avro import PARSED_SCHEMA, SCHEMA_ID, decode_avro, encode_avro
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import EventRejected
from agentlog.schemas.validate import validate_doc
from tests.unit.schemas.strategies import contract_settings, valid_docs

DOC = {"eventId": "e1", "runId": "r1", "type": "variable.changed", "payload": {"name": "x", "value": [1, 2.5, "é"]},
       "timestamp": "2025-01-01T00:00:00Z", "sequence": 3}


@contract_settings
@given(valid_docs())
def test_round_trip_identity(doc):
    back = decode_avro(encode_avro(doc))
    assert back == doc
    assert back.keys() == doc.keys()  # absent optionals stay absent
    assert jcs(back) == jcs(doc)
    validate_doc(back)


def test_framing_is_confluent():
    data = encode_avro(DOC)
    assert data[0] == 0
    assert struct.unpack(">I", data[1:5])[0] == SCHEMA_ID == 1
    # The body is plain schemaless Avro any client can read with the .avsc.
    import io

    record = fastavro.schemaless_reader(io.BytesIO(data[5:]), PARSED_SCHEMA, None)
    assert record["payload"] == jcs(DOC["payload"]).decode("utf-8")
    assert record["nodeId"] is None and record["sequence"] == 3


def test_optional_fields_survive():
    doc = dict(DOC, nodeId="n", schemaVersion=0, engineVersion="", causationId="c")
    assert decode_avro(encode_avro(doc)) == doc


@pytest.mark.parametrize(
    ("mangle", "code"),
    [
        (lambda b: b"", "decode_error"),
        (lambda b: b"{" + b[1:], "bad_magic"),
        (lambda b: b"\x01" + b[1:], "bad_magic"),
        (lambda b: b[:3], "decode_error"),
        (lambda b: b[:5], "decode_error"),
        (lambda b: b[:-4], "decode_error"),
        (lambda b: b + b"\x00", "decode_error"),
        (lambda b: b[:1] + struct.pack(">I", 2) + b[5:], "unknown_schema_id"),
        (lambda b: b[:1] + struct.pack(">I", 0) + b[5:], "unknown_schema_id"),
    ],
)
def test_broken_values(mangle, code):
    with pytest.raises(EventRejected) as info:
        decode_avro(mangle(encode_avro(DOC)))
    assert info.value.code == code


def test_payload_text_must_be_strict_json():
    import io

    out = io.BytesIO()
    out.write(b"\x00" + struct.pack(">I", SCHEMA_ID))
    record = {**{k: None for k in ("nodeId", "schemaVersion", "engineVersion", "causationId")},
              **DOC, "payload": '{"a": NaN}'}
    fastavro.schemaless_writer(out, PARSED_SCHEMA, record)
    with pytest.raises(EventRejected) as info:
        decode_avro(out.getvalue())
    assert info.value.code == "non_finite_number"


def test_encode_refuses_docs_that_do_not_fit():
    with pytest.raises(EventRejected) as info:
        encode_avro({k: v for k, v in DOC.items() if k != "sequence"})
    assert info.value.code == "invalid_envelope"
    with pytest.raises(EventRejected) as info:
        encode_avro(dict(DOC, sequence="3"))
    assert info.value.code == "invalid_envelope"
